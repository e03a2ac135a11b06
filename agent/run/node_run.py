"""One run on this node: receive (or, node 0, offer) the plan, get ready, execute the attempts.

A `Session` is what the runs of one node agent share, and nothing else: the roster (node 0,
resident: exclusions hold for later runs), the running attempt's stacks desk (for `agent
stacks`), and the peers node 0 knew lost when it offered the last plan. They are values of the
runs, kept here; the NodeAgent itself is membership only. The one-shot agent executes one run
in its session, a resident agent many.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.hang.desk import StackDesk
from agent.metrics.recorder import RunMetrics
from agent.metrics.server import run_metrics
from agent.node import stage as stages
from agent.node.agent import NodeAgent
from agent.node.stage import Stage
from agent.plan.roster import Roster
from agent.plan.run_plan import RunPlan
from agent.run.execute import Attempts
from agent.run.prepare import offer as publish
from agent.run.prepare import prepare


@dataclass
class Session:
    node: NodeAgent
    roster: Roster | None = None  # who runs, waits or is out: the last run's last lineup
    desk: StackDesk | None = None  # the running attempt's, on every node (node 0 asks)
    absent: frozenset[int] = frozenset()  # node 0: agents lost when it offered the last plan

    def offer(self, run: int, plan: RunPlan) -> None:
        """Node 0: publish a run's plan (the run's scope is where its setup failures go)."""
        node = self.node
        node.phase = node.scope(Stage(run).scope(), wakes=("plan", "done"))
        self.absent = frozenset(node.reporter.lost_peers if node.reporter else ())
        publish(node.phase, plan, self.absent)

    def execute(
        self,
        run: int,
        plan: RunPlan | None,
        read_topology: Callable[[str], Any],
        **extra: Any,  # Attempts' warm=, sinks=, replan= (node 0), spawn=
    ) -> int:
        """One run: node 0 passes the plan it decided, the others receive it. Every line the
        agent logs meanwhile names the run (and attempt)."""
        assert self.node.store is not None
        stage = Stage(run)
        stages.enter(stage)
        try:
            return self._execute(stage, plan, read_topology, **extra)
        finally:
            stages.enter(None)

    def _execute(
        self,
        stage: Stage,
        plan: RunPlan | None,
        read_topology: Callable[[str], Any],
        **extra: Any,
    ) -> int:
        node = self.node
        assert node.store is not None and node.reporter is not None
        scope = node.scope(stage.scope(), wakes=("plan", "done"))
        if node.leader and not scope.store.exists(scope.key("plan")):
            assert plan is not None
            self.offer(stage.run, plan)
        node.phase = scope
        prepared = prepare(
            scope,
            world=node.world,
            plan=plan,
            environ=node.environ,
            read_topology=read_topology,
            timeout=node.settings.rdzv_timeout,
            names=node.names,
            absent=self.absent if plan is not None else (),
        )
        reporter = node.reporter
        # Out for the rest of the job: nodes excluded in earlier runs (resident) and lost peers.
        before = {e.agent: e.why for e in self.roster.excluded} if self.roster else {}
        # Node 0's numbers of the run (--metrics-port: /metrics while it lasts, metrics.prom).
        metrics = RunMetrics()
        if node.leader:
            metrics = run_metrics(prepared.plan, node.world, stage.run, lambda: reporter.lost_peers)
        attempts = Attempts(
            world=node.world,
            stage=stage,
            scope_of=lambda name: node.scope(f"{stage.scope()}/{name}", wakes=_WAKES[name[0]]),
            events=node.events,
            signals=node.signals,
            report=reporter.report,
            enter=node.enter,
            serve_workers=node.store.serve_workers,
            close_workers=node.store.close_workers,
            environ={**node.environ, **(prepared.plan.env or {})},  # a client's, over the node's
            stop=node.stop,
            lost_results=reporter.lost_failures,
            lost=lambda: {
                **before,
                **{i: reporter.lost_reason[i] for i in list(reporter.lost_peers)},
            },
            hosts=node.membership.hosts,
            read_topology=read_topology,
            show_desk=self._show,
            metrics=metrics,
            **extra,
        )
        try:
            return attempts.execute(prepared)
        finally:
            self.roster = attempts.roster  # node 0, resident: exclusions hold for later runs
            metrics.close()  # metrics.prom written, the server stopped

    def _show(self, desk: StackDesk | None) -> None:
        self.desk = desk


# Keys a failure in a run's scope sets, to wake who waits on them: an attempt's (`a<k>`) have
# watchers of their own; a lineup round's (`l<k>`) node 0 waits for the last health report.
_WAKES = {"a": (), "l": ("health-done",)}
