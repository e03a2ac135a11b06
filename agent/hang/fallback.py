"""The faulthandler fallback, for ranks py-spy cannot attach to (Yama ptrace_scope=3, seccomp,
a container without ptrace): the rank registers faulthandler on FALLBACK_SIGNAL itself, writing
every thread's stack to a file of its own; the agent sends the signal and reads what was added.

FALLBACK_SIGNAL is SIGRTMIN+3, not SIGUSR1/SIGUSR2: those belong to users and their tools (Slurm
`--signal`, Lightning's requeue, the agent forwards them to ranks), and NCCL/UCX-style libraries
take signals of their own. glibc already keeps the two lowest real-time signals out of
signal.SIGRTMIN. faulthandler's handler is C code, so a rank that holds the GIL in a hung
collective still dumps. Its default action would kill a rank, hence `registered`: the agent
signals a pid only when the file exists and /proc says that pid catches the signal.

faulthandler writes innermost FIRST and names no threads; the last thread it lists is the
oldest, the main thread. Frames beyond 100 are elided by faulthandler itself ("  ...").
"""

from __future__ import annotations

import faulthandler
import logging
import os
import re
import signal
import stat

from agent.hang.stacks import MAIN_THREAD, MAX_THREADS, Frame, ThreadStack, thread_stack

log = logging.getLogger("agent")
FALLBACK_SIGNAL = signal.SIGRTMIN + 3
MAX_DUMP = 4 << 20  # bytes read from one dump
_HEADER = re.compile(r"(?:Current thread|Thread) (0x[0-9a-fA-F]+)|Stack \(most recent")
_FRAME = re.compile(r'\s+File "(.*)", line (\d+|\?+) in (.*)')
_fds: list[int] = []  # this process's dump file, kept open for the handler


def private_dir() -> str | None:
    """This user's directory for dump files and pause sockets on this node (0700, ours, not a
    symlink): $TMPDIR/launch-agent-stacks-<uid>. Where something else holds that name (another
    user's directory or a symlink: it would turn debugging off, or hand it to them), a fresh
    one of this process's own, said once; None when neither can be had, and then ranks register
    no fallback."""
    import tempfile  # here, not at the top: a rank imports this module for install_fallback

    base = tempfile.gettempdir()
    path = os.path.join(base, f"launch-agent-stacks-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None  # no TMPDIR to write in: a fresh one would fail the same way
    try:
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
            if stat.S_IMODE(info.st_mode) != 0o700:  # ours (a umask, a chmod): made private
                os.chmod(path, 0o700)  # in a sticky /tmp only we can replace our entry
            return path
    except OSError:
        return None
    return _fresh_dir(base, path, info)


_fresh: dict[str, str] = {}  # TMPDIR -> the directory this process made there


def _fresh_dir(base: str, taken: str, info: os.stat_result) -> str | None:
    import atexit
    import tempfile

    if base in _fresh:
        return _fresh[base]
    try:
        fresh = tempfile.mkdtemp(prefix=f"launch-agent-stacks-{os.getuid()}-", dir=base)
    except OSError as exc:
        log.warning("stacks: %s is not ours (%s) and no other can be made: %s", taken,
                    _impostor(info), exc.strerror or exc)  # fmt: skip
        return None
    log.warning(
        "stacks: %s is not ours (%s): using %s for this agent's dumps and debug sockets",
        taken, _impostor(info), fresh,
    )  # fmt: skip
    if not _fresh:
        atexit.register(remove_fresh_dirs, os.getpid())
    _fresh[base] = fresh
    return fresh


def _impostor(info: os.stat_result) -> str:
    if stat.S_ISLNK(info.st_mode):
        return "a symlink"
    kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a directory"
    return f"{kind} of uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}"


def remove_fresh_dirs(owner: int | None = None) -> None:
    """At exit, the fresh directories go with the agent that made them (never from a fork of
    it). The agent calls this itself: it leaves by os._exit, which runs no atexit hook."""
    import shutil

    if owner is not None and os.getpid() != owner:
        return
    while _fresh:
        shutil.rmtree(_fresh.popitem()[1], ignore_errors=True)


def fallback_path(directory: str, pid: int) -> str:
    """Where rank `pid` writes its faulthandler dumps (the log dir, or a temporary dir)."""
    return os.path.join(directory, f"stacks-fallback.{pid}.txt")


def install_fallback(path_dir: str) -> None:
    """In a rank, on itself: dump all threads to fallback_path(path_dir, own pid) on
    FALLBACK_SIGNAL. Call it after the rank's fds are final (a warm rank closes the zygote's)."""
    fd = os.open(
        fallback_path(path_dir, os.getpid()),
        os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
        0o600,
    )
    faulthandler.register(FALLBACK_SIGNAL, file=fd, all_threads=True, chain=False)
    while _fds:  # a second call replaces the first registration
        os.close(_fds.pop())
    _fds.append(fd)


def registered(directory: str, pid: int) -> bool:
    """Whether `pid` installed the fallback: its file exists and it catches the signal."""
    if not os.path.isfile(fallback_path(directory, pid)):
        return False
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            caught = next((line for line in status if line.startswith("SigCgt:")), "")
        return bool(int(caught.split()[1], 16) >> (FALLBACK_SIGNAL - 1) & 1)
    except (OSError, ValueError, IndexError):
        return False


def parse_faulthandler(text: str) -> tuple[ThreadStack, ...]:
    """faulthandler's all-threads dump as threads: the main thread first, innermost last."""
    blocks: list[tuple[str, list[Frame]]] = []
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            blocks.append((header.group(1) or "", []))
            continue
        frame = _FRAME.fullmatch(line)
        if frame and blocks:
            number = frame.group(2)
            line_no = int(number) if number.isdigit() else 0
            blocks[-1][1].append(Frame(frame.group(3), frame.group(1), line_no))
    threads = [thread_stack(ident, False, reversed(frames)) for ident, frames in blocks]
    if threads:  # the oldest thread is listed last: the main thread
        main = threads.pop()
        threads.insert(0, thread_stack(MAIN_THREAD, False, main.frames))
    return tuple(threads[:MAX_THREADS])


class Dump:
    """One signalled rank: the size its file had before, until new text stops growing."""

    STABLE_POLLS = 3  # polls without growth before a dump counts as complete

    def __init__(self, directory: str, pid: int) -> None:
        self.path = fallback_path(directory, pid)
        self.start = os.stat(self.path).st_size
        self.size, self.still = self.start, 0
        os.kill(pid, FALLBACK_SIGNAL)

    def poll(self) -> tuple[ThreadStack, ...] | None:
        """The threads once the rank's dump is complete, else None."""
        size = os.stat(self.path).st_size
        if size == self.size and size > self.start:
            self.still += 1
        else:
            self.size, self.still = size, 0
        if self.still < self.STABLE_POLLS:
            return None
        with open(self.path, "rb") as file:
            file.seek(self.start)
            text = file.read(MAX_DUMP).decode(errors="replace")
        threads = parse_faulthandler(text)
        if not threads:
            raise ValueError("faulthandler wrote no stack")
        return threads
