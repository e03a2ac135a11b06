#!/usr/bin/env bash
# wheel-smoke.sh — a user who installs the package, not the source tree: build a wheel, install it
# into a fresh virtualenv (no -e), and from a directory outside the checkout run what the README
# promises through the installed entry points. Exits non-zero, saying which step, on any failure.
#
#   bash scripts/ci/wheel-smoke.sh [WORK_DIR]
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="${1:-$(mktemp -d)}"
mkdir -p "$WORK"
step() { printf '\n== wheel smoke: %s\n' "$*"; }
fail() { printf 'wheel smoke FAILED: %s\n' "$*" >&2; exit 1; }

step "build the wheel"
python3 -m pip wheel -q --no-deps -w "$WORK/dist" "$REPO"
WHEEL="$(ls "$WORK"/dist/launch_agent-*.whl)"

step "install it into a fresh venv"
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q "$WHEEL"
export PATH="$WORK/venv/bin:$PATH"

# Outside the checkout: nothing may be imported from the source tree.
RUN="$WORK/run"
mkdir -p "$RUN"
cd "$RUN"
export AGENT_STATE_DIR="$RUN/state"
located="$(python -c 'import agent, bootstrap; print(agent.__file__, bootstrap.__file__)')"
case "$located" in
    *"$REPO"*) fail "agent is imported from the checkout: $located" ;;
    *site-packages*site-packages*) ;;
    *) fail "agent is not imported from site-packages: $located" ;;
esac

EXAMPLE=("$REPO/scripts/examples/check_args.py" "$REPO/configs/data.yml" "$REPO/configs/model.yml")

step "README example through the launch-agent entry point"
launch-agent --nproc-per-node 2 --log-dir "$RUN/logs/entry" "${EXAMPLE[@]}" >entry.out 2>&1 \
    || { cat entry.out; fail "launch-agent exited $?"; }
grep -q "check_args: OK" entry.out && grep -q "job succeeded" entry.out \
    || { cat entry.out; fail "launch-agent: no rank said OK"; }
if grep -qi "warning" entry.out; then cat entry.out; fail "the example printed a warning"; fi

step "README example through python -m agent"
python -m agent --nproc-per-node 2 --log-dir "$RUN/logs/module" "${EXAMPLE[@]}" >module.out 2>&1 \
    || { cat module.out; fail "python -m agent exited $?"; }
[ "$(grep -c 'check_args: OK' module.out)" = 2 ] || { cat module.out; fail "not 2 ranks OK"; }

step "agent logs"
python -m agent logs "$RUN/logs/module" --summary >logs.out 2>&1 || { cat logs.out; fail "agent logs"; }
grep -q "job succeeded (exit 0)" logs.out || { cat logs.out; fail "agent logs --summary says no success"; }

step "resident serve + run on one node (ranks forked from a zygote in site-packages)"
python -m agent serve >serve.out 2>&1 &
SERVE_PID=$!
trap 'kill $SERVE_PID 2>/dev/null || true' EXIT
CONN="$AGENT_STATE_DIR/serve-local.json"
for _ in $(seq 600); do [ -s "$CONN" ] && break; kill -0 $SERVE_PID 2>/dev/null || break; sleep 0.1; done
[ -s "$CONN" ] || { cat serve.out; fail "serve wrote no connection file"; }
python -m agent run --serve "$CONN" "${EXAMPLE[@]}" >run.out 2>&1 || { cat run.out serve.out; fail "agent run"; }
grep -q "check_args: OK" run.out && grep -q "forked warm" run.out \
    || { cat run.out; fail "agent run: no warm rank said OK"; }
python -m agent down --serve "$CONN" >down.out 2>&1 || { cat down.out; fail "agent down"; }
wait $SERVE_PID || fail "serve exited $? after down"
trap - EXIT

step "python -m bootstrap --print"
python -m bootstrap -N 2 --gpus-per-node 8 --print "${EXAMPLE[@]}" >sbatch.out 2>&1 \
    || { cat sbatch.out; fail "bootstrap"; }
grep -q "^#SBATCH" sbatch.out && grep -q "python -m agent" sbatch.out \
    || { cat sbatch.out; fail "bootstrap printed no sbatch script"; }

printf '\nwheel smoke: all steps passed (%s)\n' "$(basename "$WHEEL")"
