"""`python -m agent SCRIPT ...`: join, execute one run, leave (parse → plan → act)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.control import lifeline
from agent.control.connection import remove
from agent.control.lifeline import Lifeline
from agent.control.stacks_service import open_control
from agent.errors import AgentError, PeerFailed
from agent.launch.cli import Command, misplaced_warning
from agent.launch.node_start import node_agent, node_world, topology_at
from agent.node.events import lost_store_error
from agent.node.failure import Failure, Kind
from agent.node.signals import Interrupted
from agent.plan.run_plan import Request, RunPlan, decide
from agent.run import outputs
from agent.run.checkpoint_dir import location, previous_stop
from agent.run.node_run import Session
from agent.run.tools import RunTools
from agent.run.warm_source import WarmSource, preload_modules
from agent.text import printable
from agent.world import World


def launch(command: Command, environ: Mapping[str, str]) -> int:
    given = {k: v for k, v in command.options.items() if v is not None}
    world, options, environ = node_world(given, environ)
    warning = misplaced_warning(command)
    if warning is not None and world.agent_index == 0:  # once for the job, not once per node
        print(f"agent: warning: {printable(warning, one_line=True)}", file=sys.stderr, flush=True)
    request = Request(
        command.script, command.configs, command.script_args, command.overrides, given
    )
    topology = topology_at
    if command.dry_run:
        from agent.launch.dryrun import print_plan

        return print_plan(decide(request, world, topology), world, environ, topology)
    agent = node_agent(world, options, environ)
    plan = None
    control: tuple[Any, str | None] = (None, None)
    line: Lifeline | None = None
    warm = WarmSource(() if options.cold else preload_modules(options.preload), resident=False)
    try:
        node = agent.connect()
        session = Session(node)  # join, execute one run in it, leave
        if node.leader:
            plan, note = outputs.claim(decide(request, world, topology))
            if note is not None:
                print(
                    f"agent: warning: {printable(note, one_line=True)}", file=sys.stderr, flush=True
                )
            _previous_stop(plan)
            session.offer(0, plan)
            lines = lifeline.watch(node)  # the peers' lifelines: a dead one is lost at once
            control = open_control(session, node.client_key, world, plan.log_dir, lines)
            lifeline.publish(node, control[0].port)
            outputs.write_started(plan, world, control[0].port)  # the job's record from now on
        node.meet()
        line = lifeline.hold(node)  # node 0 hears of this agent's death at once
        replan = _replanner(request, world, plan) if plan is not None else None
        code = session.execute(0, plan, RunTools(topology, warm, replan=replan))
        node.leave()
        return code
    except Interrupted as exc:
        name = signal.Signals(exc.signum).name
        record = replace(agent.failed(Kind.SIGNAL, f"agent received {name}"), signal=name)
        agent.farewell(record, record.how)
        _unfinished(plan, world, 128 + exc.signum, record)
        return 128 + exc.signum
    except AgentError as exc:
        # Ours to tell, unless another node's failure (told already) is what ended us.
        own = not isinstance(exc, PeerFailed)
        told = agent.failed(Kind.SETUP, exc.message, exc) if own else None
        agent.farewell(told, exc.message, everyone=own)
        _unfinished(plan, world, int(exc.code), told or Failure(Kind.JOIN, exc.message))
        raise
    except (RuntimeError, OSError) as exc:  # torch's DistNetworkError & co: node 0 went away
        raise lost_store_error(exc) from None
    finally:
        if line is not None:
            line.goodbye()  # leaving in order (or told already): no loss
        _close_control(*control)
        warm.close()
        agent.close()


def _replanner(request: Request, world: World, first: RunPlan) -> Callable[[int], RunPlan]:
    """Node 0: the plan for a smaller world (--min-nodes), in the log dir the run claimed."""
    return lambda nodes: outputs.relaid(decide(request, world, topology_at, nodes), first)


def _previous_stop(plan: RunPlan) -> None:
    """Node 0, the job's first lines: a requeue (or a resubmission) after a stop for
    preemption that saved no checkpoint, from the record the last job left in the dir."""
    directory = location(plan)
    line = previous_stop(directory) if directory is not None else None
    if line is not None:
        print(f"agent: warning: {printable(line, one_line=True)}", file=sys.stderr, flush=True)


def _unfinished(plan: RunPlan | None, world: World, code: int, cause: Failure) -> None:
    """Node 0, the run ended before its first attempt: summary.json still says why."""
    if plan is not None:
        outputs.write_unfinished(plan, world, code, cause)


def _close_control(endpoint: Any, path: str | None) -> None:
    if endpoint is not None:
        endpoint.close()
    if path is not None:
        remove(Path(path), os.getpid())
