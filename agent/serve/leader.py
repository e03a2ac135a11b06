"""Node 0's resident loop: take runs from clients one at a time, execute them, answer status/down.

The main thread executes runs (as the one-shot agent does); endpoint threads talk to clients:
a run request is claimed under a lock (one active run; a second is refused naming it) and queued
for the main thread; the client's Ctrl-C, or its disconnection, becomes a signal event for the
supervisor, which stops the run's ranks on every node while the agents stay up.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.control import wire
from agent.control.debug_service import DebugService
from agent.control.stacks_service import stacks_reply
from agent.control.top_service import TopService
from agent.errors import AgentError
from agent.node.control_seat import ControlSeat
from agent.node.signals import Signalled
from agent.node.stage import Stage
from agent.serve.runner import RunRunner

log = logging.getLogger("agent")
# A run's key once its client has the end: the other agents then fork their next run's ranks
# (Zygote.stand_by), off the client's wait. It only wakes them; they go on without it after
# ANSWER_WAIT (an outsider's copy, or its deletion, moves that work in time, nothing else).
ANSWERED, ANSWER_WAIT = "answered", 2.0
_SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM, "SIGHUP": signal.SIGHUP}


@dataclass
class Active:
    run: int
    channel: wire.Channel
    script: str = ""
    log_dir: str = ""
    started: float = 0.0
    id: str = ""  # the run's id (agent.plan.run_id), once planned


class Leader:
    def __init__(self, seat: ControlSeat, runner: RunRunner, warm_of: Callable[[], list]) -> None:
        self.seat, self.runner = seat, runner
        self._warm_of = warm_of  # every node's warm status, for `status`
        self._lock = threading.Lock()
        self.active: Active | None = None
        self.requests: queue.Queue[tuple[str, wire.Channel, dict[str, Any]]] = queue.Queue()
        self.down: wire.Channel | None = None
        self.answered = threading.Event()  # set once the `down` client has its answer
        self.run = 0  # the next run's number (its store scope is r<run>)
        self.debug = DebugService(runner.session)
        self.top = TopService(runner.session)

    # -- the main thread ------------------------------------------------------------------
    def loop(self) -> wire.Channel:
        """Runs until `agent down`; returns the channel of the client that asked."""
        while True:
            self.seat.idle()  # a lost peer is noted (out of later runs), not a failure
            try:
                kind, channel, message = self.requests.get(timeout=1.0)
            except queue.Empty:
                continue
            if kind == "down":
                return channel
            self._execute(channel, message)

    def _execute(self, channel: wire.Channel, message: dict[str, Any]) -> None:
        active = self.active
        assert active is not None
        number = self.run
        try:
            final = self.runner.run(number, channel, message, self._started)
        finally:
            if self.runner.offered:
                self.run += 1
            with self._lock:  # from here on the client's departure is no signal to anyone
                self.active = None
            self.runner.after_run()
        _send(channel, final)
        if self.runner.offered:  # the others fork their next ranks now, off the client's wait
            with contextlib.suppress(AgentError, OSError, RuntimeError):  # seat.idle() tells
                self.seat.scope(Stage(number).scope()).put(ANSWERED, {})
        self.runner.warm.stand_by()  # the next run's ranks forked now, once the client has its end

    def _started(self, plan: Any) -> None:
        with self._lock:
            if self.active is not None:
                self.active.script, self.active.log_dir = plan.script, plan.log_dir
                self.active.id = plan.run_id
                self.active.started = time.time()

    # -- endpoint threads -----------------------------------------------------------------
    def handle(self, channel: wire.Channel, first: dict[str, Any]) -> None:
        op = first.get("op")
        if op == "status":
            _send(channel, {"status": self.status()})
        elif op == "down":
            self._down(channel)
        elif op == "run":
            self._run_request(channel, first)
        elif op == "feed":
            self._feed(channel, first)
        elif op == "stacks":
            _send(channel, stacks_reply(self.runner.session, first))
        elif op == "top":
            _send(channel, self.top.reply(first))
        elif op == "debug":
            self.debug.handle(channel, first)
        else:
            _send(channel, {"error": f"unknown request {str(op)[:40]!r}", "code": 2})

    def _run_request(self, channel: wire.Channel, message: dict[str, Any]) -> None:
        with self._lock:
            # a run under way, or `down` asked for: no new run
            busy = self.active or (Active(-1, channel) if self.down is not None else None)
            if busy is None:
                self.active = Active(self.run, channel)
        if busy is not None:
            _send(channel, {"error": self._busy(busy), "code": 2})
            return
        self.requests.put(("run", channel, message))
        self._listen(channel)

    def _busy(self, busy: Active) -> str:
        if busy.run < 0:
            return "the resident agents are stopping (agent down); start them again with srun"
        what = f"{busy.script} (logs in {busy.log_dir})" if busy.script else "being prepared"
        return (
            f"run {busy.id or busy.run} is active: {what}; wait for it to end, or stop it with Ctrl-C in "
            "its client"
        )

    def _listen(self, channel: wire.Channel) -> None:
        """The client's signals while its run is active; its departure stops the run."""
        while True:
            try:
                message = channel.recv(None)
            except Exception:
                message = None
            if message is None:
                self._interrupt(channel, signal.SIGTERM, "the client disconnected")
                return
            name = message.get("signal") if message.get("op") == "signal" else None
            if name in _SIGNALS:
                self._interrupt(channel, _SIGNALS[name], f"the client sent {name}")

    def _interrupt(self, channel: wire.Channel, signum: int, how: str) -> None:
        with self._lock:  # the run it stops is named: a late one never reaches the next run
            active = self.active if self.active and self.active.channel is channel else None
            if active is not None:
                self.seat.events.put(Signalled(signum, how, active.run))
        if active is not None:
            log.warning("stopping run %d: %s", active.run, how)

    def _down(self, channel: wire.Channel) -> None:
        with self._lock:
            self.down = channel
            running = self.active is not None
        if running:
            self.seat.events.put(Signalled(signal.SIGTERM, "stopped by `agent down`"))
        self.requests.put(("down", channel, {}))
        # The main thread answers once every agent is gone; keep the connection open till then.
        self.answered.wait(120.0)

    def _feed(self, channel: wire.Channel, first: dict[str, Any]) -> None:
        """Another agent's console lines and warnings for the active run, relayed to that run's
        client."""
        while True:
            message = channel.recv(None)
            if message is None:
                return
            with self._lock:
                active = self.active
            if active is None or message.get("run") != active.run:
                continue
            if "out" in message:
                _send(active.channel, {"out": message["out"], "fd": message.get("fd", 1)})
            elif isinstance(message.get("log"), str):  # its warnings: why it tears down
                _send(active.channel, {"log": message["log"]})

    def status(self) -> dict[str, Any]:
        seat, world = self.seat, self.seat.world
        lost = seat.lost()
        with self._lock:
            active = self.active
        warm = self._warm_of()
        nodes = [
            {
                "index": i,
                "host": world.hosts[i] if i < len(world.hosts) else seat.names[i],
                "state": "lost" if i in lost else "running" if active else "ready",
                **(warm[i] if i < len(warm) and warm[i] else {"warm": False, "preload": []}),
            }
            for i in range(world.agents)
        ]
        run = None
        if active is not None:
            run = {"run": active.run, "script": active.script, "started": active.started}
            run["id"] = active.id
            run["log_dir"] = active.log_dir
        return {
            "job": world.job_id,
            "host": world.host,
            "nodes": nodes,
            "run": run,
            "runs": self.run,
        }


def _send(channel: wire.Channel, message: dict[str, Any]) -> None:
    try:
        channel.send(message)
    except Exception:  # the client went away: its run is stopped by its listener
        pass
