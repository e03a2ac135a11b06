"""The client side of `agent run|status|down`: find node 0's agent, prove the secret, talk.

Requests: {"op": "run", "argv", "cwd", "env"} | {"op": "status"} | {"op": "down"}, and during a
run {"op": "signal", "signal": NAME}. Answers: {"accepted": {"run", "id", "log_dir"}}, {"out": base64,
"fd": 1|2}, {"log": line}, {"end": code, "summary": path|None}, {"error": text, "code": int},
{"status": {...}}, {"down": {"agents": n}}. Unknown keys are ignored (a newer agent may add some).
Kept free of torch (and of everything a run needs): the client must start at once.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TextIO

from agent.control import connection
from agent.control.wire import RETRY_FOR, Channel, WireError, connect_retrying, unpack_bytes
from agent.errors import AgentError, ExitCode
from agent.node.signing import load_secret
from agent.node.trust import JobKeys
from agent.serve.forward import GaveUp, StopSignals
from agent.serve.status_view import render_status
from agent.text import printable


class TextSink(Protocol):
    """Where a client's notes go: a text stream, or nowhere."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


_PAUSED = re.compile(rb"(?m)^rank (\d+) paused at .*: python -m agent debug ")
_HOLD_LIMIT = 8 << 20  # bytes of run output kept while --attach holds the terminal
_SLICE = 0.25  # the longest a forwarded Ctrl-C waits before it is sent to node 0
_STOPPING = "[agent] stopping the run on every node (Ctrl-C again to stop waiting)\n"


@dataclass(frozen=True)
class Target:
    """Node 0's agent, as its connection file names it."""

    host: str
    port: int
    job: str
    step: str
    path: Path
    pid: int = 0  # who wrote the file, for messages about a stale one
    hostname: str = ""
    run: int | None = None  # a run's control.json: the run it belongs to


def locate(environ: Mapping[str, str], home: Path, explicit: str | None) -> Target:
    path = connection.find(environ, home, explicit)
    record = connection.read(path)
    return Target(
        record["host"],
        record["port"],
        record["job"],
        record["step"],
        path,
        record["pid"],
        record["hostname"],
        number
        if isinstance(number := record.get("run"), int) and not isinstance(number, bool)
        else None,
    )


def open_channel(
    target: Target,
    environ: Mapping[str, str],
    home: Path,
    timeout: float = 10.0,
    retry_for: float = RETRY_FOR,
) -> Channel:
    """Connect and prove the job's secret, trying again for a few seconds while node 0 is
    crowded or slow; AgentError (3) saying what was seen when it never answers, (4) on a
    secret mismatch or a server that cannot prove the secret."""
    keys = JobKeys.derive(load_secret(environ, home), target.job, target.step)
    try:
        return connect_retrying(target.host, target.port, keys.client_key, timeout, retry_for)
    except WireError as exc:
        if exc.code == ExitCode.REFUSED:
            raise
        where, file = f"{target.host}:{target.port}", target.path
        message = {
            "refused": f"no resident agents answer at {where}: nothing listens there "
            f"({exc.message}; from {file}, written by pid {target.pid} on "
            f"{target.hostname or '?'}); they have stopped: start them again with `srun "
            "--ntasks-per-node=1 python -m agent serve &`, or remove the stale file",
            "crowded": f"node 0's agent at {where} is running but crowded: it turned this "
            f"client away ({exc.message}): too many connections that never authenticate "
            f"(someone may be flooding its port); {file} is valid: try again",
        }.get(
            exc.seen,
            f"node 0's agent at {where} did not answer ({exc.message}): it may be overloaded "
            f"or the network slow; try again ({file} is kept)",
        )
        raise AgentError(message, ExitCode.RENDEZVOUS) from None


def run(
    channel: Channel,
    request: dict[str, Any],
    out: BinaryIO,
    err: BinaryIO,
    attach: Callable[[int, int | None], None] | None = None,
) -> int:
    """Send the run request, stream its output, return its exit code. A stop signal meanwhile
    is forwarded to node 0 (which stops the run everywhere and still sends the end); a second
    one stops waiting at once (128 + its number). `attach(rank, run)` (--attach): called, in
    a thread of its own, when the console first says a rank paused; the run's output waits
    meanwhile."""
    view = _RunView(channel, out, err, attach)
    with StopSignals() as stops:
        try:
            channel.send(request)
            while True:
                for name in stops.take():
                    view.forward(name)
                try:
                    msg = channel.recv(timeout=_SLICE)
                except TimeoutError:
                    continue
                except WireError as exc:
                    if exc.code == ExitCode.REFUSED:
                        raise
                    msg = None
                if msg is None:
                    raise view.lost()
                code = view.show(msg)
                if code is not None:
                    return code
        except GaveUp as gave:
            view.line("[agent] stopped waiting; the run may still be stopping on the nodes\n")
            return 128 + gave.signum
        except WireError as exc:
            if exc.code == ExitCode.REFUSED:
                raise
            raise view.lost() from None


def status(
    channel: Channel, out: TextIO, timeout: float = 30.0, now: Callable[[], float] = time.time
) -> int:
    channel.send({"op": "status"})
    reply = answer(channel, "status", timeout, out)
    for line in render_status(reply if isinstance(reply, Mapping) else {}, now()):
        print(printable(line), file=out)
    return 0


