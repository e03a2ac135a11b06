"""What is running: one run's attempts on this node — lineup, ranks, results, the verdict.

Before each attempt every node checks its health and node 0 decides who runs (agent.run.roll_call):
the roster's nodes start ranks (agent.run.attempt), spares stand by, the excluded leave. Node 0
judges each attempt (agent.run.verdict), restarts the world — a spare in a lost node's place —
or ends the run and writes summary.json; every node acts on node 0's verdict. Per-attempt keys
live in the scopes `r<run>/l<attempt>` and `r<run>/a<attempt>`.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.errors import ExitCode
from agent.hang.desk import StackDesk
from agent.hang.fallback import private_dir
from agent.hang.nccl_dumps import dump_findings
from agent.hang.recorder import with_probe
from agent.metrics.recorder import RunMetrics
from agent.node import stage as stages
from agent.node.result import Result
from agent.node.scope import Scope
from agent.node.seat import RunSeat
from agent.node.stage import Stage
from agent.pause.desk import PauseDesk
from agent.plan.options import Options
from agent.plan.roster import Exclusion, Roster, Shortfall
from agent.run import outputs
from agent.run.attempt import NodeAttempt
from agent.run.bounded_wait import await_verdict, results_with_own
from agent.run.checkpoint_dir import location, newest_after, write_marker
from agent.run.coordinator import Coordination, Coordinator
from agent.run.decision import Decision
from agent.run.failure_class import AttemptFailure
from agent.run.leftovers import Leftovers
from agent.run.lineup import Lineup, LineupEnd, seating
from agent.run.preemption import Preemption, furthest_step, judge_stop
from agent.run.prepare import Prepared, replanned
from agent.run.roll_call import RollCall
from agent.run.summary import build_summary, job_record, render_report
from agent.run.supervisor import Outcome
from agent.run.tools import RunTools
from agent.run.verdict import Budget, Verdict, guard_loop, judge, with_collectives

log = logging.getLogger("agent")


@dataclass(frozen=True)
class RunResult:
    code: int  # the run's exit code on this node
    roster: Roster | None  # who ran, waited or was out at its end


class Run:
    """One run's attempts on this node, through its node's seat; node 0 also judges them."""

    def __init__(
        self,
        seat: RunSeat,
        stage: Stage,
        prepared: Prepared,
        tools: RunTools,
        roster: Roster | None = None,  # the session's (resident: earlier runs' exclusions hold)
        metrics: RunMetrics | None = None,  # node 0's is read (--metrics-port); else silent
    ) -> None:
        self.seat, self.stage, self.prepared, self.tools = seat, stage, prepared, tools
        self.roster = roster
        self.metrics = metrics if metrics is not None else RunMetrics()
        self.started = time.time()  # a stop signal before it was not this run's
        # A client's env over the node's; the flight-recorder probe's for the ranks and the zygote.
        environ = {**seat.environ, **(prepared.plan.env or {})}
        probes = private_dir() if prepared.plan.options.flight_recorder else None
        self.environ = with_probe(environ, probes)
        self.seatings: list[dict[str, Any]] = []  # node 0: ranks.json
        self.attempt: NodeAttempt | None = None  # this node's share of the running attempt
        self.coordinator: Coordinator | None = None  # node 0: the attempt's job services
        # This node's GPUs still held after its last attempt: its next health check says so.
        self.held: Leftovers | None = None
        # Out for the rest of the job: nodes excluded in earlier runs (resident).
        self._excluded = {e.agent: e.why for e in roster.excluded} if roster else {}

    @property
    def desk(self) -> StackDesk | None:
        """Node 0: the attempt's stacks desk, from its lineup to its verdict (None between)."""
        coordinator = self.coordinator
        return coordinator.desk if coordinator is not None and coordinator.serving else None

    @property
    def pauses(self) -> PauseDesk | None:
        """Node 0: the attempt's paused ranks, from its lineup to its verdict (None between)."""
        coordinator = self.coordinator
        return coordinator.pauses if coordinator is not None and coordinator.serving else None

    def ended_ranks(self) -> dict[int, int]:
        """Node 0: the attempt's ranks that exited → their exit codes, as the nodes said."""
        coordinator = self.coordinator
        if coordinator is None or not coordinator.serving:
            return {}
        standings = list(coordinator.standings.values())
        return {e.rank: e.returncode for s in standings for e in s.ended}

    def lost(self) -> dict[int, str]:
        """Node 0: agents out of the job → why (excluded earlier, or lost)."""
        return {**self._excluded, **self.seat.lost()}

    def execute(self) -> RunResult:
        try:
            code = self._attempts(self.prepared)
        finally:
            self.seat.close_workers()  # a run closes what it opened
        return RunResult(code, self.roster)

    def _scope(self, name: str) -> Scope:
        """`a<k>` / `l<k>` → that scope of the run."""
        return self.seat.scope(f"{self.stage.scope()}/{name}", wakes=_WAKES[name[0]])

    def _attempts(self, prepared: Prepared) -> int:
        seat, world = self.seat, self.seat.world
        me, leader = world.agent_index, seat.leader
        roster = self.roster or Roster.initial(world.agents, prepared.plan.options.spares)
        history: list[dict[str, Any]] = []
        failed: list[AttemptFailure | None] = []  # node 0: how each attempt failed (restarts)
        attempt = 0
        while True:
            stages.enter(self.stage.at(attempt))
            self.metrics.attempt_started(attempt)
            rounds = self._scope(f"l{attempt}")
            call = RollCall(seat, self.tools, prepared, roster, attempt, rounds, self.held)
            lineup = call.lineup(self.lost)
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
                seat.enter(None)
                return int(ExitCode.OK)
            scope = self._scope(f"a{attempt}")
            outcome: Outcome | None = None
            if role == "spare":
                decision = self._stand_by(scope, prepared, attempt)
            else:
                # Only node 0 reports lost peers: the others need no map of N nodes.
                seat.enter(scope, roster.ranks_by_agent() if leader else None)
                coordinator = (
                    self._coordinator(prepared, scope, attempt, roster) if leader else None
                )
                self.coordinator = coordinator
                try:
                    self.attempt = NodeAttempt(
                        seat,
                        self.tools,
                        self.stage.at(attempt),
                        prepared,
                        scope,
                        self.environ,
                        self.metrics,
                        coordinator,
                    )
                    outcome = self.attempt.run(lineup.ranks_store, roster)
                    left = outcome.leftovers
                    self.held = left if left is not None and left.unusable else None
                    if outcome.store_lost:
                        log.error("%s", outcome.store_lost)
                        return _signal_code(outcome) or int(ExitCode.RENDEZVOUS)
                    result = _result(outcome)
                    scope.put(f"result/{me}", result.to_json())
                    if coordinator is not None:
                        decision = self._decide(
                            prepared, scope, attempt, roster, history, failed, outcome, coordinator
                        )
                    else:
                        own = (f"result/{me}", result.to_json())
                        decision = Decision.from_json(
                            await_verdict(scope, seat.events, own, len(roster.nodes))
                        )
                finally:
                    if coordinator is not None:
                        coordinator.close()
            if decision.restart and (outcome is None or outcome.signum is None):
                attempt += 1
                continue
            seat.enter(None)
            return (_signal_code(outcome) if outcome else None) or decision.code

    def _decide(
        self,
        prepared: Prepared,
        scope: Scope,
        attempt: int,
        roster: Roster,
        history: list[dict[str, Any]],
        failed: list[AttemptFailure | None],
        outcome: Outcome,
        coordinator: Coordinator,
    ) -> Decision:
        """Node 0: judge the attempt, tell everyone, write the summary when it is the last."""
        options = prepared.plan.options
        verdict, progressed, done, step = self._judge(
            scope, attempt, roster, prepared, failed, _result(outcome), coordinator
        )
        exits = {
            e["rank"]: e["returncode"]
            for e in verdict.record["ranks"]
            if e["rank"] >= 0 and isinstance(e.get("returncode"), int)
        }
        view = dump_findings(prepared.plan.log_dir, attempt, exits)
        if view:
            log.error("NCCL's flight-recorder dumps: %s", "; ".join(view))
            verdict = with_collectives(verdict, view)
        failed.append(verdict.failure)
        if options.progress_regex is not None and not options.restart_without_progress:
            before = [bool(a.get("progressed")) for a in history]
            verdict = guard_loop(verdict, [*before, progressed])
        history.append(
            {
                **verdict.record,
                **_seated_record(self.seatings, attempt),
                "progressed": progressed,
                "stragglers": done.stragglers,
                **({"exit_skew": done.exit_skew} if done.exit_skew else {}),
            }
        )
        decision = Decision(verdict.restart, verdict.code)
        cause = verdict.root_cause.time if verdict.root_cause else None
        self.metrics.attempt_ended(attempt, cause, [e.get("end") for e in verdict.record["ranks"]])
        if verdict.restart and verdict.failure is not None:
            kind = verdict.failure.failure_class
            spent = sum(1 for f in failed if f is not None and f.failure_class is kind)
            log.warning(
                "attempt %d failed (%s: %s); restarting the whole world (%s restart %d of %d)",
                attempt,
                kind.value,
                verdict.root_cause.line() if verdict.root_cause else None,
                kind.value,
                spent,
                _budget(options).of(kind),
            )
            summary = None
        else:
            stop = self._preemption(prepared, verdict.record["ranks"], step)
            summary = self._summarise(prepared, history, verdict.code, stop)
        scope.put_again("verdict", decision.to_json(), 1)  # and a first copy the nodes block on
        scope.close()  # wakes every abort watcher of this attempt
        if summary is not None:  # bookkeeping no node waits for
            outputs.record_history(prepared.plan.log_dir, summary)
        return decision

    def _judge(
        self,
        scope: Scope,
        attempt: int,
        roster: Roster,
        prepared: Prepared,
        failed: list[AttemptFailure | None],
        mine: Result,
        coordinator: Coordinator,
    ) -> tuple[Verdict, bool, Coordination, int | None]:
        """The verdict, whether any rank made progress (a --progress-regex line), what the
        coordinator saw (it serves until every result is in), and the furthest step named."""
        # Waits for every node's result; a lost node's is written by node 0's heartbeat monitor.
        me = self.seat.world.agent_index
        read = results_with_own(scope, list(roster.nodes), me, mine.to_json())
        results = [Result.from_json(r) for r in read]
        done = coordinator.close()
        failures = [r.failure for r in results if r.failure is not None]
        failures += self.seat.lost_failures(scope)
        if done.failure is not None:
            failures.append(done.failure)
        lost = [a for a, r in zip(roster.nodes, results, strict=True) if r.lost]
        options = prepared.plan.options
        replaceable = _replaceable(roster, lost, options)
        budget = _budget(options)
        script = prepared.plan.script
        verdict = judge(attempt, results, failures, budget, replaceable, failed, script)
        progressed = any(r.progressed for r in results)
        return verdict, progressed, done, furthest_step(results)

    def _preemption(
        self, prepared: Prepared, ranks: Sequence[Mapping[str, Any]], step: int | None
    ) -> Preemption | None:
        """Node 0, the run's end, with --checkpoint-dir: the stop for preemption, when the
        signal reached this agent during the run (None: it did not)."""
        options, directory = prepared.plan.options, location(prepared.plan)
        if directory is None or options.checkpoint_dir is None:
            return None
        signum = signal.Signals[f"SIG{options.preempt_signal}"]
        arrived = self.seat.signals.first_since(signum, self.started)
        if arrived is None:
            return None
        written = newest_after(directory, arrived, shown=options.checkpoint_dir)
        return judge_stop(signum.name, arrived, step, options.checkpoint_dir, written, ranks)

    def _coordinator(
        self, prepared: Prepared, scope: Scope, attempt: int, roster: Roster
    ) -> Coordinator:
        world = self.seat.world
        return Coordinator(
            scope,
            nodes=roster.nodes,
            options=prepared.plan.options,
            log_dir=prepared.plan.log_dir,
            attempt=attempt,
            node_rank=world.node_rank,
            host=world.host,
            report=lambda record: self.seat.report(scope, record),
            metrics=self.metrics,
        )

    def _stand_by(self, scope: Scope, prepared: Prepared, attempt: int) -> Decision:
        """A spare: no ranks; wait for the attempt's verdict (a signal or node 0's loss ends the
        wait at once), warm for the moment it takes a node's place."""
        self.seat.enter(None)  # our own trouble now is a departure, never the attempt's failure
        log.info("attempt %d: %s stands by as a spare", attempt, self.seat.world.host)
        warm = self.tools.warm_enabled
        if warm is not None and not prepared.plan.options.cold:
            warm.ensure(self.environ)
        # Failures are node 0's to judge; if node 0 itself goes, the store closes under the wait.
        nodes = len(self.roster.nodes) if self.roster else 1
        return Decision.from_json(await_verdict(scope, self.seat.events, None, nodes))

    def _seat(self, prepared: Prepared, lineup: Lineup, attempt: int) -> None:
        plan = prepared.plan
        per_task = self.seat.world.task is not None
        hosts = self.seat.hosts()
        record = seating(lineup.roster, hosts, plan.nproc_per_node, attempt, per_task)
        self.metrics.lined_up(lineup.roster, hosts)
        self.seatings.append(record)
        outputs.write_ranks(plan.log_dir, self.seatings, plan.nproc_per_node, per_task)

    def _end(self, prepared: Prepared, history: list[dict[str, Any]], end: LineupEnd) -> int:
        """The lineup found no way on (too few nodes, node 0 unhealthy, a stop mid-round)."""
        code, cause = end.code, end.cause
        log.error("the job cannot go on: %s", cause.how if cause else None)
        if self.seat.leader:
            attempt = len(history)
            history.append(
                {
                    "attempt": attempt,
                    "root_cause": cause.to_json() if cause else {},
                    "ranks": [],
                    **_seated_record(self.seatings, attempt),
                }
            )
            summary = self._summarise(prepared, history, code, self._preemption(prepared, [], None))
            outputs.record_history(prepared.plan.log_dir, summary)
        self.seat.enter(None)
        return code

    def _summarise(
        self,
        prepared: Prepared,
        history: list[dict[str, Any]],
        code: int,
        stop: Preemption | None = None,
    ) -> dict[str, Any]:
        """summary.json written and reported; the summary, for the history (record_history)."""
        plan = prepared.plan
        job = job_record(self.seat.world, plan)
        excluded = self.roster.excluded if self.roster else ()
        summary = build_summary(job, history, code, excluded=[e.to_json() for e in excluded])
        if stop is not None:
            summary["preemption"] = stop.to_json()
            log.warning("the stop for preemption: %s", stop.details())
        directory = location(plan)
        if directory is not None:  # the next job with this dir reads it
            write_marker(directory, plan.run_id, stop)
        path = outputs.write_summary(prepared.plan.log_dir, summary)
        self.metrics.finished(code)
        shown = path or "not written (see above)"
        (log.info if code == 0 else log.error)("%s\nsummary: %s", render_report(summary), shown)
        return summary


