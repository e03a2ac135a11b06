"""This node's share of one attempt: its ranks started (forked warm where it can), supervised
until the attempt ends anywhere, and what they left behind cleaned up. On node 0 the attempt's
desks are handed to the job's coordinator (agent.run.coordinator), which serves them until the
verdict, whatever this node's own ranks do."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Mapping

from agent.console import top
from agent.console.view import ConsoleView
from agent.hang.collective_watch import CollectiveWatch
from agent.hang.desk import StackDesk
from agent.hang.fallback import fallback_path, private_dir
from agent.hang.recorder import forget
from agent.hang.watch import RECHECK_DESK, HangWatch
from agent.metrics.recorder import RunMetrics
from agent.node.events import AbortSeen, StoreLost
from agent.node.ranks_store import RanksStore
from agent.node.scope import Scope
from agent.node.seat import RunSeat
from agent.node.stage import Stage
from agent.pause.desk import PauseDesk
from agent.pause.paused import console_line
from agent.plan.rank_set import format_ranges
from agent.plan.roster import Roster, seated
from agent.plan.run_plan import seat_specs
from agent.run import workers
from agent.run.coordinator import Coordinator
from agent.run.leftovers import MARKER, node_audit
from agent.run.pace import PaceWatch
from agent.run.prepare import Prepared
from agent.run.supervisor import Outcome, Supervisor
from agent.run.tools import RunTools
from agent.world.proctrack import slurm_signals_ranks

log = logging.getLogger("agent")
WARM_WAIT = 120.0  # seconds a run waits for a warm interpreter that is still importing


class NodeAttempt:
    """This node's share of one attempt of a run."""

    def __init__(
        self,
        seat: RunSeat,
        tools: RunTools,
        stage: Stage,  # the run and this attempt
        prepared: Prepared,
        scope: Scope,  # the attempt's keys (r<run>/a<attempt>)
        environ: Mapping[str, str],  # the ranks' base env
        metrics: RunMetrics,  # node 0's numbers of the run (silent elsewhere)
        coordinator: Coordinator | None = None,  # node 0: the job's services for the attempt
    ) -> None:
        assert stage.attempt is not None, "an attempt's stage names it"
        self.seat, self.tools, self.stage, self.number = seat, tools, stage, stage.attempt
        self.prepared, self.scope, self.environ = prepared, scope, environ
        self.metrics, self.coordinator = metrics, coordinator

    def run(self, ranks_store: RanksStore, roster: Roster) -> Outcome:
        """Start this node's ranks, supervise them until the attempt ends anywhere, clean up."""
        seat, tools, scope, stage = self.seat, self.tools, self.scope, self.stage
        attempt = self.number
        plan, world = self.prepared.plan, seated(seat.world, roster)
        specs = seat_specs(
            plan,
            seat.world,
            roster,
            self.prepared.topology,
            attempt=attempt,
            port=ranks_store.port,
            agent_store=ranks_store.agent_store,
            config_file=self.prepared.config_file,
            environ=self.environ,
        )
        ranks = [s.rank for s in specs]
        log.info(
            "attempt %d: starting ranks %s on %s",
            attempt,
            format_ranges(ranks) or "none",
            world.host,
        )
        desk = StackDesk(scope, roster.nodes, world.host, lambda: _live(sup), private_dir(), stage)
        desk.start()
        console = ConsoleView(plan.options, tools.sinks)
        pauses = PauseDesk(
            scope,
            desk,
            world.host,
            private_dir(),
            stage,
            lambda paused, pid: console.note(console_line(paused, plan.log_dir, pid)),
        )
        pauses.start()
        console.show_paused(pauses.paused_ranks)
        sup = Supervisor(
            specs,
            stage=stage,
            events=seat.events,
            report=lambda record: seat.report(scope, record),
            grace=plan.options.grace,
            hang_warning=plan.options.hang_warning,
            hang=HangWatch(
                scope,
                agent=seat.world.agent_index,  # a seated world's index is its node rank
                node_rank=world.node_rank,
                host=world.host,
                timeout=plan.options.hang_timeout,
                paused=pauses.paused,
            ),
            slurm_signals_ranks=slurm_signals_ranks(self.environ),
            paused=pauses.paused_ranks,
        )
        # node 0 asks before it calls a hang: this node's standing as of that moment
        desk.relays[RECHECK_DESK] = lambda number, request: sup.hang.recheck(sup.quiet_for())
        # `agent top`: this node's rows at once, measured on the stacks thread (no py-spy)
        sampler = top.RankSampler(plan.options.hang_warning)
        clocks = console.router.clocks if console.router.numbers_steps else None

        def top_rows(number: int, request: dict) -> dict:
            found = list(getattr(sup, "workers", []))
            rows = sampler.rows(
                found, time.monotonic(), pauses.paused_ranks(), clocks() if clocks else None
            )
            return top.answer(rows, len(found))

        desk.relays[top.DESK] = top_rows
        probes = private_dir() if plan.options.flight_recorder else None
        collectives = (
            CollectiveWatch(probes, lambda: _live(sup), sup.silent_for, sup.hang.overdue)
            if probes
            else None
        )
        if self.coordinator is not None:
            on_look = console.pace_seen if console.live is not None else None
            self.coordinator.begin(desk, pauses, on_look)
            console.show_job(self.coordinator.job_line)
            self.coordinator.when_closed(console.end_table)
        scope.watch(
            seat.stop,
            lambda record: seat.events.put(AbortSeen(stage, record)),
            lambda why: seat.events.put(StoreLost(why)),
        )
        early = scope.failure()  # someone failed before our watcher started
        if early is not None:
            seat.events.put(AbortSeen(stage, early))
        if plan.options.progress_regex is not None:
            sup.pace = PaceWatch(
                scope,
                console.router.clocks,
                agent=seat.world.agent_index,  # a seated world's index is its node rank
                node_rank=world.node_rank,
                host=world.host,
            )
        warm = None if plan.options.cold else tools.warm_enabled

        # Waited for here, where a stop signal still interrupts (not in the supervisor's start).
        zygote = warm.usable(self.environ, wait=WARM_WAIT) if warm is not None else None

        def start() -> list[workers.Worker]:
            started = tools.spawn(
                specs,
                {**self.environ, **pauses.env()},
                console.router,
                prefix_for=console.prefix,
                console=console.shows,
                events=seat.events,
                cwd=plan.cwd,
                warm=zygote,
            )
            if warm is not None:
                if warm.resident:
                    warm.ahead = len(started)
                forked = sum(w.warm for w in started)
                ahead = sum(w.ahead for w in started)
                if forked or warm.resident:
                    log.info(
                        "attempt %d: %d of %d ranks forked warm%s",
                        attempt,
                        forked,
                        len(started),
                        f" ({ahead} forked ahead of the run)" if ahead else "",
                    )
                # Prepared for the restarts the user asked for (--max-restarts), not for the
                # default infrastructure budget: that would cost every node of every one-shot
                # job a torch import in the background (and the teardown its end) for a rare
                # lost node or hang, which restarts cold.
                if warm.resident or attempt < plan.options.max_restarts:
                    warm.ensure(self.environ)  # for the next attempt or run, once ours started
            console.started(started)
            self.metrics.ranks_started(attempt, plan.world_size)
            return started

        if collectives is not None:
            collectives.start()
        try:
            with seat.signals.queued():
                outcome = sup.run(start)
        finally:
            if collectives is not None:
                collectives.stop()
            pauses.close()  # this node's paused ranks are gone; node 0 still relays for others
            _forget_dumps(sup)
            # node 0's table stays up until the verdict (the coordinator's close ends it)
            console.close(keep_table=self.coordinator is not None)
        outcome.warnings += console.router.losses()
        outcome.progressed = console.router.progressed()
        steps = [c.step for c in console.router.clocks().values() if c.step is not None]
        outcome.step = max(steps) if steps else None
        keep = tools.warm.pids() if tools.warm is not None else ()
        marker = specs[0].env.get(MARKER) if specs else None
        audit = node_audit(world.host, marker, self.environ)
        outcome.leftovers = left = audit.run(min(plan.options.grace, 5.0), keep)
        if left.killed:
            pids = ", ".join(str(h.pid) for h in left.killed[:20])
            outcome.warnings.append(
                f"{len(left.killed)} process(es) left behind by ranks on {world.host} were "
                f"cleaned up (pids {pids})"
            )
            log.warning("%s", outcome.warnings[-1])
        for holder in left.stays[:20]:
            outcome.warnings.append(f"still on {world.host} after the attempt: {holder.line()}")
            log.warning("%s", outcome.warnings[-1])
        if left.unusable:
            log.error("%s: %s; it cannot run another attempt", world.host, left.reason())
        return outcome


def _live(sup: Supervisor) -> list[tuple[int, int]]:
    workers = getattr(sup, "workers", [])
    return [(w.spec.rank, w.proc.pid) for w in workers if w.returncode is None]


def _forget_dumps(sup: Supervisor) -> None:
    """Warm ranks' faulthandler dump files (agent.hang.fallback) and every rank's probe socket
    (agent.hang.recorder) end with their ranks."""
    directory = private_dir()
    pids = [worker.proc.pid for worker in getattr(sup, "workers", [])]
    for pid in pids:
        if directory is not None:
            with contextlib.suppress(OSError):
                os.unlink(fallback_path(directory, pid))
    forget(directory, pids)
