"""What is running: one run's attempts on this node — lineup, ranks, results, the verdict.

Before each attempt every node checks its health and node 0 decides who runs (agent.run.lineup):
the roster's nodes start ranks (agent.run.attempt), spares stand by, the excluded leave. Node 0
judges each attempt (agent.run.verdict), restarts the world — a spare in a lost node's place —
or ends the run and writes summary.json; every node acts on node 0's verdict. Per-attempt keys
live in the scopes `r<run>/l<attempt>` and `r<run>/a<attempt>`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.console.view import Sinks
from agent.errors import ExitCode
from agent.hang.desk import StackDesk
from agent.metrics.recorder import RunMetrics
from agent.node import stage as stages
from agent.node.scope import Scope
from agent.node.signals import Signals
from agent.node.stage import Stage
from agent.plan.roster import Exclusion, Roster, Shortfall
from agent.plan.run_plan import RunPlan
from agent.run import outputs, workers
from agent.run.attempt import run_ranks
from agent.run.lineup import Lineup, await_key, seating
from agent.run.prepare import Prepared, replanned
from agent.run.roll_call import roll_call
from agent.run.summary import build_summary, job_record, render_report
from agent.run.supervisor import Outcome
from agent.run.verdict import Verdict, guard_loop, judge
from agent.run.warm_source import WarmSource
from agent.world import World

log = logging.getLogger("agent")


@dataclass
class Attempts:
    """Everything the attempts of one run need from the node agent that executes them."""

    world: World
    stage: Stage  # the run (its attempts: stage.at(k)); in every event and log line of it
    scope_of: Callable[[str], Scope]  # "a<k>" / "l<k>" → that scope of the run
    events: Any  # queue.SimpleQueue of supervisor events
    signals: Signals
    report: Callable[[Scope, dict[str, Any]], dict[str, Any] | None]  # any thread; None: lost
    enter: Callable[..., None]  # (scope, active peers → node rank): where failures go now
    serve_workers: Callable[[], int]  # node 0: a fresh store for one attempt's ranks
    close_workers: Callable[[], None]  # node 0: the last attempt's store closed (run's end)
    environ: Mapping[str, str]
    stop: threading.Event
    lost_results: Callable[[Scope], list[dict[str, Any]]]  # node 0: failures of lost nodes
    lost: Callable[[], Mapping[int, str]] = dict  # node 0: agents out of the job → why
    hosts: Callable[[], list[str]] = list  # node 0: every agent's host
    read_topology: Callable[[str], Any] | None = None  # a fresh look at the GPUs
    replan: Callable[[int], RunPlan] | None = None  # node 0: the plan for a smaller world
    warm: WarmSource | None = None  # where ranks are forked from (None: always fresh)
    sinks: Sinks | None = None  # a resident agent's run: console lines to its client
    show_desk: Callable[[StackDesk | None], None] = lambda desk: None  # for `agent stacks`
    spawn: Callable[..., list[workers.Worker]] = workers.spawn  # the scale bench fakes ranks
    roster: Roster | None = None  # who runs, waits, is out: the last lineup's
    seatings: list[dict[str, Any]] = field(default_factory=list)  # node 0: ranks.json
    metrics: RunMetrics = field(default_factory=RunMetrics)  # node 0's is read (--metrics-port)

    def execute(self, prepared: Prepared) -> int:
        try:
            return self._attempts(prepared)
        finally:
            self.close_workers()  # a run closes what it opened

    def _attempts(self, prepared: Prepared) -> int:
        world, me = self.world, self.world.agent_index
        leader = me == 0
        roster = self.roster or Roster.initial(world.agents, prepared.plan.options.spares)
        history: list[dict[str, Any]] = []
        attempt = 0
        while True:
            stages.enter(self.stage.at(attempt))
            self.metrics.attempt_started(attempt)
            lineup = roll_call(self, prepared, roster, attempt)
            self.roster = roster = lineup.roster
            if leader:
                self._seat(prepared, lineup, attempt)
            if lineup.end is not None:
                return self._end(prepared, history, lineup.end)
            if lineup.plan is not None:
                log.warning("attempt %d: the world is now %d node(s)", attempt, len(roster.nodes))
                prepared = replanned(prepared, lineup.plan, me)
            role = roster.role(me)
            if role == "out":
                why = next((e.why for e in roster.excluded if e.agent == me), "excluded")
                log.error("%s is out of the job: %s", world.host, why)
                self.enter(None)
                return int(ExitCode.OK)
            scope = self.scope_of(f"a{attempt}")
            outcome: Outcome | None = None
            if role == "spare":
                decision = self._stand_by(scope, prepared, attempt)
            else:
                active = {agent: rank for rank, agent in enumerate(roster.nodes)}
                self.enter(scope, active)
                outcome = run_ranks(self, prepared, scope, attempt, lineup.port, roster)
                if outcome.store_lost:
                    log.error("%s", outcome.store_lost)
                    return _signal_code(outcome) or int(ExitCode.RENDEZVOUS)
                scope.put(f"result/{me}", _result(outcome))
                if leader:
                    decision = self._decide(prepared, scope, attempt, roster, history, outcome)
                else:
                    decision = scope.get("verdict", "verdict")
            if decision.get("restart") and (outcome is None or outcome.signum is None):
                attempt += 1
                continue
            self.enter(None)
            return (_signal_code(outcome) if outcome else None) or int(decision["code"])

    def _decide(
        self,
        prepared: Prepared,
        scope: Scope,
        attempt: int,
        roster: Roster,
        history: list[dict[str, Any]],
        outcome: Outcome,
    ) -> dict[str, Any]:
        """Node 0: judge the attempt, tell everyone, write the summary when it is the last."""
        options = prepared.plan.options
        verdict, progressed = self._judge(scope, attempt, roster, options)
        if options.progress_regex is not None and not options.restart_without_progress:
            before = [bool(a.get("progressed")) for a in history]
            verdict = guard_loop(verdict, [*before, progressed])
        history.append(
            {
                **verdict.record,
                **_seated_record(self.seatings, attempt),
                "progressed": progressed,
                "stragglers": outcome.stragglers,
            }
        )
        decision = {"restart": verdict.restart, "code": verdict.code}
        ended = [(verdict.root_cause or {}).get("time"), *(e.end for e in outcome.exits)]
        self.metrics.attempt_ended(attempt, ended)
        if verdict.restart:
            log.warning(
                "attempt %d failed (%s); restarting the whole world (%d of %d)",
                attempt,
                (verdict.root_cause or {}).get("how"),
                attempt + 1,
                options.max_restarts,
            )
        else:
            self._summarise(prepared, history, verdict.code)
        scope.put("verdict", decision)
        scope.close()  # wakes every abort watcher of this attempt
        return decision

    def _judge(
        self, scope: Scope, attempt: int, roster: Roster, options: Any
    ) -> tuple[Verdict, bool]:
        """The verdict, and whether any rank made progress (a --progress-regex line)."""
        # Waits for every node's result; a lost node's is written by node 0's heartbeat monitor.
        results = scope.get_all([f"result/{i}" for i in roster.nodes], "result")
        failures = [r["failure"] for r in results if r.get("failure")]
        failures += self.lost_results(scope)
        lost = [a for a, r in zip(roster.nodes, results, strict=True) if r.get("lost")]
        verdict = judge(
            attempt, results, failures, options.max_restarts, _replaceable(roster, lost, options)
        )
        return verdict, any(r.get("progressed") for r in results)

    def _stand_by(self, scope: Scope, prepared: Prepared, attempt: int) -> dict[str, Any]:
        """A spare: no ranks; wait for the attempt's verdict (a signal or node 0's loss ends the
        wait at once), warm for the moment it takes a node's place."""
        self.enter(None)  # our own trouble now is a departure, never the attempt's failure
        log.info("attempt %d: %s stands by as a spare", attempt, self.world.host)
        warm = self.warm if self.warm is not None and self.warm.enabled else None
        if warm is not None and not prepared.plan.options.cold:
            warm.ensure(self.environ)
        # Failures are node 0's to judge; if node 0 itself goes, the store closes under the wait.
        await_key(scope, "verdict", self.events, fatal=lambda scope: None)
        return scope.get("verdict", "verdict")

    def _seat(self, prepared: Prepared, lineup: Lineup, attempt: int) -> None:
        plan = prepared.plan
        per_task = self.world.task is not None
        hosts = self.hosts()
        record = seating(lineup.roster, hosts, plan.nproc_per_node, attempt, per_task)
        self.metrics.lined_up(lineup.roster, hosts)
        self.seatings.append(record)
        outputs.write_ranks(plan.log_dir, self.seatings, plan.nproc_per_node, per_task)

    def _end(self, prepared: Prepared, history: list[dict[str, Any]], end: Mapping) -> int:
        """The lineup found no way on (too few nodes, node 0 unhealthy, a stop mid-round)."""
        code, cause = int(end["code"]), dict(end.get("cause") or {})
        log.error("the job cannot go on: %s", cause.get("how"))
        if self.world.agent_index == 0:
            attempt = len(history)
            history.append(
                {
                    "attempt": attempt,
                    "root_cause": cause,
                    "ranks": [],
                    **_seated_record(self.seatings, attempt),
                }
            )
            self._summarise(prepared, history, code)
        self.enter(None)
        return code

    def _summarise(self, prepared: Prepared, history: list[dict[str, Any]], code: int) -> None:
        job = job_record(self.world, prepared.plan)
        excluded = self.roster.excluded if self.roster else ()
        summary = build_summary(job, history, code, excluded=[e.to_json() for e in excluded])
        path = outputs.write_summary(prepared.plan.log_dir, summary)
        self.metrics.finished(code)
        shown = path or "not written (see above)"
        (log.info if code == 0 else log.error)("%s\nsummary: %s", render_report(summary), shown)


def _replaceable(roster: Roster, lost: list[int], options: Any) -> bool:
    """Whether a spare (or, with --min-nodes, a smaller world) can stand in for the lost."""
    try:
        roster.without([Exclusion(a, "", "lost", 0) for a in lost], options.min_nodes)
    except Shortfall:
        return False
    return True


def _seated_record(seatings: list[dict[str, Any]], attempt: int) -> dict[str, Any]:
    found = next((s for s in reversed(seatings) if s["attempt"] == attempt), None)
    return {k: v for k, v in (found or {}).items() if k != "attempt"}


def _result(outcome: Outcome) -> dict[str, Any]:
    return {
        "exits": [e.to_json() for e in outcome.exits],
        "signal": outcome.signum,
        "refused": outcome.refused,
        "warnings": outcome.warnings,
        "failure": outcome.failure,
        "progressed": outcome.progressed,
    }


def _signal_code(outcome: Outcome) -> int | None:
    return 128 + outcome.signum if outcome.signum else None
