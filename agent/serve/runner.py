"""Node 0, one client's run: its request → the plan → execution on every node → its answer.

Bad input (argv, configs, script, a lost node) is answered with the usual one-line error and
nothing is published, so the other agents never hear of the run. Once the plan is offered, a
failure anywhere ends the run for every node and the agents wait for the next one.
"""

from __future__ import annotations

import logging
import os
import queue
from collections.abc import Callable
from typing import Any

from agent.console.view import Sinks
from agent.control import wire
from agent.control.stacks_service import write_control
from agent.errors import AgentError, ExitCode, PeerFailed
from agent.node.control_seat import ControlSeat
from agent.node.events import StoreLost, drained
from agent.node.failure import Failure, Kind
from agent.node.signals import Interrupted
from agent.plan.client_env import client_env
from agent.plan.roster import Exclusion, Roster, Shortfall
from agent.plan.run_plan import Request, RunPlan, decide
from agent.plan.topology import Topology
from agent.run import outputs
from agent.run.node_run import Session
from agent.run.tools import RunTools
from agent.run.warm_source import WarmSource
from agent.serve.cli import parse_run
from agent.serve.relay import ChannelOut, forward_logs

log = logging.getLogger("agent")
MAX_ARGS = 4096
MAX_VARS = 16384


class RunRunner:
    def __init__(
        self, seat: ControlSeat, warm: WarmSource, read_topology: Callable[[str], Topology]
    ) -> None:
        self.seat, self.warm, self.read_topology = seat, warm, read_topology
        self.session = Session(seat)  # the runs of this resident agent
        self.offered = False  # the last run got as far as publishing its plan
        self.port = 0  # node 0's endpoint, named in each run's control.json
        self.note: str | None = None  # the last run's log dir held another job's files

    def run(
        self,
        number: int,
        channel: wire.Channel,
        message: dict[str, Any],
        started: Callable[[RunPlan], None],
    ) -> dict[str, Any]:
        """The run's last message for its client: {"end": code, ...} or {"error": ...}."""
        self.offered, self.note = False, None
        drain(self.seat.events)  # a previous client's late Ctrl-C is not this run's
        try:
            plan = self._plan(number, message)
        except AgentError as exc:
            log.warning("run %d refused: %s", number, exc.message)
            return {"error": exc.message, "code": int(exc.code)}
        started(plan)
        _send(channel, {"accepted": {"run": number, "id": plan.run_id, "log_dir": plan.log_dir}})
        if self.note is not None:  # its log dir held another job: where its logs went instead
            log.warning("%s", self.note)
            _send(channel, {"log": f"[agent] {self.note}"})
        sinks = Sinks(ChannelOut(channel, 1), ChannelOut(channel, 2))
        world, request, read = self.seat.world, self.request, self.read_topology

        def replan(nodes: int) -> RunPlan:  # a smaller world, in the log dir claimed
            return outputs.relaid(decide(request, world, read, nodes), plan)

        with forward_logs(channel, self.seat.world.host):
            try:
                self.session.offer(number, plan)
                self.offered = True
                if self.port:
                    write_control(plan.log_dir, self.seat.world, self.port, number)
                outputs.write_started(plan, world, self.port)  # the run's record from now on
                tools = RunTools(self.read_topology, self.warm, sinks, replan)
                code = self.session.execute(number, plan, tools)
            except AgentError as exc:
                own = not isinstance(exc, PeerFailed)
                if own:  # ours: the other nodes must hear of it
                    self.seat.tell(exc)
                cause = (
                    self.seat.failed(Kind.SETUP, exc.message, exc)
                    if own
                    else Failure(Kind.JOIN, exc.message)
                )
                outputs.write_unfinished(plan, world, int(exc.code), cause)  # the record's end
                return {"error": exc.message, "code": int(exc.code)}
        if self.seat.signals.received is not None:  # the agent's own signal: stop serving
            raise Interrupted(self.seat.signals.received)
        # The report node 0 forwarded ends with "summary: PATH" already.
        return {"end": code, "summary": None}

    def after_run(self) -> None:
        drain(self.seat.events)

    def _plan(self, number: int, message: dict[str, Any]) -> RunPlan:
        seat = self.seat
        argv, cwd, env = _checked(message)
        command = parse_run(argv)
        given = {k: v for k, v in command.options.items() if v is not None}
        exported, dropped = client_env(env)
        if dropped:
            log.warning("variables too large to pass to the ranks: %s", ", ".join(dropped[:8]))
        request = Request(
            command.script,
            command.configs,
            command.script_args,
            command.overrides,
            given,
            cwd=cwd,
            env=exported,
            run=number,
        )
        plan = decide(request, seat.world, self.read_topology)
        _check_losses(seat, self.session.roster, plan)
        self.request = request  # for a smaller world, planned again (--min-nodes)
        plan, self.note = outputs.claim(plan)
        return plan


def _check_losses(seat: ControlSeat, roster: Roster | None, plan: RunPlan) -> None:
    """Agents lost since the last run are out of this one: a spare takes a lost node's place in
    the roll call (or, with --min-nodes, the world shrinks). Refused now when neither can."""
    lost = seat.lost()
    if not lost:
        return
    options = plan.options
    roster = roster or Roster.initial(seat.world.agents, options.spares)
    out = [Exclusion(i, seat.names[i], why, 0) for i, why in sorted(lost.items())]
    try:
        roster.without(out, options.min_nodes)
    except Shortfall as exc:
        raise AgentError(
            f"{exc.message}; to go on, stop the resident agents (python -m agent down) and "
            "start them again with srun",
            ExitCode.RENDEZVOUS,
        ) from None


def _checked(message: dict[str, Any]) -> tuple[list[str], str, dict[str, str]]:
    """The request's shape, before anything reads it (a client holds the secret, but may be
    another version of us, or buggy)."""
    argv, cwd, env = message.get("argv"), message.get("cwd"), message.get("env")
    if not (
        isinstance(argv, list) and len(argv) <= MAX_ARGS and all(isinstance(a, str) for a in argv)
    ):
        raise AgentError("the run request has no valid argv; is the client the same version?")
    if not (isinstance(cwd, str) and os.path.isabs(cwd)):
        raise AgentError("the run request has no absolute working directory")
    if not os.path.isdir(cwd):
        raise AgentError(
            f"working directory {cwd} does not exist on node 0 ({os.uname().nodename}); run "
            "from a directory on a file system every node shares"
        )
    if not (
        isinstance(env, dict)
        and len(env) <= MAX_VARS
        and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise AgentError("the run request's environment is not a map of strings")
    return argv, cwd, env


def drain(events: queue.SimpleQueue[Any]) -> None:
    """Drop what a finished run left on the event queue (a lost store stays: it matters)."""
    for event in drained(events):
        if isinstance(event, StoreLost):
            events.put(event)


def _send(channel: wire.Channel, message: dict[str, Any]) -> None:
    try:
        channel.send(message)
    except Exception:
        pass
