#!/usr/bin/env bash
# start-cluster.sh [NODES] — a real local Slurm cluster on this one host, for tests and CI:
# munged + slurmctld + NODES slurmd daemons (Debian's slurm-wlm supports several slurmd per
# host: one NodeName each, own port, all NodeAddr=127.0.0.1). Must run as root.
#
#   bash scripts/slurm/start-cluster.sh 2 && srun -N2 --ntasks-per-node=1 hostname
#
# Idempotent: same configuration and everything running -> does nothing. Anything different or
# down -> stops the daemons we started (stop-cluster.sh) and starts fresh. On any failure it
# prints the daemon logs and exits non-zero.
#
# Knobs (environment, all optional):
#   SLURM_LOCAL_NODES        nodes n1..nN; the first argument wins                [2]
#   SLURM_LOCAL_CPUS         CPUs declared per node; more than the hardware is fine and
#                            keeps `--ntasks-per-node` up to this from pending forever  [max(nproc,8)]
#   SLURM_LOCAL_MEM_MB       RealMemory per node                                  [2048]
#   SLURM_LOCAL_GPUS         fake GPUs per node (gres/gpu on /dev/null clones: jobs asking
#                            --gpus* get SLURM_GPUS_ON_NODE, CUDA_VISIBLE_DEVICES)  [0]
#   SLURM_LOCAL_DIR          state dir: pids, logs, spool                         [/var/lib/slurm-local]
#   SLURM_LOCAL_CONF_DIR     where slurm.conf goes (the clients' default path)   [/etc/slurm]
#   SLURM_LOCAL_CTLD_PORT    slurmctld port                                       [6817]
#   SLURM_LOCAL_SLURMD_PORT  first slurmd port; node i uses PORT+i-1              [17001]
#   SLURM_LOCAL_NODE_PREFIX  node name prefix                                     [n]
#   SLURM_LOCAL_MUNGE_SOCKET munge socket; a non-default one gets its own munged under
#                            $SLURM_LOCAL_DIR/munge (slurm.conf AuthInfo points at it)
#                                                                  [/run/munge/munge.socket.2]
#   SLURM_LOCAL_HOSTS=0      do not add "127.0.0.1 n1 n2 ... # slurm-local <dir>" to /etc/hosts
#   SLURM_LOCAL_NO_INSTALL=1 never call apt-get
#   SLURM_LOCAL_TIMEOUT      seconds to wait for idle nodes and for the probe    [60]
#   SLURM_LOCAL_PROBE=0      skip the `srun -N<NODES> true` readiness probe
#
# Several clusters can share the host: give each its own SLURM_LOCAL_DIR, _CONF_DIR (then
# export SLURM_CONF=<conf dir>/slurm.conf for the clients), _CTLD_PORT, _SLURMD_PORT,
# _NODE_PREFIX and _MUNGE_SOCKET. Start and stop of one state dir are serialized by a lock.
set -eEuo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NODES="${1:-${SLURM_LOCAL_NODES:-2}}"
NPROC="$(nproc)"
CPUS="${SLURM_LOCAL_CPUS:-$(( NPROC > 8 ? NPROC : 8 ))}"
MEM_MB="${SLURM_LOCAL_MEM_MB:-2048}"
GPUS="${SLURM_LOCAL_GPUS:-0}"
BASE="${SLURM_LOCAL_DIR:-/var/lib/slurm-local}"
CONF_DIR="${SLURM_LOCAL_CONF_DIR:-/etc/slurm}"
CTLD_PORT="${SLURM_LOCAL_CTLD_PORT:-6817}"
SLURMD_PORT="${SLURM_LOCAL_SLURMD_PORT:-17001}"
PREFIX="${SLURM_LOCAL_NODE_PREFIX:-n}"
ADD_HOSTS="${SLURM_LOCAL_HOSTS:-1}"
NO_INSTALL="${SLURM_LOCAL_NO_INSTALL:-0}"
TIMEOUT="${SLURM_LOCAL_TIMEOUT:-60}"
DEFAULT_MUNGE_SOCKET=/run/munge/munge.socket.2
MUNGE_SOCKET="${SLURM_LOCAL_MUNGE_SOCKET:-$DEFAULT_MUNGE_SOCKET}"
PROBE="${SLURM_LOCAL_PROBE:-1}"

