"""What is running: one run's attempts on this node — ranks, supervision, results, the verdict.

Node 0 judges each attempt (agent.run.verdict), restarts the whole world or ends the run, and
writes summary.json; every node acts on node 0's verdict. Per-attempt keys live in the scope
`r<run>/a<attempt>`, so runs and attempts never see each other's records.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.console.view import ConsoleView, Sinks
from agent.errors import ExitCode
from agent.hang.desk import StackDesk
from agent.hang.fallback import fallback_path, private_dir
from agent.hang.watch import HangWatch
from agent.node.scope import Scope
from agent.node.signals import Signals
from agent.plan.run_plan import rank_specs
from agent.run import outputs, workers
from agent.run.prepare import Prepared
from agent.run.summary import build_summary, job_record, render_report
from agent.run.supervisor import AbortSeen, Outcome, StoreLost, Supervisor
from agent.run.verdict import Verdict, judge
from agent.run.warm_source import WarmSource
from agent.world import World

log = logging.getLogger("agent")
WARM_WAIT = 120.0  # seconds a run waits for a warm interpreter that is still importing


@dataclass
class Attempts:
    """Everything the attempts of one run need from the node agent that executes them."""

    world: World
    scope_of: Callable[[int], Scope]  # attempt → its scope over the main connection
    events: Any  # queue.SimpleQueue of supervisor events
    signals: Signals
    report: Callable[[Scope, dict[str, Any]], dict[str, Any] | None]  # any thread; None: lost
    enter: Callable[[Scope | None], None]  # the scope a farewell reports into
    serve_workers: Callable[[], int]  # node 0: a fresh store for one attempt's ranks
    environ: Mapping[str, str]
    stop: threading.Event
    lost_results: Callable[[Scope], list[dict[str, Any]]]  # node 0: failures of lost nodes
    warm: WarmSource | None = None  # where ranks are forked from (None: always fresh)
    sinks: Sinks | None = None  # a resident agent's run: console lines to its client
    show_desk: Callable[[StackDesk | None], None] = lambda desk: None  # for `agent stacks`

    def execute(self, prepared: Prepared) -> int:
        plan, world = prepared.plan, self.world
        leader = world.agent_index == 0
        port = self._publish_port(0) if leader else 0  # node 0 uses what it decided itself
        history: list[dict[str, Any]] = []
        attempt = 0
        while True:
            scope = self.scope_of(attempt)
            self.enter(scope)
            if not leader:
                port = int(scope.get("port", "worker port")["port"])
            outcome = self._supervise(prepared, scope, attempt, port)
            if outcome.store_lost:
                log.error("%s", outcome.store_lost)
                return _signal_code(outcome) or int(ExitCode.RENDEZVOUS)
            scope.put(f"result/{world.agent_index}", _result(outcome))
            if leader:
                verdict = self._judge(scope, attempt, plan.options.max_restarts)
                history.append(dict(verdict.record))
                decision = {"restart": verdict.restart, "code": verdict.code}
                if verdict.restart:
                    port = self._publish_port(attempt + 1)
                    log.warning(
                        "attempt %d failed (%s); restarting the whole world (%d of %d)",
                        attempt,
                        (verdict.root_cause or {}).get("how"),
                        attempt + 1,
                        plan.options.max_restarts,
                    )
                else:
                    self._summarise(prepared, history, verdict.code)
                scope.put("verdict", decision)
                scope.close()  # wakes every abort watcher of this attempt
            else:
                decision = scope.get("verdict", "verdict")
            if decision.get("restart") and outcome.signum is None:
                attempt += 1
                continue
            self.enter(None)
            return _signal_code(outcome) or int(decision["code"])

    def _publish_port(self, attempt: int) -> int:
        port = self.serve_workers()
        self.scope_of(attempt).put("port", {"port": port})
        return port

    def _supervise(self, prepared: Prepared, scope: Scope, attempt: int, port: int) -> Outcome:
        world, plan = self.world, prepared.plan
        specs = rank_specs(
            plan,
            world,
            prepared.layout,
            attempt=attempt,
            port=port,
            config_file=prepared.config_file,
            environ=self.environ,
        )
        ranks = [s.rank for s in specs]
        log.info("attempt %d: starting ranks %s on %s", attempt, _span(ranks), world.host)
        desk = StackDesk(scope, world.agents, world.host, lambda: _live(sup), private_dir())
        desk.start()
        sup = Supervisor(
            specs,
            attempt=attempt,
            events=self.events,
            report=lambda record: self.report(scope, record),
            grace=plan.options.grace,
            hang_warning=plan.options.hang_warning,
            hang=self._hang_watch(plan, scope, desk, attempt),
        )
        self.show_desk(desk)
        scope.watch(
            self.stop,
            lambda record: self.events.put(AbortSeen(attempt, record)),
            lambda why: self.events.put(StoreLost(why)),
        )
        early = scope.failure()  # someone failed before our watcher started
        if early is not None:
            self.events.put(AbortSeen(attempt, early))
        console = ConsoleView(plan.options, self.sinks)
        warm = self.warm if self.warm is not None and self.warm.enabled else None
        warm = None if plan.options.cold else warm

        # Waited for here, where a stop signal still interrupts (not in the supervisor's start).
        zygote = warm.usable(self.environ, wait=WARM_WAIT) if warm is not None else None

        def start() -> list[workers.Worker]:
            started = workers.spawn(
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
                    log.info(
                        "attempt %d: %d of %d ranks forked warm", attempt, forked, len(started)
                    )
                if warm.resident or attempt < plan.options.max_restarts:
                    warm.ensure(self.environ)  # for the next attempt or run, once ours started
            console.started(started)
            return started

        try:
            with self.signals.queued():
                outcome = sup.run(start)
        finally:
            self.show_desk(None)
            _forget_dumps(sup)
            if world.agent_index == 0:
                desk.end()
            console.close()
        outcome.warnings += console.router.losses()
        keep = self.warm.pids() if self.warm is not None else ()
        escaped = workers.reap_escaped(min(plan.options.grace, 5.0), keep)
        if escaped:
            outcome.warnings.append(
                f"{len(escaped)} process(es) left behind by ranks on {world.host} were cleaned up "
                f"(pids {', '.join(map(str, escaped[:20]))})"
            )
            log.warning("%s", outcome.warnings[-1])
        return outcome

    def _hang_watch(self, plan: Any, scope: Scope, desk: StackDesk, attempt: int) -> Any:
        if plan.options.hang_timeout <= 0:
            return None
        w = self.world
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

    def _judge(self, scope: Scope, attempt: int, max_restarts: int) -> Verdict:
        # Waits for every node's result; a lost node's is written by node 0's heartbeat monitor.
        results = scope.get_all([f"result/{i}" for i in range(self.world.agents)], "result")
        failures = [r["failure"] for r in results if r.get("failure")]
        failures += self.lost_results(scope)
        return judge(attempt, results, failures, max_restarts)

    def _summarise(self, prepared: Prepared, history: list[dict[str, Any]], code: int) -> None:
        job = job_record(self.world, prepared.plan)
        summary = build_summary(job, history, code)
        path = outputs.write_summary(prepared.plan.log_dir, summary)
        shown = path or "not written (see above)"
        (log.info if code == 0 else log.error)("%s\nsummary: %s", render_report(summary), shown)


def _live(sup: Supervisor) -> list[tuple[int, int]]:
    workers = getattr(sup, "workers", [])
    return [(w.spec.rank, w.proc.pid) for w in workers if w.returncode is None]


def _forget_dumps(sup: Supervisor) -> None:
    """Warm ranks' faulthandler dump files (agent.hang.fallback) end with their ranks."""
    directory = private_dir()
    for worker in getattr(sup, "workers", []) if directory else ():
        with contextlib.suppress(OSError):
            os.unlink(fallback_path(directory, worker.proc.pid))


def _result(outcome: Outcome) -> dict[str, Any]:
    return {
        "exits": [e.to_json() for e in outcome.exits],
        "signal": outcome.signum,
        "refused": outcome.refused,
        "warnings": outcome.warnings,
        "failure": outcome.failure,
    }


def _signal_code(outcome: Outcome) -> int | None:
    return 128 + outcome.signum if outcome.signum else None


def _span(ranks: list[int]) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0]) if ranks else "none"
