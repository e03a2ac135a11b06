"""Inside a rank: `breakpoint()` (PYTHONBREAKPOINT names `pause`) and the post-mortem of `--pdb`
open a pdb session whose terminal is the node's agent, reached over the unix socket it named in
AGENT_DEBUG_SOCKET (a 0700 directory of its own). A rank's stdin is /dev/null: plain pdb would
read end-of-file at once and end the rank in BdbQuit.

The rank pauses in pdb's own command loop; the agent relays lines from `agent debug` clients.
Without the socket (a rank started by hand with this PYTHONBREAKPOINT), plain pdb runs.
Imports only the standard library and `frames`: this runs in the user's process.
"""

from __future__ import annotations

import os
import pdb
import socket
import sys
import time
from types import FrameType, TracebackType
from typing import IO, Any, cast

from agent.pause.frames import encode, read

SOCKET_ENV = "AGENT_DEBUG_SOCKET"
TIMEOUT_ENV = "AGENT_DEBUG_TIMEOUT"  # post-mortem: seconds a failed rank stays paused
HOOK = "agent.pause.hook.pause"  # what PYTHONBREAKPOINT names
OUT_CHUNK = 256 << 10  # characters of pdb output per frame (a frame is at most 1 MiB)
WELCOME_WAIT = 10.0  # seconds to connect and be taken (the agent answers at once unless crowded)


class Link:
    """This rank's connection to its agent."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.stream = sock.makefile("rb")

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.sock.sendall(encode(message))
        except OSError:
            pass  # the agent is gone: the next read says so

    def close(self) -> None:
        for thing in (self.stream, self.sock):
            try:
                thing.close()
            except OSError:
                pass


class Refused(Exception):
    """The agent took the connection but not this process: why, in one line."""


def connect() -> Link | None:
    """The agent's socket, or None when this rank has none (or it cannot be reached); Refused
    when the agent answers that it takes no more paused processes, or does not answer."""
    path = os.environ.get(SOCKET_ENV)
    if not path:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(WELCOME_WAIT)
        sock.connect(path)
    except OSError as exc:
        sock.close()
        print(f"[agent] cannot reach the agent for pdb ({exc}): plain pdb", file=sys.stderr)
        return None
    link = Link(sock)
    link.send({"hello": {"rank": _rank(), "pid": os.getpid()}})
    try:
        first = read(link.stream)
    except OSError:  # TimeoutError: accepted by the kernel, never by the agent
        first = None
    if first is None or first.get("welcome") is not True:
        link.close()
        why = first.get("refused") if first is not None else None
        if not isinstance(why, str):
            why = f"the agent did not take this process in {WELCOME_WAIT:.0f} s"
        raise Refused(" ".join(why.split())[:500])
    sock.settimeout(None)
    return link


class _Out:
    """pdb's stdout: what it writes goes to the agent when it flushes (before every prompt)."""

    def __init__(self, link: Link) -> None:
        self.link, self.size = link, 0
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        self.size += len(text)
        if self.size > OUT_CHUNK:
            self.flush()
        return len(text)

    def flush(self) -> None:
        text, self.parts, self.size = "".join(self.parts), [], 0
        for start in range(0, len(text), OUT_CHUNK):
            self.link.send({"out": text[start : start + OUT_CHUNK]})


class _In:
    """pdb's stdin: a line from the agent; end-of-file (pdb quits) when the link is gone or
    the deadline passed."""

    def __init__(self, link: Link, debugger: RemotePdb) -> None:
        self.link, self.debugger = link, debugger

    def readline(self) -> str:
        self.link.send({"ready": self.debugger.prompt})
        deadline = self.debugger.deadline
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                print("[agent] --debug-timeout passed: leaving pdb", file=sys.stderr)
                return ""
            try:
                self.link.sock.settimeout(left)
                message = read(self.link.stream)
            except TimeoutError:
                continue
            except OSError:
                return ""
            if message is None:
                return ""
            line = message.get("line")
            if isinstance(line, str):
                return line if line.endswith("\n") else line + "\n"


class RemotePdb(pdb.Pdb):
    """pdb with the agent as its terminal; tells the agent where it stopped, and when it runs."""

    def __init__(self, link: Link, reason: str, timeout: float | None = None) -> None:
        self.link, self.reason = link, reason
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.continued = False
        self.post_mortem = timeout is not None
        # pdb reads lines and writes text: _In and _Out are all the file it uses
        stdin, stdout = cast(IO[str], _In(link, self)), cast(IO[str], _Out(link))
        super().__init__(stdin=stdin, stdout=stdout, nosigint=True, readrc=False)

    def interaction(self, frame: FrameType | None, traceback: TracebackType | None) -> None:
        self.continued = False
        # pdb's own interaction(): setup() is True when an rc command continued (the stubs say None)
        if self.setup(frame, traceback):  # type: ignore[func-returns-value]
            self.forget()
            return
        here, lineno = self.stack[self.curindex]
        self.link.send({"paused": where(here, lineno, self.reason)})
        self.print_stack_entry(self.stack[self.curindex])
        try:
            self._cmdloop()
        finally:
            self.forget()
            done = self.quitting or self.post_mortem or (self.continued and not self.breaks)
            if done and (after := self._after()):
                self.message(after)
            self.stdout.flush()
            self.link.send({"running": True, "done": bool(done)})
            if done:
                self.link.close()

    def _after(self) -> str:
        """What the rank does once out of pdb, when it is not simply running on: said here, where
        it is known (`agent debug -c q` otherwise reads as a rank that runs on)."""
        if self.post_mortem:
            exception = self.reason.removeprefix("exception: ")
            return f"[agent] the rank goes on to fail with its exception ({exception})"
        if self.quitting:
            return (
                "[agent] q: the rank raises BdbQuit where it stopped, as under local pdb: "
                "uncaught, it ends the rank"
            )
        return ""

    def set_continue(self) -> None:
        self.continued = True
        super().set_continue()


def where(frame: FrameType, lineno: int, reason: str) -> dict[str, Any]:
    return {
        "file": frame.f_code.co_filename,
        "line": lineno,
        "function": frame.f_code.co_name,
        "reason": reason,
    }


def pause(*args: Any, header: str | None = None, **kwargs: Any) -> None:
    """sys.breakpointhook for ranks: pause here, in the caller's frame."""
    frame = sys._getframe(1)
    try:
        link = connect()
    except Refused as refused:  # as if no debugger: pdb on /dev/null would end the rank
        print(f"[agent] no pdb for this process ({refused}): breakpoint() skipped", file=sys.stderr)
        return
    if link is None:
        pdb.Pdb().set_trace(frame)
        return
    debugger = RemotePdb(link, "breakpoint")
    if header is not None:
        debugger.message(header)
    debugger.set_trace(frame)


def post_mortem(exc: BaseException, timeout: float) -> None:
    """--pdb: pause at the frame that raised, for at most `timeout` seconds; then return (the
    rank goes on to fail with `exc`)."""
    try:
        link = connect()
    except Refused as refused:
        print(f"[agent] no post-mortem pdb for this process ({refused})", file=sys.stderr)
        return
    if link is None or exc.__traceback__ is None:
        return
    text = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
    debugger = RemotePdb(link, f"exception: {text[:200]}", timeout)
    debugger.reset()
    try:
        debugger.interaction(None, exc.__traceback__)
    except BaseException:  # noqa: BLE001 - pdb's own exits (BdbQuit) must not hide `exc`
        pass
    finally:
        link.close()


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "-1"))
    except ValueError:
        return -1
