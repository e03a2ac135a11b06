"""The runs of one node agent: receive (or, node 0, offer) each plan, get ready, execute it.

A `Session` is what the runs of one node agent share, and nothing else: the roster (node 0,
resident: exclusions hold for later runs), the run executing now (its stacks desk answers `agent
stacks`), and the peers node 0 knew lost when it offered the last plan. They are values of the
runs, kept here; the node agent is membership only and is reached through its seat
(agent.node.seat.RunSeat). The one-shot agent executes one run in its session, a resident agent
many — the same `execute` for both.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.hang.desk import StackDesk
from agent.metrics.recorder import RunMetrics
from agent.metrics.server import run_metrics
from agent.node import stage as stages
from agent.node.seat import RunSeat
from agent.node.stage import Stage
from agent.pause.desk import PauseDesk
from agent.plan.roster import Roster
from agent.plan.run_plan import RunPlan
from agent.run.execute import Run, RunTools
from agent.run.prepare import offer as publish
from agent.run.prepare import prepare


@dataclass
class Session:
    seat: RunSeat
    roster: Roster | None = None  # who runs, waits or is out: the last run's last lineup
    running: Run | None = None  # the run executing now, on every node
    absent: frozenset[int] = frozenset()  # node 0: agents lost when it offered the last plan

    @property
    def desk(self) -> StackDesk | None:
        """The running attempt's stacks desk (node 0 asks every node's through it)."""
        running = self.running
        return running.desk if running is not None else None

    @property
    def pauses(self) -> PauseDesk | None:
        """The running attempt's paused ranks (`agent debug` reaches them through node 0)."""
        running = self.running
        return running.pauses if running is not None else None

    def ended_ranks(self) -> dict[int, int]:
        """Node 0: the running attempt's ranks that exited → their exit codes (its standings)."""
        running = self.running
        return running.ended_ranks() if running is not None else {}

    def offer(self, run: int, plan: RunPlan) -> None:
        """Node 0: publish a run's plan (the run's scope is where its setup failures go)."""
        scope = self.seat.scope(Stage(run).scope(), wakes=("plan", "done"))
        self.seat.enter(scope)
        self.absent = frozenset(self.seat.lost())
        publish(scope, plan, self.absent)

    def execute(self, run: int, plan: RunPlan | None, tools: RunTools) -> int:
        """One run: node 0 passes the plan it decided, the others receive it. Every line the
        agent logs meanwhile names the run (and attempt)."""
        stage = Stage(run)
        stages.enter(stage)
        try:
            return self._execute(stage, plan, tools)
        finally:
            stages.enter(None)

    def _execute(self, stage: Stage, plan: RunPlan | None, tools: RunTools) -> int:
        seat = self.seat
        scope = seat.scope(stage.scope(), wakes=("plan", "done"))
        if seat.leader and not scope.store.exists(scope.key("plan")):
            assert plan is not None
            self.offer(stage.run, plan)
        seat.enter(scope)
        prepared = prepare(
            scope,
            world=seat.world,
            plan=plan,
            environ=seat.environ,
            read_topology=tools.read_topology,
            timeout=seat.rdzv_timeout,
            names=list(seat.names),
            absent=self.absent if plan is not None else (),
        )
        # Node 0's numbers of the run (--metrics-port: /metrics while it lasts, metrics.prom).
        metrics = RunMetrics()
        if seat.leader:
            metrics = run_metrics(prepared.plan, seat.world, stage.run, lambda: seat.lost().keys())
        current = Run(seat, stage, prepared, tools, self.roster, metrics)
        self.running = current
        try:
            result = current.execute()
        finally:
            self.running = None
            self.roster = current.roster  # node 0, resident: exclusions hold for later runs
            metrics.close()  # metrics.prom written, the server stopped
        return result.code