def down(channel: Channel, out: TextIO, timeout: float = 120.0) -> int:
    channel.send({"op": "down"})
    reply = answer(channel, "down", timeout, out)
    agents = reply.get("agents") if isinstance(reply, Mapping) else None
    if isinstance(agents, int) and not isinstance(agents, bool):
        print(f"stopped {agents} resident agent{'' if agents == 1 else 's'}", file=out)
    else:
        print("stopped the resident agents", file=out)
    return 0


class _RunView:
    """What the server says during a run, on our stdout and stderr."""

    def __init__(
        self,
        channel: Channel,
        out: BinaryIO,
        err: BinaryIO,
        attach: Callable[[int, int | None], None] | None = None,
    ) -> None:
        self._channel = channel
        self._streams = {1: out, 2: err}
        self._attach = attach
        self._held: list[tuple[int, bytes]] | None = None  # output kept while attached
        self._held_bytes = 0
        self._lock = threading.Lock()
        self._dead: set[int] = set()
        self._run: int | None = None
        self._id = ""  # the run's id (agent.plan.run_id), as history and its log dir name it
        self._log_dir = ""
        self._forwarded = False

    def show(self, msg: dict[str, Any]) -> int | None:
        """Render one message; the exit code once the run is over."""
        try:
            if "out" in msg:
                fd, data = 2 if msg.get("fd") == 2 else 1, unpack_bytes(msg["out"])
                self._write(fd, data)
                if fd == 2 and self._attach is not None:
                    self._paused(data)
            elif "log" in msg:
                self.line(f"{printable(msg['log'])}\n")
            elif "accepted" in msg:
                self._run = int(msg["accepted"]["run"])
                self._id = printable(str(msg["accepted"].get("id") or self._run), one_line=True)
                self._log_dir = str(msg["accepted"].get("log_dir", ""))
                self.line(f"[agent] run {self._id}: logs in {self._log_dir}\n")
            elif "end" in msg:
                self._release()  # the run is over: what waited for a session shows now
                if msg.get("summary"):
                    self.line(f"summary: {msg['summary']}\n")
                return _exit_code(msg["end"])
            elif "error" in msg:
                self.line(f"agent: error: {printable(msg['error'])}\n")
                return _exit_code(msg.get("code"))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise _garbled(self._channel, exc) from None
        return None

    def forward(self, name: str) -> None:
        self._channel.send({"op": "signal", "signal": name})
        if not self._forwarded:
            self._forwarded = True
            self.line(_STOPPING)

    def line(self, text: str) -> None:
        self._write(2, text.encode("utf-8", "replace"))

    def lost(self) -> AgentError:
        during = f"during run {self._id}" if self._run is not None else "before the run started"
        logs = f"; its logs are in {self._log_dir}" if self._log_dir else ""
        return AgentError(
            f"lost the resident agents (node 0's agent at {self._channel.peer}) {during}{logs}; "
            "check them with `python -m agent status`",
            ExitCode.RENDEZVOUS,
        )

    def _paused(self, data: bytes) -> None:
        """--attach: the first rank the console says paused gets a session."""
        found = _PAUSED.search(data)
        if found is None or self._attach is None:
            return
        attach, self._attach = self._attach, None
        self._held = []
        threading.Thread(
            target=self._session, args=(attach, int(found.group(1))), daemon=True
        ).start()

    def _session(self, attach: Callable[[int, int | None], None], rank: int) -> None:
        try:
            attach(rank, self._run)
        finally:
            self._release()

    def _release(self) -> None:
        """Show what waited for the session, before anything that comes after it."""
        with self._lock:
            for fd, data in self._held or []:
                self._emit(fd, data)
            self._held = None

    def _write(self, fd: int, data: bytes) -> None:
        with self._lock:
            if self._held is None:
                self._emit(fd, data)
            elif self._held_bytes < _HOLD_LIMIT:  # beyond it: in the rank files only
                self._held.append((fd, data))
                self._held_bytes += len(data)

    def _emit(self, fd: int, data: bytes) -> None:
        if fd in self._dead:
            return
        try:
            self._streams[fd].write(data)
            self._streams[fd].flush()
        except OSError:
            # A closed pipe (`| head`) or a vanished terminal: the run goes on, and keeps its
            # output in its log files, so stop writing here rather than abandon the run.
            self._dead.add(fd)


def answer(channel: Channel, key: str, timeout: float, out: TextSink) -> Any:
    """The value under `key` of the server's answer; its error as AgentError."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            msg = channel.recv(timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise AgentError(
                f"node 0's agent at {channel.peer} did not answer `{key}` within {timeout:g}s; "
                "it may be busy or stuck: try again, or check its log",
                ExitCode.RENDEZVOUS,
            ) from None
        if msg is None:
            raise AgentError(
                f"node 0's agent at {channel.peer} closed the connection before answering "
                f"`{key}`; the resident agents may have stopped",
                ExitCode.RENDEZVOUS,
            )
        if "error" in msg:
            raise AgentError(str(msg["error"]), _known_code(msg.get("code")))
        if key in msg:
            return msg[key]
        if "log" in msg:
            print(f"[agent] {printable(msg['log'])}", file=out)


def _exit_code(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 255:
        return value
    return int(ExitCode.RANK_FAILED)


def _known_code(value: object) -> ExitCode:
    try:
        return ExitCode(value) if isinstance(value, int) else ExitCode.RENDEZVOUS
    except ValueError:
        return ExitCode.RENDEZVOUS


def _garbled(channel: Channel, exc: Exception) -> AgentError:
    return AgentError(
        f"node 0's agent at {channel.peer} sent a message this client does not understand "
        f"({type(exc).__name__}: {exc}); run the same launch-agent version for both",
        ExitCode.RENDEZVOUS,
    )