RUN="$BASE/run"; LOG="$BASE/log"; SPOOL="$BASE/spool"; STATE="$BASE/ctld-state"
CONF="$CONF_DIR/slurm.conf"; GRES="$CONF_DIR/gres.conf"
PACKAGES=(slurmctld slurmd slurm-client munge)
if [[ "$MUNGE_SOCKET" == "$DEFAULT_MUNGE_SOCKET" ]]; then
  MUNGE_DIR=/run/munge; MUNGE_PIDFILE=/run/munge/munged.pid; MUNGE_LOG=/var/log/munge/munged.log
else
  MUNGE_DIR="$BASE/munge"; MUNGE_PIDFILE="$MUNGE_DIR/munged.pid"; MUNGE_LOG="$MUNGE_DIR/munged.log"
fi
HOSTS_MARK="# slurm-local $BASE"
T0=$(date +%s%N)

log() {
  local ms=$(( ($(date +%s%N) - T0) / 1000000 ))
  printf '[slurm-local %d.%01ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*" >&2
}
dump_logs() {
  local f i nodes=()
  for i in $(seq 1 "$NODES"); do nodes+=("$LOG/slurmd-${PREFIX}$i.log"); done
  for f in "$LOG"/slurmctld.log "${nodes[@]}" "$MUNGE_LOG"; do
    [[ -s "$f" ]] || continue
    printf '\n===== %s (last 25 lines) =====\n' "$f" >&2
    tail -n 25 "$f" >&2
  done
}
die() { log "ERROR: $*"; dump_logs; exit 1; }
# set -e failures outside die(): still say where, and show the logs
trap 'rc=$?; log "ERROR: line $LINENO exited $rc"; dump_logs; exit $rc' ERR

[[ $EUID -eq 0 ]] || die "must run as root"
[[ "$NODES" =~ ^[1-9][0-9]*$ ]] || die "NODES must be a positive integer (got '$NODES')"
[[ "$GPUS" =~ ^[0-9]+$ ]] || die "SLURM_LOCAL_GPUS must be a non-negative integer (got '$GPUS')"

# ------------------------------------------------------------------------------------ install
missing_binaries() {
  local b
  for b in munged munge unmunge slurmctld slurmd srun sbatch salloc sinfo squeue scontrol scancel; do
    command -v "$b" >/dev/null 2>&1 || return 0
  done
  return 1
}
apt_install() {
  local apt=(apt-get -o DPkg::Lock::Timeout=600 -o Dpkg::Options::=--force-confdef
             -o Dpkg::Options::=--force-confold)
  export DEBIAN_FRONTEND=noninteractive
  apt-cache show slurmd >/dev/null 2>&1 || "${apt[@]}" update -qq
  "${apt[@]}" install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null && return 0
  # stale package lists are the usual cause; one refresh, one retry
  "${apt[@]}" update -qq && "${apt[@]}" install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
}
if missing_binaries; then
  [[ "$NO_INSTALL" == 1 ]] && die "slurm/munge binaries missing and SLURM_LOCAL_NO_INSTALL=1"
  log "installing ${PACKAGES[*]} with apt-get"
  made_policy=0
  # no init system here: keep the packages' postinst from trying to start daemons
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; made_policy=1
  fi
  rc=0; apt_install || rc=$?
  [[ $made_policy == 1 ]] && rm -f /usr/sbin/policy-rc.d
  missing_binaries && die "apt-get install of ${PACKAGES[*]} failed (rc=$rc)"
  log "install done"
fi

# ------------------------------------------------------------------------------------ helpers
# pid_alive PIDFILE COMM: the file names a live process whose comm starts with COMM
pid_alive() {
  local pid
  [[ -s "$1" ]] || return 1
  pid="$(tr -dc 0-9 < "$1")"
  [[ -n "$pid" && -r "/proc/$pid/comm" && "$(cat "/proc/$pid/comm")" == "$2"* ]]
}
# /etc/hosts minus the line ending in our mark (exact suffix: another state dir may share a prefix)
without_our_hosts_line() { awk -v m="$HOSTS_MARK" 'substr($0, length($0) - length(m) + 1) != m' /etc/hosts; }
nodelist() { if [[ $NODES -eq 1 ]]; then echo "${PREFIX}1"; else echo "${PREFIX}[1-$NODES]"; fi; }
munge_ok() { munge -S "$MUNGE_SOCKET" -n 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1; }
all_running() {
  local i
  munge_ok && pid_alive "$RUN/slurmctld.pid" slurmctld || return 1
  for i in $(seq 1 "$NODES"); do pid_alive "$RUN/slurmd-${PREFIX}$i.pid" slurmd || return 1; done
}

