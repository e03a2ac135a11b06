"""Process plumbing shared by every benchmark: envs, ports, process groups, exit timing, budgets.

Every process the bench starts carries LA_BENCH_RUN=<id> in its environment (inherited by ranks),
leads its own session, and is killed (group + marked descendants) when its run ends or the bench
exits. Only 127.0.0.0/8 addresses are used.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PY = sys.executable
MARK = "LA_BENCH_RUN"
RUN_ID = uuid.uuid4().hex[:12]
_DROP_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "TORCHELASTIC_")
_DROP_KEYS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "CUDA_VISIBLE_DEVICES",
    "PYTHONUNBUFFERED",
)


def program(name: str) -> str:
    """Path of one of the tiny programs the ranks run (scripts/bench/<name>.py)."""
    return str(HERE / f"{name}.py")


def base_env(**extra: str) -> dict[str, str]:
    """The bench's clean env: no scheduler/launcher variables, repo importable, run marker set."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_DROP_PREFIXES) and k not in _DROP_KEYS
    }
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    env["AGENT_SECRET"] = "bench-" + RUN_ID
    env[MARK] = RUN_ID
    env.update(extra)
    return env


def slurm_env(job: str, nnodes: int, node: int) -> dict[str, str]:
    """What srun would give the agent on simulated node `node` (127.0.0.<node+1>)."""
    return {
        "SLURM_JOB_ID": job,
        "SLURM_STEP_ID": "0",
        "SLURM_NNODES": str(nnodes),
        "SLURM_NTASKS": str(nnodes),
        "SLURM_NODEID": str(node),
        "SLURM_PROCID": str(node),
        "SLURM_LOCALID": "0",
        "SLURM_STEP_NODELIST": f"127.0.0.[1-{nnodes}]" if nnodes > 1 else "127.0.0.1",
        "SLURM_STEP_TASKS_PER_NODE": f"1(x{nnodes})",
        "SLURMD_NODENAME": f"127.0.0.{node + 1}",
    }


def rank_env(rank: int, local_rank: int, world: int, local_world: int, port: int) -> dict[str, str]:
    """The preset env of a rank started without any launcher (rank 0 hosts the store)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local_world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
    }


_job_counter = 0


def unique_job() -> str:
    """A fresh SLURM_JOB_ID per run: its store namespace and log dir never collide."""
    global _job_counter
    _job_counter += 1
    return f"{int(RUN_ID[:6], 16) % 90000 + 10000}{_job_counter:03d}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- processes ----------------------------------------------------------------------------
_LIVE: list[subprocess.Popen] = []


@dataclass
class Started:
    """A set of processes started together, with the monotonic time each one exited."""

    procs: list[subprocess.Popen]
    t0: float
    ends: dict[int, float] = field(default_factory=dict)
    wall_ends: dict[int, float] = field(default_factory=dict)  # time.time(), to compare with files
    _threads: list[threading.Thread] = field(default_factory=list)

    def _watch(self) -> None:
        for index, proc in enumerate(self.procs):
            thread = threading.Thread(target=self._wait_one, args=(index, proc), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _wait_one(self, index: int, proc: subprocess.Popen) -> None:
        proc.wait()  # blocking waitpid: the exit time is exact, no poll interval
        self.wall_ends[index] = time.time()
        self.ends[index] = time.monotonic()

    def wait(self, timeout: float) -> bool:
        """True when every process exited within `timeout` seconds from now."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return len(self.ends) == len(self.procs)

    @property
    def codes(self) -> list[int | None]:
        return [p.returncode for p in self.procs]

    @property
    def wall(self) -> float:
        return max(self.ends.values()) - self.t0

    def alive(self) -> int:
        return len(self.procs) - len(self.ends)

    def kill(self) -> None:
        kill_group(self.procs)


def start(commands: Sequence[tuple[list[str], Mapping[str, str], Path]], cwd: Path) -> Started:
    """Start every (argv, env, output file) at once, each leading its own session."""
    procs = []
    t0 = time.monotonic()
    for argv, env, out in commands:
        with open(out, "wb") as sink:
            proc = subprocess.Popen(
                argv,
                env=dict(env),
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=cwd,
                start_new_session=True,
            )
        procs.append(proc)
        _LIVE.append(proc)
    started = Started(procs, t0)
    started._watch()
    return started


def run_all(
    commands: Sequence[tuple[list[str], Mapping[str, str], Path]], cwd: Path, timeout: float
) -> Started:
    """Start, wait (bounded), and always leave nothing behind."""
    started = start(commands, cwd)
    try:
        started.wait(timeout)
    finally:
        started.kill()
    return started


def kill_group(procs: Iterable[subprocess.Popen]) -> None:
    """SIGKILL each process group and every descendant (ranks lead their own sessions)."""
    procs = list(procs)
    victims: list[psutil.Process] = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            victims += psutil.Process(proc.pid).children(recursive=True)
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
    for victim in victims:
        with contextlib.suppress(psutil.Error):
            victim.kill()
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        if proc in _LIVE:
            _LIVE.remove(proc)


def marked_processes() -> list[psutil.Process]:
    """Live processes started by this bench run (the marker is inherited by every descendant)."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter():
        try:
            if proc.pid == me or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(MARK) == RUN_ID:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def cleanup() -> int:
    """Kill whatever is left; returns how many strays there were."""
    kill_group(list(_LIVE))
    strays = marked_processes()
    for proc in strays:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return len(strays)


def install_cleanup() -> None:
    atexit.register(cleanup)

    def on_signal(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)


# -- time budget --------------------------------------------------------------------------
DEADLINE: float | None = None  # time.monotonic() by which the whole run should be done


@dataclass
class Budget:
    """A section's share of the run: optional repetitions stop once it is spent, or once the whole
    run's deadline minus what the later sections need (`reserve`) is near."""

    seconds: float
    reserve: float = 0.0
    started: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        own = self.seconds - (time.monotonic() - self.started)
        if DEADLINE is None:
            return own
        return min(own, DEADLINE - time.monotonic() - self.reserve)

    def allows(self, done: int, least: int, next_cost: float = 0.0) -> bool:
        return done < least or self.left() > next_cost


def wait_for_files(paths: Sequence[Path], timeout: float, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(p.exists() for p in paths):
            return True
        time.sleep(interval)
    return False


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
