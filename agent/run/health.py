"""A node's health before every attempt: log dir writable, GPUs present and sound, free space,
and the user's --health-check command — all bounded in time; problems are one line each."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

OUTPUT_LINES = 20  # of a failed --health-check, kept for summary.json
LINE_CAP = 300
TAIL_BYTES = 16 * 1024
POLL = 1.0  # seconds between looks at the round while a --health-check runs


@dataclass(frozen=True)
class HealthCheck:
    """What to check on this node (from the plan and this node's layout)."""

    log_dir: str
    gpus: Collection[str]  # PCI ids this node's ranks use (empty: no GPU needed)
    min_free_mib: int
    command: str | None
    timeout: float
    shm: str = "/dev/shm"


@dataclass(frozen=True)
class Health:
    problems: tuple[str, ...] = ()
    output: tuple[str, ...] = ()  # the command's last lines, when it failed
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"problems": list(self.problems), "output": list(self.output), "s": self.seconds}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Health:
        return cls(
            tuple(str(p) for p in data.get("problems") or ())[:20],
            tuple(str(line)[:LINE_CAP] for line in data.get("output") or ())[-OUTPUT_LINES:],
            float(data.get("s") or 0.0),
        )


def examine(
    check: HealthCheck,
    gpus_present: Callable[[], Collection[str]],
    gpu_faults: Callable[[], Sequence[str]],
    environ: Mapping[str, str],
    cwd: str | None = None,
    over: Callable[[], bool] = lambda: False,
) -> Health:
    """Every check, the command last (the others take milliseconds). `over`: asked every
    POLL seconds while the command runs; True (the round failed elsewhere) stops it."""
    begin = time.monotonic()
    problems = [*_writable(check.log_dir)]
    for path in (check.log_dir, check.shm) if check.min_free_mib else ():
        problems += low_space(path, _free_bytes(path), check.min_free_mib)
    if check.gpus:
        missing = sorted(set(check.gpus) - set(gpus_present()))
        if missing:
            problems.append(f"GPU(s) {', '.join(missing)} no longer visible")
        problems += gpu_faults()
    output: tuple[str, ...] = ()
    if check.command:
        trouble, output = run_command(check.command, check.timeout, environ, cwd, over)
        problems += trouble
        output = output if trouble else ()
    return Health(tuple(problems), output, round(time.monotonic() - begin, 3))


def low_space(path: str, free: int | None, min_free_mib: int) -> list[str]:
    """Pure: the problem line when `free` bytes at `path` fall below the threshold."""
    if free is None or free >= min_free_mib << 20:
        return []
    return [f"{path} has {free / 2**20:.0f} MiB free, less than --min-free-mib {min_free_mib}"]


def _free_bytes(path: str) -> int | None:
    try:
        stat = os.statvfs(path)
    except OSError:
        return None  # no /dev/shm here: nothing to measure
    return stat.f_bavail * stat.f_frsize


def _writable(log_dir: str) -> list[str]:
    try:
        with tempfile.NamedTemporaryFile(dir=log_dir, prefix=".health-"):
            pass
    except OSError as exc:
        return [f"log dir {log_dir} is not writable ({exc.strerror or exc})"]
    return []


def run_command(
    command: str,
    timeout: float,
    environ: Mapping[str, str],
    cwd: str | None,
    over: Callable[[], bool] = lambda: False,
) -> tuple[list[str], tuple[str, ...]]:
    """Run --health-check in a session of its own; its output goes to a file (bounded memory
    however much it prints), of which the last lines are kept. Returns (problems, lines).
    Whatever ends the wait early (`over`, a signal raised in this thread) kills the check."""
    argv = shlex.split(command)
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=dict(environ), cwd=cwd, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            return [f"--health-check {argv[0]}: cannot run it ({exc.strerror or exc})"], ()
        try:
            trouble = _wait(proc, timeout, over)
        finally:
            if proc.returncode is None:
                _kill_group(proc)
        return trouble, _tail(out)


def _wait(proc: subprocess.Popen, timeout: float, over: Callable[[], bool]) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            code = proc.wait(max(0.0, min(POLL, deadline - time.monotonic())))
            return [] if code == 0 else [f"--health-check exited with {_how(code)}"]
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                return [f"--health-check did not finish within {timeout:g}s"]
            if over():
                return ["--health-check stopped: the round failed on another node"]


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


def _kill_group(proc: subprocess.Popen) -> None:
    """Its session, and every descendant that left it (a shell's `&` may start a new group)."""
    import psutil

    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        tree = []
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    for child in tree:
        with contextlib.suppress(psutil.Error):
            child.kill()
    proc.wait()


def _tail(out: Any) -> tuple[str, ...]:
    size = out.seek(0, os.SEEK_END)
    out.seek(max(0, size - TAIL_BYTES))
    text = out.read().decode(errors="replace")
    lines = [line[:LINE_CAP] for line in text.splitlines() if line.strip()]
    return tuple(lines[-OUTPUT_LINES:])