# ------------------------------------------------------------------------------------ config
write_slurm_conf() {
  local i gres=""
  [[ "$GPUS" -gt 0 ]] && gres="Gres=gpu:$GPUS"
  cat <<EOF
# Generated by slurm-local start-cluster.sh: a single-host test cluster.
# slurm-local nodes=$NODES cpus=$CPUS mem=$MEM_MB gpus=$GPUS base=$BASE
ClusterName=local
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
# no cgroups in this sandbox; linuxproc + task/none need none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# start batch jobs at submit, not up to 3 s later (tests wait on sbatch)
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
# trust the node lines below rather than probed hardware (N slurmd share one host)
SlurmdParameters=config_overrides
StateSaveLocation=$STATE
SlurmdSpoolDir=$SPOOL/slurmd-%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
InactiveLimit=0
KillWait=5
MinJobAge=300
MailProg=/bin/true
EOF
  # cred_expire: how long a requeued job is held back (default 120 s; the requeue test waits it)
  if [[ "$MUNGE_SOCKET" == "$DEFAULT_MUNGE_SOCKET" ]]; then
    echo "AuthInfo=cred_expire=10"
  else
    echo "AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10"
  fi
  [[ "$GPUS" -gt 0 ]] && echo "GresTypes=gpu"
  for i in $(seq 1 "$NODES"); do
    echo "NodeName=${PREFIX}$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((SLURMD_PORT + i - 1)) CPUs=$CPUS RealMemory=$MEM_MB $gres State=UNKNOWN"
  done
  echo "PartitionName=debug Nodes=$(nodelist) Default=YES MaxTime=INFINITE State=UP"
}
write_gres_conf() {
  local i
  echo "# Generated by slurm-local start-cluster.sh"
  [[ "$GPUS" -gt 0 ]] || return 0
  for i in $(seq 1 "$NODES"); do
    echo "NodeName=${PREFIX}$i Name=gpu File=$BASE/fakegpu/${PREFIX}$i-gpu[0-$((GPUS - 1))]"
  done
}
make_fake_gpus() {
  local i g d
  mkdir -p "$BASE/fakegpu"
  for i in $(seq 1 "$NODES"); do
    for g in $(seq 0 $((GPUS - 1))); do
      # /dev/null's major:minor: harmless, yet a real device gres/gpu can track and bind
      d="$BASE/fakegpu/${PREFIX}${i}-gpu$g"
      [[ -c "$d" ]] || mknod -m 666 "$d" c 1 3
    done
  done
}

mkdir -p "$RUN" "$LOG" "$SPOOL" "$STATE" "$CONF_DIR"
chmod 755 "$BASE" "$RUN" "$LOG"
# one start or stop at a time per state dir; the nested stop below already runs under ours.
# Daemons are started with 9>&- so they do not inherit (and hold) the lock.
if [[ "${SLURM_LOCAL_LOCK_HELD:-0}" != 1 ]]; then
  exec 9>"$BASE/.lock"
  flock -w "$TIMEOUT" 9 || die "another start/stop holds $BASE/.lock"
  export SLURM_LOCAL_LOCK_HELD=1
fi
[[ "$GPUS" -gt 0 ]] && make_fake_gpus
NEW_CONF="$(mktemp)"; NEW_GRES="$(mktemp)"
trap 'rm -f "$NEW_CONF" "$NEW_GRES"' EXIT
write_slurm_conf > "$NEW_CONF"
write_gres_conf > "$NEW_GRES"

if cmp -s "$NEW_CONF" "$CONF" && cmp -s "$NEW_GRES" "$GRES" && all_running; then
  log "cluster already running with this configuration ($(nodelist)); nothing to do"
  exit 0
fi
if compgen -G "$RUN/*.pid" >/dev/null; then
  log "stopping the previous slurm-local daemons (configuration changed or one is down)"
  SLURM_LOCAL_DIR="$BASE" SLURM_LOCAL_CONF_DIR="$CONF_DIR" SLURM_LOCAL_KEEP_MUNGE=1 \
    SLURM_LOCAL_KEEP_HOSTS=1 SLURM_LOCAL_TIMEOUT="$TIMEOUT" bash "$HERE/stop-cluster.sh" || true
fi
if [[ -f "$CONF" ]] && ! grep -q '^# Generated by slurm-local' "$CONF"; then
  cp -a "$CONF" "$CONF.pre-slurm-local.$(date +%s)"; log "backed up the existing $CONF"
fi
install -m 644 "$NEW_CONF" "$CONF"
install -m 644 "$NEW_GRES" "$GRES"

