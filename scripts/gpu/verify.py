"""What only a GPU node shows, in one short run (the device check of docs/verified.md).

    python3 scripts/gpu/verify.py OUT_DIR

Runs, on one node with one or more GPUs: `agent doctor`; a one-shot job of `cuda_rank.py`
(CUDA_VISIBLE_DEVICES, NCCL) and of `check_args.py` and `ddp_train.py` on NCCL; a rank stuck
in a real NCCL collective twice — once judged by the agent's default hang verdict before the
process group's timeout (with `agent stacks` during the stall: py-spy in a CUDA wait, NCCL's
flight recorder), once ended by NCCL's own watchdog (its dump read at the verdict); and warm
ranks of a resident agent using CUDA (the zygote must not have initialised it). Each step's
exit code and the lines that prove it go to OUT_DIR/report.txt; the log dirs to logs.tgz.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = Path(sys.argv[1])
WORK = Path("/tmp/gpu-verify")
REPORT: list[str] = []


def say(line: str) -> None:
    print(line, flush=True)
    REPORT.append(line)


def agent(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "agent", *args], capture_output=True, text=True,
        timeout=timeout, cwd=WORK, env=env or base_env(),
    )  # fmt: skip
    say(
        f"$ agent {' '.join(args)}  -> exit {done.returncode} in {time.monotonic() - started:.1f} s"
    )
    return done


def base_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
    env["AGENT_STATE_DIR"] = str(WORK / "state")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def tail(text: str, lines: int = 12) -> str:
    return "\n".join("    " + line for line in text.splitlines()[-lines:])


def step_doctor() -> None:
    done = agent("doctor")
    say(tail(done.stdout + done.stderr, 40))


def step_one_shot() -> None:
    for name, argv in (
        ("env", [str(REPO / "scripts/gpu/cuda_rank.py")]),
        ("check", [str(REPO / "scripts/examples/check_args.py"), str(REPO / "configs/data.yml")]),
        ("ddp", [str(REPO / "scripts/examples/ddp_train.py"), str(REPO / "configs/data.yml"),
                 str(REPO / "configs/model.yml"), "--", "--epochs", "2"]),
    ):  # fmt: skip
        done = agent("--log-dir", f"logs/{name}", *argv)
        say(tail(done.stdout + done.stderr, 8))


def step_stall_default_verdict() -> None:
    """The agent's own hang verdict, before a 30 s process-group timeout; stacks mid-stall."""
    log = WORK / "logs/stall"
    env = base_env()
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "--log-dir", str(log), str(REPO / "scripts/gpu/nccl_stall.py"), "30"],
        cwd=WORK, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    rank_out = log / "rank-00000.out"
    while time.monotonic() - started < 60 and proc.poll() is None:
        if rank_out.exists() and "stalling" in rank_out.read_text(errors="replace"):
            break
        time.sleep(0.2)
    say(f"stall: rank stalled after {time.monotonic() - started:.1f} s")
    time.sleep(7)  # past the probe's 5 s of silence
    stacks = agent("stacks", str(log))
    say(tail(stacks.stdout + stacks.stderr, 30))
    out, _ = proc.communicate(timeout=120)
    say(f"stall (default verdict): exit {proc.returncode} after {time.monotonic() - started:.1f} s")
    say(tail(out, 25))


def step_stall_watchdog() -> None:
    """NCCL's watchdog ends the rank at a 3 s timeout, dumping its recorder; node 0 reads it."""
    done = agent("--log-dir", "logs/watchdog", str(REPO / "scripts/gpu/nccl_stall.py"), "3")
    say(tail(done.stdout + done.stderr, 25))
    dumps = sorted(p.name for p in (WORK / "logs/watchdog").iterdir() if "nccl" in p.name)
    say(f"watchdog: NCCL dumps in the log dir: {dumps}")
    summary = WORK / "logs/watchdog/summary.json"
    if summary.exists():
        doc = json.loads(summary.read_text())
        for attempt in doc.get("attempts", []):
            say("watchdog: summary attempt failure: " + json.dumps(attempt.get("failure"))[:600])
            say(
                "watchdog: summary attempt collectives: "
                + json.dumps(attempt.get("collectives"))[:800]
            )


def step_warm() -> None:
    """A resident agent's warm ranks use CUDA: the zygote never initialised it."""
    env = base_env()
    env.update({
        "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_NNODES": "1", "SLURM_NTASKS": "1",
        "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
        "SLURM_STEP_NODELIST": "127.0.0.1", "SLURM_STEP_TASKS_PER_NODE": "1",
        "SLURMD_NODENAME": "127.0.0.1", "AGENT_SECRET": "gpu-verify-secret",
        "LAUNCH_AGENT_JOB": "4242.0",
    })  # fmt: skip
    with open(WORK / "serve.out", "w") as serve_out:
        serve = subprocess.Popen(
            [sys.executable, "-m", "agent", "serve"], cwd=WORK, env=env,
            stdout=serve_out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    client = {k: v for k, v in env.items() if not k.startswith("SLURM_") or k == "SLURM_JOB_ID"}
    client.pop("LAUNCH_AGENT_JOB")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (WORK / "state/serve-4242.json").exists():
        time.sleep(0.2)
    time.sleep(2)
    for _ in range(2):
        done = agent("run", str(REPO / "scripts/gpu/cuda_rank.py"), env=client)
        say(tail(done.stdout + done.stderr, 8))
    down = agent("down", env=client)
    say(tail(down.stdout + down.stderr, 4))
    serve.wait(timeout=60)
    say(tail((WORK / "serve.out").read_text(errors="replace"), 15))


def main() -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    OUT.mkdir(parents=True, exist_ok=True)
    smi = subprocess.run("nvidia-smi -L", shell=True, capture_output=True, text=True)
    say((smi.stdout + smi.stderr).strip())
    import torch

    say(
        f"torch {torch.__version__}, cuda {torch.version.cuda}, nccl {torch.cuda.is_available() and torch.cuda.nccl.version()}"
    )
    for step in (
        step_doctor,
        step_one_shot,
        step_stall_default_verdict,
        step_stall_watchdog,
        step_warm,
    ):
        say(f"## {step.__name__}")
        try:
            step()
        except Exception as error:  # a step that breaks must not cost the others
            say(f"{step.__name__} broke: {error!r}")
        (OUT / "report.txt").write_text("\n".join(REPORT) + "\n")
    with tarfile.open(OUT / "logs.tgz", "w:gz") as tar:
        tar.add(WORK / "logs", arcname="logs")


if __name__ == "__main__":
    main()
