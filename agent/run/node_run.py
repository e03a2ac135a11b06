"""One run on this node: receive (or, node 0, offer) the plan, get ready, execute the attempts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.node import stage as stages
from agent.node.stage import Stage
from agent.plan.run_plan import RunPlan
from agent.run.execute import Attempts
from agent.run.prepare import offer as publish
from agent.run.prepare import prepare


def offer(agent: Any, run: int, plan: RunPlan) -> None:
    """Node 0: publish a run's plan (the run's scope is where its setup failures go)."""
    agent.phase = agent._scope(Stage(run).scope(), wakes=("plan", "done"))
    agent.absent = frozenset(agent.reporter.lost_peers if agent.reporter else ())
    publish(agent.phase, plan, agent.absent)


def execute_run(
    agent: Any,  # the NodeAgent
    run: int,
    plan: RunPlan | None,
    read_topology: Callable[[str], Any],
    **extra: Any,
) -> int:
    assert agent.store is not None
    stage = Stage(run)
    stages.enter(stage)
    try:
        return _execute(agent, stage, plan, read_topology, **extra)
    finally:
        stages.enter(None)


def _execute(
    agent: Any,
    stage: Stage,
    plan: RunPlan | None,
    read_topology: Callable[[str], Any],
    **extra: Any,
) -> int:
    run = stage.run
    scope = agent._scope(stage.scope(), wakes=("plan", "done"))
    if agent.leader and not scope.store.exists(scope.key("plan")):
        assert plan is not None
        offer(agent, run, plan)
    agent.phase = scope
    prepared = prepare(
        scope,
        world=agent.world,
        plan=plan,
        environ=agent.environ,
        read_topology=read_topology,
        timeout=agent.settings.rdzv_timeout,
        names=agent.names,
        absent=agent.absent if plan is not None else (),
    )
    reporter = agent.reporter
    # Out for the rest of the job: nodes excluded in earlier runs (resident) and lost peers.
    before = {e.agent: e.why for e in agent.roster.excluded} if agent.roster else {}
    attempts = Attempts(
        world=agent.world,
        stage=stage,
        scope_of=lambda name: agent._scope(f"{stage.scope()}/{name}", wakes=_WAKES[name[0]]),
        events=agent.events,
        signals=agent.signals,
        report=reporter.report,
        enter=agent._enter,
        serve_workers=agent.store.serve_workers,
        close_workers=agent.store.close_workers,
        environ={**agent.environ, **(prepared.plan.env or {})},  # a client's, over the node's
        stop=agent.stop,
        lost_results=reporter.lost_failures,
        lost=lambda: {**before, **{i: reporter.lost_reason[i] for i in list(reporter.lost_peers)}},
        hosts=agent.membership.hosts,
        read_topology=read_topology,
        show_desk=lambda desk: setattr(agent, "desk", desk),
        **extra,
    )
    try:
        return attempts.execute(prepared)
    finally:
        agent.roster = attempts.roster  # node 0, resident: exclusions hold for later runs


# Keys a failure in a run's scope sets, to wake who waits on them: an attempt's (`a<k>`) have
# watchers of their own; a lineup round's (`l<k>`) node 0 waits for the last health report.
_WAKES = {"a": (), "l": ("health-done",)}