# ------------------------------------------------------------------------------------ /etc/hosts
# node names must resolve when a job uses one as MASTER_ADDR
if [[ "$ADD_HOSTS" == 1 ]]; then
  line="127.0.0.1 $(for i in $(seq 1 "$NODES"); do printf '%s ' "${PREFIX}$i"; done)$HOSTS_MARK"
  if ! grep -qxF "$line" /etc/hosts; then
    rest="$(without_our_hosts_line)"
    # rewritten in place: /etc/hosts may be a bind mount
    printf '%s\n%s\n' "$rest" "$line" > /etc/hosts || log "warning: could not add node names to /etc/hosts"
  fi
fi

# ------------------------------------------------------------------------------------ munge
if munge_ok; then
  log "munged already answering on $MUNGE_SOCKET; reusing it"
else
  if [[ ! -s /etc/munge/munge.key ]]; then
    log "creating /etc/munge/munge.key"
    mkdir -p /etc/munge
    if command -v mungekey >/dev/null; then mungekey -c -k /etc/munge/munge.key
    else dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none; fi
  fi
  chown -R munge:munge /etc/munge; chmod 700 /etc/munge; chmod 400 /etc/munge/munge.key
  install -d -o munge -g munge -m 755 "$MUNGE_DIR" "$(dirname "$MUNGE_SOCKET")"
  install -d -o munge -g munge -m 700 /var/lib/munge /var/log/munge
  rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock" "$MUNGE_PIDFILE"
  log "starting munged on $MUNGE_SOCKET"
  munged_args=(--socket="$MUNGE_SOCKET" --pid-file="$MUNGE_PIDFILE")
  # a private munged keeps its seed and log apart from the system one
  [[ "$MUNGE_SOCKET" == "$DEFAULT_MUNGE_SOCKET" ]] ||
    munged_args+=(--log-file="$MUNGE_LOG" --seed-file="$MUNGE_DIR/munged.seed")
  runuser -u munge -- /usr/sbin/munged "${munged_args[@]}" 9>&-
  for _ in $(seq 50); do munge_ok && break; sleep 0.1; done
  munge_ok || die "munged did not come up"
  cp "$MUNGE_PIDFILE" "$RUN/munged.pid"  # ownership marker: stop-cluster.sh stops only this
fi

# ------------------------------------------------------------------------------------ slurmctld
export SLURM_CONF="$CONF"
log "starting slurmctld (clean state)"
rm -f "$LOG/slurmctld.log"
# -c: drop old job state; this is a throwaway cluster and the node set may have changed
/usr/sbin/slurmctld -c -f "$CONF" 9>&-
for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.2; done
scontrol ping 2>/dev/null | grep -q 'is UP' || die "slurmctld is not responding"

# ------------------------------------------------------------------------------------ slurmd x N
for i in $(seq 1 "$NODES"); do
  mkdir -p "$SPOOL/slurmd-${PREFIX}$i"
  rm -f "$LOG/slurmd-${PREFIX}$i.log"
  /usr/sbin/slurmd -N "${PREFIX}$i" -f "$CONF" 9>&-
done
T_SLURMD=$(date +%s%N)
log "started $NODES slurmd; waiting for the nodes to become idle"
deadline=$(( $(date +%s) + TIMEOUT ))
while :; do
  states="$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u || true)"
  ready="$(grep -cE ' (idle|mix|alloc)$' <<<"$states" || true)"
  [[ "$ready" -ge "$NODES" ]] && break
  # a slurmd that could not start (port taken, bad conf) exits at once: fail now, not at timeout
  for i in $(seq 1 "$NODES"); do
    [[ $(date +%s%N) -lt $(( T_SLURMD + 2000000000 )) ]] && break
    pid_alive "$RUN/slurmd-${PREFIX}$i.pid" slurmd || die "slurmd ${PREFIX}$i exited (see its log below)"
  done
  [[ $(date +%s) -ge $deadline ]] && { echo "$states" >&2; die "nodes not idle after ${TIMEOUT}s"; }
  sleep 0.2
done
# an sbatch right after slurmctld starts can sit PD until the first scheduler pass; a real step
# proves the whole path (munge, ctld, every slurmd, stepd) before we return
if [[ "$PROBE" == 1 ]]; then
  (cd / && timeout "$TIMEOUT" srun -N"$NODES" --ntasks-per-node=1 --immediate="$TIMEOUT" \
     -J slurm-local-probe true) || die "probe 'srun -N$NODES --ntasks-per-node=1 true' failed"
fi
log "cluster up: $(nodelist), CPUs=$CPUS/node, fake GPUs=$GPUS/node; conf=$CONF logs=$LOG"
[[ "$CONF" == /etc/slurm/slurm.conf ]] || log "clients need: export SLURM_CONF=$CONF"
sinfo >&2