def _budget(options: Options) -> Budget:
    return Budget(options.max_restarts, options.max_infra_restarts, options.restart_same_failure)


def _replaceable(roster: Roster, lost: list[int], options: Options) -> bool:
    """Whether a spare (or, with --min-nodes, a smaller world) can stand in for the lost."""
    try:
        roster.without([Exclusion(a, "", "lost", 0) for a in lost], options.min_nodes)
    except Shortfall:
        return False
    return True


def _seated_record(seatings: list[dict[str, Any]], attempt: int) -> dict[str, Any]:
    found = next((s for s in reversed(seatings) if s["attempt"] == attempt), None)
    return {k: v for k, v in (found or {}).items() if k != "attempt"}


def _result(outcome: Outcome) -> Result:
    return Result(
        exits=tuple(e.to_json() for e in outcome.exits),
        signal=outcome.signum,
        refused=outcome.refused,
        warnings=tuple(outcome.warnings),
        failure=outcome.failure,
        progressed=outcome.progressed,
        leftovers=_audit_news(outcome.leftovers),
        step=outcome.step,
    )


def _audit_news(leftovers: Leftovers | None) -> dict[str, Any] | None:
    """A node's audit, for its result when it ended or found something."""
    if leftovers is None or not (leftovers.killed or leftovers.stays):
        return None
    return leftovers.to_json()


# Keys a failure in a run's scope sets, to wake who waits on them: an attempt's (`a<k>`) have
# watchers of their own; a lineup round's (`l<k>`) node 0 waits for the last health report.
_WAKES = {"a": (), "l": ("health-done",)}


def _signal_code(outcome: Outcome) -> int | None:
    return 128 + outcome.signum if outcome.signum else None
