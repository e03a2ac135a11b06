"""Simulated nodes on one machine: N agents with a fake SLURM env each, on 127.0.0.x loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
FIXTURE = str(REPO / "tests" / "fixtures" / "rank.py")
CHECK_ARGS = str(REPO / "scripts" / "examples" / "check_args.py")


def slurm_env(
    job: str, nnodes: int, node: int, step: str = "0", gpus: int | None = None
) -> dict[str, str]:
    env = {
        "SLURM_JOB_ID": job,
        "SLURM_STEP_ID": step,
        "SLURM_NNODES": str(nnodes),
        "SLURM_NTASKS": str(nnodes),
        "SLURM_NODEID": str(node),
        "SLURM_PROCID": str(node),
        "SLURM_LOCALID": "0",
        "SLURM_STEP_NODELIST": f"127.0.0.[1-{nnodes}]" if nnodes > 1 else "127.0.0.1",
        "SLURM_STEP_TASKS_PER_NODE": f"1(x{nnodes})",
        "SLURMD_NODENAME": f"127.0.0.{node + 1}",
    }
    if gpus is not None:
        env["SLURM_GPUS_ON_NODE"] = str(gpus)
    return env


def base_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI_"))}
    for key in (
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "CUDA_VISIBLE_DEVICES",
    ):
        env.pop(key, None)
    env["AGENT_SECRET"] = "test-secret-" + tmp.name
    env["AGENT_STATE_DIR"] = str(tmp / "state")  # job history and connection files: the test's
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@dataclass
class Agent:
    node: int
    proc: subprocess.Popen
    out: Path
    err: Path

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")


@dataclass
class Cluster:
    tmp: Path
    nnodes: int
    job: str = field(default_factory=lambda: str(uuid.uuid4().int % 10**9))
    step: str = "0"
    agents: list[Agent] = field(default_factory=list)

    @property
    def log_dir(self) -> Path:
        return self.tmp / f"logs-{self.job}.{self.step}"

    def start(
        self,
        args: list[str],
        nodes: list[int] | None = None,
        env: dict[str, str] | None = None,
        per_node_env=None,
        cwd: Path | None = None,
    ) -> Cluster:
        for node in range(self.nnodes) if nodes is None else nodes:
            full = base_env(self.tmp)
            full.update(slurm_env(self.job, self.nnodes, node, self.step))
            full.update(env or {})
            if per_node_env:
                full.update(per_node_env(node))
            out = self.tmp / f"agent-{self.job}-{node}.out"
            err = self.tmp / f"agent-{self.job}-{node}.err"
            argv = [sys.executable, "-m", "agent", "--log-dir", str(self.log_dir), *args]
            with open(out, "wb") as o, open(err, "wb") as e:
                proc = subprocess.Popen(
                    argv,
                    env=full,
                    stdout=o,
                    stderr=e,
                    stdin=subprocess.DEVNULL,
                    cwd=cwd or self.tmp,
                    start_new_session=True,
                )
            self.agents.append(Agent(node, proc, out, err))
        return self

    def wait(self, timeout: float = 120) -> list[int]:
        deadline = time.monotonic() + timeout
        codes = []
        for agent in self.agents:
            try:
                codes.append(agent.proc.wait(max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(
                    f"agent {agent.node} did not exit in {timeout}s:\n{self.dump()}"
                ) from None
        return codes

    def kill(self) -> None:
        for agent in self.agents:
            if agent.proc.poll() is None:
                os.killpg(agent.proc.pid, signal.SIGKILL)
                agent.proc.wait()
        kill_job_processes(self.marker)

    @property
    def marker(self) -> str:
        return f"{self.job}.{self.step}"

    def dump(self) -> str:
        return "\n".join(
            f"--- agent {a.node} stdout:\n{a.stdout()}\n--- agent {a.node} stderr:\n{a.stderr()}"
            for a in self.agents
        )

    def summary(self) -> dict:
        return json.loads((self.log_dir / "summary.json").read_text())

    def rank_file(self, rank: int, stream: str = "out", attempt: int = 0) -> Path:
        suffix = f".r{attempt}" if attempt else ""
        return self.log_dir / f"rank-{rank:05d}{suffix}.{stream}"


def job_processes(marker: str) -> list[psutil.Process]:
    """Every live process that carries the job's marker in its environment."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get("LAUNCH_AGENT_JOB") == marker:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def kill_job_processes(marker: str) -> None:
    for proc in job_processes(marker):
        try:
            proc.kill()
        except psutil.Error:
            pass


def wait_for(condition, timeout: float, what: str, interval: float = 0.02):
    """Await a condition (tests must not sleep as synchronisation)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
