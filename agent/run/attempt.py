"""This node's share of one attempt: its ranks started (forked warm where it can), supervised
until the attempt ends anywhere, and what they left behind cleaned up."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

from agent.console.view import ConsoleView
from agent.hang.desk import StackDesk
from agent.hang.fallback import fallback_path, private_dir
from agent.hang.watch import HangWatch
from agent.metrics.recorder import RunMetrics
from agent.node.events import AbortSeen, StoreLost
from agent.node.scope import Scope
from agent.plan.rank_set import format_ranges
from agent.plan.roster import Roster, seated
from agent.plan.run_plan import seat_specs
from agent.run import workers
from agent.run.pace import PaceWatch
from agent.run.prepare import Prepared
from agent.run.supervisor import Outcome, Supervisor
from agent.world import World
from agent.world.proctrack import slurm_signals_ranks

log = logging.getLogger("agent")
WARM_WAIT = 120.0  # seconds a run waits for a warm interpreter that is still importing


def run_ranks(
    self: Any,  # the Attempts
    prepared: Prepared,
    scope: Scope,
    attempt: int,
    port: int,
    roster: Roster,
) -> Outcome:
    """Start this node's ranks for one attempt, supervise them, clean up after them."""
    plan, world = prepared.plan, seated(self.world, roster)
    specs = seat_specs(
        plan,
        self.world,
        roster,
        prepared.topology,
        attempt=attempt,
        port=port,
        config_file=prepared.config_file,
        environ=self.environ,
    )
    ranks = [s.rank for s in specs]
    log.info(
        "attempt %d: starting ranks %s on %s", attempt, format_ranges(ranks) or "none", world.host
    )
    stage = self.stage.at(attempt)
    desk = StackDesk(scope, roster.nodes, world.host, lambda: _live(sup), private_dir(), stage)
    desk.start()
    sup = Supervisor(
        specs,
        stage=stage,
        events=self.events,
        report=lambda record: self.report(scope, record),
        grace=plan.options.grace,
        hang_warning=plan.options.hang_warning,
        hang=_hang_watch(plan, scope, desk, attempt, world),
        slurm_signals_ranks=slurm_signals_ranks(self.environ),
    )
    self.show_desk(desk)
    scope.watch(
        self.stop,
        lambda record: self.events.put(AbortSeen(stage, record)),
        lambda why: self.events.put(StoreLost(why)),
    )
    early = scope.failure()  # someone failed before our watcher started
    if early is not None:
        self.events.put(AbortSeen(stage, early))
    console = ConsoleView(plan.options, self.sinks)
    pace = _pace_watch(plan, scope, console, attempt, world, roster.nodes, self.metrics)
    sup.pace = pace
    warm = self.warm if self.warm is not None and self.warm.enabled else None
    warm = None if plan.options.cold else warm

    # Waited for here, where a stop signal still interrupts (not in the supervisor's start).
    zygote = warm.usable(self.environ, wait=WARM_WAIT) if warm is not None else None

    def start() -> list[workers.Worker]:
        started = self.spawn(
            specs,
            self.environ,
            console.router,
            prefix_for=console.prefix,
            console=console.shows,
            events=self.events,
            cwd=plan.cwd,
            warm=zygote,
        )
        if warm is not None:
            forked = sum(w.warm for w in started)
            if forked or warm.resident:
                log.info("attempt %d: %d of %d ranks forked warm", attempt, forked, len(started))
            if warm.resident or attempt < plan.options.max_restarts:
                warm.ensure(self.environ)  # for the next attempt or run, once ours started
        console.started(started)
        self.metrics.ranks_started(attempt, plan.world_size)
        return started

    try:
        with self.signals.queued():
            outcome = sup.run(start)
    finally:
        self.show_desk(None)
        _forget_dumps(sup)
        if self.world.agent_index == 0:
            desk.end()
        console.close()
    outcome.warnings += console.router.losses()
    outcome.progressed = console.router.progressed()
    if pace is not None and pace.leader:
        outcome.stragglers = pace.close()
    keep = self.warm.pids() if self.warm is not None else ()
    escaped = workers.reap_escaped(min(plan.options.grace, 5.0), keep)
    if escaped:
        outcome.warnings.append(
            f"{len(escaped)} process(es) left behind by ranks on {world.host} were cleaned up "
            f"(pids {', '.join(map(str, escaped[:20]))})"
        )
        log.warning("%s", outcome.warnings[-1])
    return outcome


def _hang_watch(plan: Any, scope: Scope, desk: StackDesk, attempt: int, w: World) -> Any:
    if plan.options.hang_timeout <= 0:
        return None
    return HangWatch(
        scope,
        desk,
        timeout=plan.options.hang_timeout,
        leader=w.agent_index == 0,
        log_dir=plan.log_dir,
        attempt=attempt,
        node_rank=w.node_rank,
        host=w.host,
    )


def _pace_watch(
    plan: Any,
    scope: Scope,
    console: ConsoleView,
    attempt: int,
    w: World,
    agents: Any,
    metrics: RunMetrics,
) -> PaceWatch | None:
    if plan.options.progress_regex is None:
        return None
    return PaceWatch(
        scope,
        console.router.clocks,
        agents=list(agents),
        agent=w.agent_index,
        node_rank=w.node_rank,
        host=w.host,
        factor=plan.options.straggler_factor,
        leader=w.agent_index == 0,
        attempt=attempt,
        metrics=metrics,
        on_look=console.pace_seen if console.live is not None else None,
    )


def _live(sup: Supervisor) -> list[tuple[int, int]]:
    workers = getattr(sup, "workers", [])
    return [(w.spec.rank, w.proc.pid) for w in workers if w.returncode is None]


def _forget_dumps(sup: Supervisor) -> None:
    """Warm ranks' faulthandler dump files (agent.hang.fallback) end with their ranks."""
    directory = private_dir()
    for worker in getattr(sup, "workers", []) if directory else ():
        with contextlib.suppress(OSError):
            os.unlink(fallback_path(directory, worker.proc.pid))
