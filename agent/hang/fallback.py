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
import os
import re
import signal

from agent.hang.stacks import MAIN_THREAD, MAX_THREADS, Frame, ThreadStack, thread_stack

FALLBACK_SIGNAL = signal.SIGRTMIN + 3
MAX_DUMP = 4 << 20  # bytes read from one dump
_HEADER = re.compile(r"(?:Current thread|Thread) (0x[0-9a-fA-F]+)|Stack \(most recent")
_FRAME = re.compile(r'\s+File "(.*)", line (\d+|\?+) in (.*)')
_fds: list[int] = []  # this process's dump file, kept open for the handler


def private_dir() -> str | None:
    """This user's directory for dump files on this node (0700, ours, not a symlink); None
    when it cannot be had, and then ranks register no fallback."""
    import stat
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"launch-agent-stacks-{os.getuid()}")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError:
        return None
    mine = info.st_uid == os.getuid() and stat.S_ISDIR(info.st_mode)
    return path if mine and stat.S_IMODE(info.st_mode) == 0o700 else None


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
