"""Agent side of a zygote: start it, fork ranks from it, learn their exits. Torch-free.

Where the agent is a child subreaper (every agent is: agent.run.workers.become_subreaper), each
rank is adopted: the zygote forks it through a middle process that exits at once, so the rank is
re-parented to the agent, dies with the agent (its PDEATHSIG is set once adopted), outlives the
zygote, and is reaped by the agent itself. Elsewhere (a process that is no subreaper) a rank is
the zygote's child and dies with it: the zygote reaps it and reports the exit over the control
socket, which one reader thread per Zygote turns into WarmProcess results. Either way the rank
runs nothing until the agent knows its pid (the "go" pipe). Protocol: see zygote_main.py.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from agent.warm.command import import_fingerprint, warm_command
from agent.warm.go_pipe import GO, REQUEST
from agent.warm.process import (
    Pending,
    RankStart,
    WarmProcess,
    ZygoteGone,
    adopts_orphans,
    exit_after_zygote,
    file_tail,
    import_paths,
)
from agent.warm.proctitle import PADDING

__all__ = ["RankStart", "WarmProcess", "Zygote", "ZygoteGone"]

ZYGOTE_MAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zygote_main.py")
FORK_REPLY_TIMEOUT = 60.0  # a fork answers in milliseconds; this long means a wedged zygote
RANKS_PER_MESSAGE = 64  # 3 descriptors each: within what the zygote reads at once (serve.py)


class Zygote:
    """One preloaded interpreter per node, serving any number of runs (it never runs user code)."""

    def __init__(
        self,
        proc: subprocess.Popen,
        sock: socket.socket,
        log: IO[bytes],
        preload: Sequence[str],
        fingerprint: tuple[tuple[str, str], ...],
        fast_exit: bool = True,
    ) -> None:
        self.pid = proc.pid
        self.fast_exit = fast_exit
        self._proc, self._sock, self._log = proc, sock, log
        self._fingerprint = fingerprint
        self._info: dict[str, Any] = {"pid": proc.pid, "preload": list(preload)}
        self._answered = threading.Event()  # the ready report came, or the zygote is gone
        self._usable = False
        self._gone = False
        self._lock = threading.Lock()  # _info, _pending, _ranks, _gone
        self._sending = threading.Lock()  # never taken by the reader, which needs only _lock
        self._ids = itertools.count(1)
        self._pending: dict[int, Pending] = {}
        self._standbys: list[tuple[WarmProcess, int]] = []  # forked ahead, with their go pipes
        self._ranks: dict[int, WarmProcess] = {}
        self._reader = threading.Thread(target=self._read, name=f"zygote-{proc.pid}", daemon=True)
        self._reader.start()

    @classmethod
    def start(
        cls, preload: Sequence[str], env: Mapping[str, str], *, fast_exit: bool = True
    ) -> Zygote:
        """Start the zygote and return at once; it imports `preload` meanwhile, with exactly
        `env`. Call from a thread that lives as long as the agent (the main thread): the
        zygote's PDEATHSIG fires when the thread that started it ends. Ranks skip CPython's
        module teardown (script.fast_exit: 1.08 s → 0.17 s for a torch rank with a process
        group), or with `fast_exit=False` end through its whole shutdown."""
        bad = [name for name in preload if not name or "," in name]
        if bad:
            raise ValueError(f"bad module names to preload: {bad}")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # The zygote's own output after its imports (a crash, say): into info["log"] once gone.
        log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
        argv = [sys.executable, ZYGOTE_MAIN, str(os.getpid()), str(theirs.fileno())]
        try:
            proc = subprocess.Popen(
                [*argv, import_paths(), ",".join(preload), PADDING],
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,  # a terminal's Ctrl-C must not reach it
            )
        except BaseException:
            ours.close()
            log.close()
            raise
        finally:
            theirs.close()
        return cls(proc, ours, log, preload, import_fingerprint(env), fast_exit)

    def wait_ready(self, timeout: float) -> bool:
        self._answered.wait(timeout)
        return self.ready

    @property
    def ready(self) -> bool:
        return self._answered.is_set() and self._usable and not self._gone

    @property
    def info(self) -> dict:
        with self._lock:
            return dict(self._info)

    def fits(self, env: Mapping[str, str]) -> bool:
        return import_fingerprint(env) == self._fingerprint

    def fork(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        cpus: Sequence[int] | None,
        mems: Sequence[int] | None,
        strict: bool,
        fallback_dir: str | None = None,
    ) -> WarmProcess:
        """Fork one rank (see fork_all); raises ZygoteGone where it cannot be forked."""
        start = RankStart(
            tuple(argv),
            dict(env),
            cwd,
            None if cpus is None else tuple(cpus),
            None if mems is None else tuple(mems),
            strict,
            fallback_dir,
        )
        [result] = self.fork_all([start])
        if isinstance(result, ZygoteGone):
            raise result
        return result

    def fork_all(self, starts: Sequence[RankStart]) -> list[WarmProcess | ZygoteGone]:
        """Fork each rank (one request to the zygote for the lot), in order: a WarmProcess, or
        why that rank cannot be forked (start it the cold way). Call from the agent's main
        thread. A ValueError for a command or environment this zygote does not serve
        (warm_command, fits())."""
        for start in starts:
            if warm_command(start.argv, sys.executable) is None:
                raise ValueError(
                    f"not a plain `python SCRIPT` / `python -m MOD` command: {start.argv}"
                )
            if not self.fits(start.env):
                raise ValueError("env differs from the zygote's in what its imports read (fits())")
        if not self.ready:
            return [ZygoteGone(self._why_not())] * len(starts)
        found = [self._from_standby(start) for start in starts]
        rest = [start for start, proc in zip(starts, found, strict=True) if proc is None]
        adopt = adopts_orphans()
        forked: list[WarmProcess | ZygoteGone] = []
        for first in range(0, len(rest), RANKS_PER_MESSAGE):
            for result in self._fork_batch(rest[first : first + RANKS_PER_MESSAGE], adopt):
                if isinstance(result, ZygoteGone):
                    forked.append(result)
                    continue
                proc, go_w = result
                with contextlib.suppress(OSError):  # EPIPE: it died already; its exit tells
                    os.write(go_w, GO)  # we know its pid: it may run (closing unread: it exits)
                os.close(go_w)
                forked.append(proc)
        more = iter(forked)
        return [proc if proc is not None else next(more) for proc in found]

    def stand_by(self, count: int) -> int:
        """Fork ranks ahead of their run, so that the next run's ranks need no fork: up to `count`
        wait, each for its request (a standby runs nothing until fork_all hands it one; the
        extra ones, above `count`, are let go). Returns how many wait now. Call between runs:
        each costs a fork now instead of at the next run's start."""
        with self._lock:
            live = [s for s in self._standbys if s[0].returncode is None]
            dead = [s for s in self._standbys if s[0].returncode is not None]
            self._standbys, extra = live[:count], live[count:]
        for _, go_w in dead + extra:
            os.close(go_w)  # EOF: an extra one exits unrun
        need = count - len(live)
        if need <= 0 or not self.ready:
            return min(count, len(live))
        placed = self._fork_batch([None] * min(need, RANKS_PER_MESSAGE), adopts_orphans())
        standbys = [result for result in placed if not isinstance(result, ZygoteGone)]
        with self._lock:
            if self._gone:  # closed meanwhile: nobody will hand these a request
                for _, go_w in standbys:
                    os.close(go_w)
                standbys = []
            self._standbys += standbys
            return len(self._standbys)

    def standby_pids(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(proc.pid for proc, _ in self._standbys)

    def _from_standby(self, start: RankStart) -> WarmProcess | None:
        """A standby that takes `start`'s request; None when none is left alive."""
        while True:
            with self._lock:
                if not self._standbys:
                    return None
                proc, go_w = self._standbys.pop(0)
            try:
                if proc.returncode is not None:  # died waiting (killed, say): its exit is told
                    continue
                data = json.dumps(self._rank_request(start)).encode()
                try:
                    _write_all(go_w, REQUEST + len(data).to_bytes(8, "big") + data)
                except OSError:  # EPIPE: died just now
                    continue
                proc.args, proc.ahead = list(start.argv), True
                return proc
            finally:
                os.close(go_w)

    def _fork_batch(
        self, starts: Sequence[RankStart | None], adopt: bool
    ) -> list[tuple[WarmProcess, int] | ZygoteGone]:
        """Fork one rank per start (None: a standby, its request to come on its go pipe), in
        one message; each forked rank with the write end of its go pipe, the caller's now."""
        pendings: list[Pending] = []
        go: list[int] = []  # the write end of each rank's go pipe
        theirs: list[int] = []  # sent with the request; the zygote has its own copies then
        handed: set[int] = set()
        try:
            for start in starts:
                (out_r, out_w), (err_r, err_w), (go_r, go_w) = os.pipe(), os.pipe(), os.pipe()
                argv = start.argv if start is not None else ("standby",)
                pendings.append(Pending(argv, out_r, err_r, adopt))
                go.append(go_w)
                theirs += [out_w, err_w, go_r]
            request = {
                "op": "fork",
                "adopt": adopt,  # through a middle process, so that the ranks become our children
                "ranks": [
                    self._rank_request(start) if start is not None else {"standby": True}
                    for start in starts
                ],
            }
            try:
                self._send(request, pendings, theirs)
            except ZygoteGone as exc:
                return [*self._failed(pendings, exc)]
            finally:
                for fd in theirs:
                    os.close(fd)
                theirs = []
            deadline = time.monotonic() + FORK_REPLY_TIMEOUT
            for pending in pendings:
                if not pending.answered.wait(max(0.0, deadline - time.monotonic())):
                    self.close()  # wedged: the ranks not answered for start cold
            results: list[tuple[WarmProcess, int] | ZygoteGone] = []
            for pending, go_w in zip(pendings, go, strict=True):
                if pending.proc is None:
                    pending.close()
                    why = f"could not fork: {pending.error}" if pending.error else ""
                    results.append(
                        ZygoteGone(f"zygote {self.pid} {why}" if why else self._why_not())
                    )
                    continue
                results.append((pending.proc, go_w))
                handed.add(go_w)
            return results
        except BaseException:
            for pending in pendings:
                if pending.proc is None:
                    pending.close()
            raise
        finally:
            for fd in go + theirs:
                if fd not in handed:
                    os.close(fd)

    def _rank_request(self, start: RankStart) -> dict[str, Any]:
        command = warm_command(start.argv, sys.executable)
        assert command is not None  # checked by fork_all
        return {
            "form": command.kind,  # a script or a module (agent.warm.command)
            "target": command.target,
            "args": list(command.args),
            "argv": list(start.argv),
            "env": dict(start.env),
            "cwd": os.path.abspath(start.cwd),
            "cpus": None if start.cpus is None else list(start.cpus),
            "mems": None if start.mems is None else list(start.mems),
            "strict": bool(start.strict),
            "fast_exit": self.fast_exit,
            "fallback_dir": start.fallback_dir,  # stacks by faulthandler where py-spy cannot attach
        }

    @staticmethod
    def _failed(pendings: list[Pending], why: ZygoteGone) -> list[ZygoteGone]:
        """The request never reached the zygote: no rank came of it, nor will."""
        for pending in pendings:
            pending.close()
        return [why] * len(pendings)

    def close(self) -> None:
        """Kill the zygote and reap it; idempotent. Adopted ranks run on (they are the agent's);
        the zygote's own children follow it by PDEATHSIG."""
        with self._lock:
            standbys, self._standbys = self._standbys, []
        for _, go_w in standbys:
            os.close(go_w)  # EOF: each exits unrun (adopted, the agent reaps it)
        self._proc.kill()  # a no-op once Popen has reaped it
        self._proc.wait()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the reader at once
        if threading.current_thread() is not self._reader:
            self._reader.join()
        self._sock.close()
        self._log.close()

    def __enter__(self) -> Zygote:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _send(self, request: dict[str, Any], pendings: list[Pending], fds: list[int]) -> None:
        with self._lock:
            if self._gone:
                raise ZygoteGone(self._why_not(locked=True))
            ids = []
            for rank, pending in zip(request["ranks"], pendings, strict=True):
                rank["id"] = rid = next(self._ids)
                self._pending[rid] = pending
                ids.append(rid)
        data = json.dumps(request).encode() + b"\n"
        try:
            with self._sending:  # the pipes ride on the request's first bytes
                sent = socket.send_fds(self._sock, [data], fds)
                self._sock.sendall(data[sent:])
        except OSError as exc:
            with self._lock:
                for rid in ids:
                    self._pending.pop(rid, None)
            raise ZygoteGone(f"zygote {self.pid} unreachable: {exc}") from None

    def _why_not(self, locked: bool = False) -> str:
        info = self._info if locked else self.info
        if info.get("cuda_initialised"):
            return f"zygote {self.pid} initialised CUDA while importing: it must not fork"
        if "exit_status" not in info:
            return f"zygote {self.pid} is still importing {info['preload']}"
        last = (info.get("log", "").strip().splitlines() or [""])[-1]  # a crash's last line
        return f"zygote {self.pid} is gone (exit status {info['exit_status']}) {last}".rstrip()

    def _read(self) -> None:
        buffer = b""
        try:
            while chunk := self._sock.recv(1 << 16):
                *lines, buffer = (buffer + chunk).split(b"\n")
                for line in lines:
                    self._handle(json.loads(line))
        except (OSError, ValueError, KeyError):  # gone, or a garbled channel: unusable either way
            self._proc.kill()
        self._lost()

    def _handle(self, message: dict[str, Any]) -> None:
        op = message.pop("op")
        with self._lock:
            if op == "ready":
                self._info.update(message)
                self._usable = not message.get("cuda_initialised")
                self._answered.set()
            elif op == "forked":
                pending = self._pending.pop(message["id"])
                if "pid" in message:
                    pending.proc = pending.started(message["pid"])
                    if not pending.proc.adopted:  # the zygote reaps it and reports its exit
                        self._ranks[message["id"]] = pending.proc
                pending.error = message.get("error", "")
                pending.answered.set()
            elif op == "exit":
                self._ranks.pop(message["id"]).exited(message["code"])

    def _lost(self) -> None:
        """The zygote is gone: it answers no more, and the ranks it reaped itself (not adopted:
        this process is no subreaper) die by PDEATHSIG, which their exit record says."""
        status = self._proc.wait()
        with self._lock:
            self._gone = True
            self._info.update(exit_status=status, log=file_tail(self._log.fileno()))
            pending, self._pending = list(self._pending.values()), {}
            ranks, self._ranks = list(self._ranks.values()), {}
        self._answered.set()
        for waiting in pending:
            waiting.answered.set()
        for proc in ranks:
            code = exit_after_zygote(proc)
            if code == -signal.SIGKILL:  # PDEATHSIG: the zygote's death, not the rank's doing
                proc.lost_with = (
                    f"with its zygote: the warm interpreter it was forked from (pid {self.pid}) "
                    f"died first ({_status(status)})"
                )
            proc.exited(code)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _status(returncode: int) -> str:
    """Popen's returncode as words: `killed by SIGKILL`, `exit code 3`."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"
