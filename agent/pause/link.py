"""One paused rank as its agent sees it: the rank's end of the unix socket (agent.pause.hook),
where it stopped, what pdb printed since the last answer, and whether pdb waits for a line.

The link greets the process first (`welcome`: the hook waits for it before it starts pdb), then
gives it `handshake` seconds to say who it is and where it stopped: a process that connects and
says nothing, or less than a line, holds the desk's slot, its thread and its descriptor that
long only. Once it has stopped, no read has a deadline: a rank runs on (`c` with breakpoints
left) for as long as it likes."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable

from agent.pause.frames import encode, read
from agent.pause.paused import Paused, line_refused

MAX_OUTPUT = 4 << 20  # characters of pdb output kept for the next answer (the oldest go)
MAX_BANNER = 64 << 10  # characters kept of what pdb printed on stopping (shown to each client)
PROMPT = "prompt"  # pdb waits for a line
BUSY = "busy"  # a line was sent; pdb has not asked for the next one yet
RUNNING = "running"  # the rank runs on (`c` with breakpoints left, `n` over a long call)
GONE = "gone"  # the session ended: continued, quit, or the rank died


class RankLink:
    def __init__(
        self,
        sock: socket.socket,
        host: str,
        on_pause: Callable[[RankLink], None],
        handshake: float,  # seconds from the greeting to the process's first stop
        on_end: Callable[[RankLink], None],  # once, when the session ended (its slot is free)
    ) -> None:
        self.sock, self.host, self.on_pause = sock, host, on_pause
        self.handshake, self.on_end = handshake, on_end
        self.rank, self.pid = -1, 0
        self.where: Paused | None = None
        self.state = BUSY  # until pdb first asks for a line
        self._output: list[str] = []
        self._size = 0
        self._banner = ""  # what pdb printed on stopping (`> file(line)function()`, `-> source`)
        self._stopping = False  # between a stop and pdb's first prompt after it
        self._cond = threading.Condition()

    def start(self) -> None:
        threading.Thread(target=self._read, name="pause-link", daemon=True).start()

    @property
    def paused(self) -> bool:
        """Stopped in pdb (or about to be): not a hang, whatever its output says."""
        return self.state in (PROMPT, BUSY)

    def exchange(self, line: str, wait: float) -> tuple[str, str]:
        """Send pdb one line; (its output, the state after) once pdb asks for the next line,
        the rank runs on, or `wait` seconds passed (state BUSY: ask `take` again later). A rank
        that has just stopped gets the line at its first prompt, if that comes in time."""
        refused = line_refused(line)
        with self._cond:
            if refused is not None:  # it would end the link (a frame's limit): pdb never sees it
                return refused + "\n", self.state
            if self._stopping:  # just stopped (listed already), pdb not asking yet: the line
                # waits for that first prompt within the same `wait` rather than being dropped.
                # A line behind a running command is not queued: its output would be lost.
                deadline = time.monotonic() + wait
                self._cond.wait_for(lambda: self.state != BUSY, wait)
                wait = max(deadline - time.monotonic(), 0.0)
            if self.state != PROMPT:
                return self._take(), self.state
            self._take()  # the stop's banner, or what a detached client left: not this answer
            self.state = BUSY
            try:
                self.sock.sendall(encode({"line": line}))
            except OSError:
                self.state = GONE
            self._cond.wait_for(lambda: self.state != BUSY, wait)
            return self._take(), self.state

    def take(self, wait: float, banner: bool = False) -> tuple[str, str]:
        """What pdb printed since the last answer, waiting up to `wait` s while it is busy;
        `banner` (a client attaching): after where pdb stopped, which an earlier client may
        have taken already."""
        with self._cond:
            self._cond.wait_for(lambda: self.state != BUSY, wait)
            output = self._take()
            if banner and self._banner not in output:
                output = self._banner + output
            return output, self.state

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()

    def _take(self) -> str:
        text = "".join(self._output)
        self._output, self._size = [], 0
        return text

    def _read(self) -> None:
        stream = self.sock.makefile("rb")
        deadline = time.monotonic() + self.handshake
        try:
            self.sock.settimeout(self.handshake)  # a process that reads nothing cannot hold us
            self.sock.sendall(encode({"welcome": True}))
            while True:
                if self.where is None:  # a frame at a time: the whole handshake is bounded
                    self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
                if (message := read(stream)) is None:
                    break
                self._on(message)
                if self.where is not None:
                    self.sock.settimeout(None)
        except (OSError, ValueError):  # TimeoutError among them: the handshake's time is up
            pass
        finally:
            with self._cond:
                self.state = GONE
                self._cond.notify_all()
            self.close()
            self.on_end(self)

    def _on(self, message: dict[str, object]) -> None:
        paused = None
        with self._cond:
            if isinstance(hello := message.get("hello"), dict):
                self.rank = _int(hello.get("rank"), -1)
                self.pid = _int(hello.get("pid"), 0)
            elif isinstance(where := message.get("paused"), dict):
                record = {**where, "rank": self.rank, "host": self.host, "pid": self.pid}
                with contextlib.suppress(ValueError):
                    paused = self.where = Paused.from_json(record)
                self.state = BUSY
                self._banner, self._stopping = "", True
            elif isinstance(text := message.get("out"), str):
                self._add(text)
                if self._stopping and len(self._banner) < MAX_BANNER:
                    self._banner += text[: MAX_BANNER - len(self._banner)]
            elif isinstance(prompt := message.get("ready"), str):
                if self._output and self._output[-1].endswith(prompt) and prompt:
                    self._output[-1] = self._output[-1][: -len(prompt)]
                if self._stopping and prompt:
                    self._banner = self._banner.removesuffix(prompt)
                self._stopping = False
                self.state = PROMPT
            elif message.get("running"):
                self.state = GONE if message.get("done") else RUNNING
            self._cond.notify_all()
        if paused is not None:
            self.on_pause(self)

    def _add(self, text: str) -> None:
        self._output.append(text)
        self._size += len(text)
        while self._size > MAX_OUTPUT and len(self._output) > 1:
            self._size -= len(self._output.pop(0))


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default
