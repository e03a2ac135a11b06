"""Node 0's answers to `agent stacks`, for one-shot jobs and resident agents alike.

A one-shot node 0 opens the same authenticated endpoint as resident agents (agent.control.endpoint)
and writes its connection record into the run's log dir (`control.json`), so `python -m agent
stacks LOG_DIR` finds a live job from its logs; resident agents write it into each run's log dir.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.control import connection, wire
from agent.control.debug_service import DebugService, paused_ranks
from agent.control.top_service import TopService
from agent.errors import AgentError
from agent.pause.paused import render_list
from agent.plan.log_dir import LogDir
from agent.plan.rank_set import parse_rank_set
from agent.run.node_run import Session
from agent.world import World

if TYPE_CHECKING:
    from agent.control.lifeline import Lifelines

log = logging.getLogger("agent")
CAPTURE_SECONDS = 2.0
NATIVE_SECONDS = 8.0  # native unwinding is ~5x slower per rank, and every rank dumps at once


def stacks_reply(session: Session, message: dict[str, Any]) -> dict[str, Any]:
    """Every rank's stack now, collated; or an error when no attempt is running."""
    desk = session.desk
    if desk is None:
        return {"error": "no ranks are running right now (between attempts or runs)", "code": 2}
    run = message.get("run")  # the run whose control.json the client read (None: any)
    if isinstance(run, int) and desk.stage is not None and desk.stage.run != run:
        return {"error": f"run {run} is over (run {desk.stage.run} is running now)", "code": 2}
    try:
        wanted = parse_rank_set(str(message.get("ranks") or "all"), "--ranks")
    except AgentError as exc:
        return {"error": exc.message, "code": 2}
    from agent.hang.collate import collate, render
    from agent.hang.collectives import collective_view, render_view

    started = time.monotonic()
    native = bool(message.get("native"))
    stacks = desk.ask(native=native, timeout=NATIVE_SECONDS if native else CAPTURE_SECONDS)
    if wanted is not None:
        stacks = [s for s in stacks if s.rank in wanted or s.rank < 0]
    groups = collate(stacks)
    text = render_view(collective_view(stacks, groups, session.ended_ranks())) + render(groups)
    paused = [p for p in paused_ranks(session.pauses) if wanted is None or p.rank in wanted]
    if paused:  # their stacks show pdb's frames: say why, and how to reach them
        text = f"paused in pdb (python -m agent debug):\n{render_list(paused)}\n{text}"
    return {"stacks": {"text": text, "seconds": round(time.monotonic() - started, 3)}}


class Control:
    """The one-shot node 0's endpoint handler: `stacks`, `top` and `debug`."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.debug = DebugService(session)
        self.top = TopService(session)

    def handle(self, channel: wire.Channel, first: dict[str, Any]) -> None:
        if first.get("op") == "stacks":
            channel.send(stacks_reply(self.session, first))
        elif first.get("op") == "top":
            channel.send(self.top.reply(first))
        elif first.get("op") == "debug":
            self.debug.handle(channel, first)
        else:
            channel.send(
                {
                    "error": "this job runs one-shot: only `agent stacks`, `agent top` and "
                    "`agent debug` are served",
                    "code": 2,
                }
            )


def open_control(
    session: Session,
    client_key: bytes,
    world: World,
    log_dir: str,
    lifelines: Lifelines | None = None,
) -> tuple[Any, str | None]:
    """One-shot node 0: the endpoint for `agent stacks` (and the agents' `lifelines`: a
    multi-node job) and its control.json."""
    from agent.control.endpoint import Endpoint

    endpoint = Endpoint(client_key, Control(session), lifelines)
    endpoint.start()
    return endpoint, write_control(log_dir, world, endpoint.port, 0)


def write_control(log_dir: str, world: World, port: int, run: int) -> str | None:
    """LOG_DIR/control.json (0600): where `agent stacks LOG_DIR` finds node 0."""
    path = LogDir(log_dir).control
    record = connection.record_for(world, port, run)
    try:
        from agent.run.outputs import prepare_log_dir

        prepare_log_dir(log_dir)
        connection.write(Path(path), record)
    except (AgentError, OSError) as exc:
        log.warning("cannot write %s (agent stacks LOG_DIR will not find the job): %s", path, exc)
        return None
    return path
