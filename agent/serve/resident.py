"""`python -m agent serve`: join once, then execute runs from clients until `agent down`.

Every node: world → its agent joins (connect, meet, heartbeats; the node is reached through its
seat, agent.node.control_seat) → a warm interpreter → node 0 leads
(endpoint, connection file, runs), the others follow. Whatever ends an agent — `down`, a signal,
node 0's loss — ends the others too, and leaves no process behind (ranks and warm interpreters
die with their agent: PDEATHSIG).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent.control import connection, lifeline
from agent.control.endpoint import Endpoint
from agent.errors import AgentError
from agent.hang.fallback import private_dir
from agent.hang.recorder import with_probe
from agent.launch.node_start import node_agent, node_world, topology_at
from agent.node.control_seat import ControlSeat, Joining
from agent.node.events import lost_store_error
from agent.node.failure import Failure, Kind
from agent.node.signals import Interrupted
from agent.node.stage import Stage
from agent.run.warm_source import WarmSource, preload_modules
from agent.serve.cli import ServeCommand
from agent.serve.follower import follow
from agent.serve.leader import Leader
from agent.serve.runner import RunRunner

log = logging.getLogger("agent")
_WARM_LOOK = 2.0  # seconds between looks at whether this node's warm interpreter changed


def serve(command: ServeCommand, environ: Mapping[str, str]) -> int:
    world, options, environ = node_world(command.options, environ)
    # The zygote shares the ranks' path: the flight-recorder probe's directory first on it.
    environ = with_probe(environ, private_dir() if options.flight_recorder else None)
    agent: Joining = node_agent(world, options, environ)
    warm = WarmSource(() if options.cold else preload_modules(options.preload), resident=True)
    topology = topology_at

    leader = None
    try:
        seat = agent.connect()
        seat.meet()
        if seat.leader:
            leader = Leader(seat, RunRunner(seat, warm, topology), _warm_reader(seat))
        warm.ensure(environ)
        _announce_warm(seat, warm)
        if leader is not None:
            code = _lead(seat, leader, warm, environ)
        else:
            code = follow(seat, warm, topology)
        seat.leave()
        return code
    except Interrupted as exc:
        name = signal.Signals(exc.signum).name
        _stop_everyone(leader, f"{world.host}'s agent received {name}")
        agent.farewell(None, f"agent received {name}")
        return 128 + exc.signum
    except AgentError as exc:
        _stop_everyone(leader, exc.message)
        agent.farewell(None, exc.message)
        raise
    except (RuntimeError, OSError) as exc:  # torch's DistNetworkError & co: node 0 went away
        raise lost_store_error(exc) from None
    finally:
        warm.close()
        agent.close()


def _lead(seat: ControlSeat, leader: Leader, warm: WarmSource, environ: dict[str, str]) -> int:
    endpoint = Endpoint(seat.client_key, leader, lifeline.watch(seat))
    endpoint.start()
    leader.runner.port = endpoint.port
    lifeline.publish(seat, endpoint.port)
    w = seat.world
    path = connection.path_for(environ, Path.home(), w.job_id or "local")
    connection.write(path, connection.record_for(w, endpoint.port))
    clients = connection.client_command(environ, Path.home(), path)
    log.info("serving %d node(s); clients: %s", w.agents, clients)
    try:
        client = leader.loop()
        _stop_everyone(leader, "stopped by `agent down`")
        seat.leave()
        warm.close()
        try:
            client.send({"down": {"agents": w.agents - len(seat.lost())}})
        finally:
            leader.answered.set()
        return 0
    finally:
        connection.remove(path, os.getpid())
        endpoint.close()


def _stop_everyone(leader: Leader | None, how: str) -> None:
    """Node 0, past the join: wake every waiting agent with a `down` record in the next run's
    scope."""
    if leader is None:
        return
    try:
        scope = leader.seat.side_scope(
            Stage(leader.run).scope(), wakes=("plan", "done"), op_timeout=2.0
        )
        scope.report(Failure(Kind.DOWN, how, time=time.time(), agent=0), slot="down")
    except Exception as exc:
        log.warning("could not tell the other agents to stop: %s", exc)


def _announce_warm(seat: ControlSeat, warm: WarmSource) -> None:
    """Publish this node's warm state once its interpreter is ready (for `agent status`), and
    again whenever it changes (a dead interpreter replaced before a run: a new pid)."""
    key = f"warm/{seat.world.agent_index}"
    if not warm.enabled or warm.zygote is None:
        seat.node_scope().put(key, warm.status())
        return
    side = seat.node_scope(side=True)

    def run() -> None:
        told: dict[str, Any] | None = None
        # one node whose ranks preload torch: its agent hosts their store (_host_ranks_store)
        hosting = seat.world.agents == 1 and any(m.split(".")[0] == "torch" for m in warm.preload)
        while not seat.stop.is_set():
            zygote = warm.zygote
            if zygote is not None:
                zygote.wait_ready(600.0)
            if hosting and warm.status()["warm"]:  # after the interpreter's torch, before "warm"
                _host_ranks_store(seat)
                hosting = False
            now = warm.status()
            if now != told:
                try:
                    side.put(key, now)
                    told = now
                except Exception:
                    return  # the store is gone: so is every reader of this key
            seat.stop.wait(_WARM_LOOK)  # a look at local state; published only when it changed

    threading.Thread(target=run, name="warm-announce", daemon=True).start()


def _host_ranks_store(seat: ControlSeat) -> None:
    """A one-node job's ranks meet at its resident agent's store, not rank 0's: a rank that
    reached init_process_group before rank 0 listened waited out torch's connect back-off (one
    warm 1 x 2 run in two: 0.4-0.7 s of its 0.8 s). The agent's torch import (seconds of CPU)
    comes after the warm interpreter's and before the node is called warm, off every run's
    path; until then, without a usable torch, or when the ranks do not preload torch (a cold
    serve, `--preload` without it), rank 0 hosts it, as in a one-shot job."""
    try:
        seat.host_ranks_store()
    except Exception as exc:
        log.info("the ranks' store stays with rank 0: %s", exc)
        return
    log.info("the ranks of the next runs meet at this agent's store")


def _warm_reader(seat: ControlSeat) -> Any:
    """Node 0: every node's warm state (for `status`), over one side connection of its own."""
    lock = threading.Lock()
    side: list[Any] = []

    def read() -> list[dict[str, Any] | None]:
        with lock:
            if not side:
                side.append(seat.node_scope(side=True, op_timeout=2.0))
            found: list[dict[str, Any] | None] = []
            for i in range(seat.world.agents):
                try:
                    found.append(side[0].get_if(f"warm/{i}", "warm state"))
                except AgentError:
                    found.append(None)
            return found

    return read
