"""Spawn the ranks of one node, watch them exit, signal them, tear them down (psutil)."""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from agent.console.router import LogRouter, Stream
from agent.console.stream import StreamState
from agent.plan.ranks import RankSpec

CHILD_WRAPPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")


@dataclass(frozen=True)
class RankExited:
    index: int  # position in the node's rank list
    returncode: int
    when: float


@dataclass
class Worker:
    spec: RankSpec
    proc: Any  # subprocess.Popen, or an agent.warm WarmProcess (pid, wait, poll, returncode)
    start: float
    out: StreamState  # its pipes as the log router reads them
    err: StreamState
    returncode: int | None = None
    end: float | None = None
    terminated: bool = False  # we signalled it during teardown
    warm: bool = False  # forked from the warm interpreter
    ahead: bool = False  # forked from it between runs, before its request (Zygote.stand_by)


def wrapper_argv(
    command: Sequence[str],
    *,
    cpus: Iterable[int] | str = (),
    mems: Iterable[int] | str = (),
    strict: bool = False,
    paths: str = "-",
    parent: int | None = None,
) -> list[str]:
    """The command line that runs `command` under the exec wrapper (child.py); the one builder (ranks,
    `agent exec`, the benchmarks): dies with `parent` (default: the caller), bound to `cpus`
    and `mems` when given; `paths` as the agent's workers.child_paths()."""
    return [
        sys.executable,
        "-S",
        "-E",
        CHILD_WRAPPER,
        str(os.getpid() if parent is None else parent),
        _spelled(cpus),
        _spelled(mems),
        "strict" if strict else "preferred",
        paths or "-",
        "--",
        *command,
    ]


def _spelled(numbers: Iterable[int] | str) -> str:
    text = numbers if isinstance(numbers, str) else ",".join(map(str, numbers))
    return text or "-"


def _wrapped(spec: RankSpec) -> list[str]:
    p = spec.placement
    return wrapper_argv(
        spec.argv, cpus=p.cpus or (), mems=p.mem_nodes or (), strict=p.strict, paths=child_paths()
    )


@functools.cache
def child_paths() -> str:
    """Where the wrapper finds our package and py-libnuma without running site (see child.py)."""
    import importlib.util

    dirs = [os.path.dirname(os.path.dirname(os.path.dirname(CHILD_WRAPPER)))]
    spec = importlib.util.find_spec("numa")
    if spec is not None and spec.origin:
        dirs.append(os.path.dirname(os.path.dirname(spec.origin)))
    return os.pathsep.join(dirs)


def spawn(
    specs: Sequence[RankSpec],
    base_env: Mapping[str, str],
    router: LogRouter,
    prefix_for: Callable[[RankSpec], bytes],
    console: Callable[[RankSpec], bool],
    events: queue.SimpleQueue,
    cwd: str | None = None,
    warm: Any = None,
) -> list[Worker]:
    """Start every rank from the calling thread (PDEATHSIG follows the thread that forks):
    forked from the warm interpreter (`warm`, an agent.warm Zygote) where it can, all in one
    request, else fresh."""
    envs = [{**base_env, **spec.env} for spec in specs]
    forked = _forked(specs, envs, cwd, warm)
    workers = []
    for index, spec in enumerate(specs):
        env = envs[index]
        proc, out_fd, err_fd = forked[index] or _fresh(spec, env, cwd)
        prefix = prefix_for(spec)
        show = console(spec)
        out = router.add(out_fd, Stream(spec.rank, "out", spec.out_path, prefix, show))
        err = router.add(err_fd, Stream(spec.rank, "err", spec.err_path, prefix, show))
        warm = _is_warm(proc)
        worker = Worker(spec, proc, time.time(), out, err, warm=warm, ahead=warm and proc.ahead)
        workers.append(worker)
        threading.Thread(
            target=_wait, args=(index, proc, events), name=f"wait-{spec.rank}", daemon=True
        ).start()
    return workers


def _is_warm(proc: Any) -> bool:
    return not isinstance(proc, subprocess.Popen)


def _fresh(spec: RankSpec, env: Mapping[str, str], cwd: str | None) -> tuple[Any, int, int]:
    proc = subprocess.Popen(
        _wrapped(spec),
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
    )
    assert proc.stdout is not None and proc.stderr is not None  # both PIPE
    out, err = os.dup(proc.stdout.fileno()), os.dup(proc.stderr.fileno())
    proc.stdout.close()
    proc.stderr.close()
    return proc, out, err


def _forked(
    specs: Sequence[RankSpec], envs: Sequence[Mapping[str, str]], cwd: str | None, warm: Any
) -> list[tuple[Any, int, int] | None]:
    """The ranks forked from the warm interpreter, in one request; None for each that cannot be
    (fresh instead)."""
    found: list[tuple[Any, int, int] | None] = [None] * len(specs)
    if warm is None or not warm.ready:
        return found
    from agent.hang.fallback import private_dir
    from agent.warm.command import warm_command
    from agent.warm.zygote import RankStart, WarmProcess

    which = [
        i
        for i, spec in enumerate(specs)
        if warm.fits(envs[i]) and warm_command(spec.argv, sys.executable) is not None
    ]
    if not which:
        return found
    where, stacks = cwd or os.getcwd(), private_dir()
    starts = []
    for i in which:
        p = specs[i].placement
        starts.append(
            RankStart(specs[i].argv, envs[i], where, p.cpus, p.mem_nodes, p.strict, stacks)
        )
    for i, proc in zip(which, warm.fork_all(starts), strict=True):
        if isinstance(proc, WarmProcess):  # else why not (ZygoteGone): this rank starts fresh
            found[i] = (proc, proc.stdout_fd, proc.stderr_fd)
    return found


def _wait(index: int, proc: Any, events: queue.SimpleQueue) -> None:
    returncode = proc.wait()
    events.put(RankExited(index, returncode, time.time()))


def signal_all(workers: Sequence[Worker], signum: int) -> None:
    for worker in workers:
        if worker.returncode is None:
            _killpg(worker.proc.pid, signum)


def _killpg(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)  # each rank leads its own session: reaches its dataloaders too
    except (ProcessLookupError, PermissionError):
        pass


def descendants(workers: Sequence[Worker]) -> list[psutil.Process]:
    """Children that left the rank's process group (setsid) would escape killpg: track them."""
    found = []
    for worker in workers:
        if worker.returncode is None:
            with contextlib.suppress(psutil.Error):
                found += psutil.Process(worker.proc.pid).children(recursive=True)
    return found


def kill_stragglers(processes: Sequence[psutil.Process]) -> None:
    for proc in processes:
        with contextlib.suppress(psutil.Error):
            proc.kill()


class Processes:
    """What the supervisor does to processes; tests pass a fake with the same three methods."""

    def signal_all(self, workers: Sequence[Worker], signum: int) -> None:
        signal_all(workers, signum)

    def descendants(self, workers: Sequence[Worker]) -> list[psutil.Process]:
        return descendants(workers)

    def kill(self, processes: Sequence[psutil.Process]) -> None:
        kill_stragglers(processes)


_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphaned descendants of our ranks (double-forked daemons, setsid grandchildren) are
    re-parented to this process instead of init, so the agent can find and end them."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
