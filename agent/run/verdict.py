"""The verdict on one attempt (pure): every node's result → exit code, restart or not, root cause."""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agent.errors import ExitCode
from agent.node.failure import Failure, Kind
from agent.node.result import Result
from agent.run.failure_class import AttemptFailure, FailureClass, classify
from agent.run.summary import RankExit


@dataclass(frozen=True)
class Verdict:
    code: int
    restart: bool
    root_cause: Failure | None
    record: Mapping[str, Any]  # this attempt in summary.json: root cause, ranks, lost nodes
    failure: AttemptFailure | None = None  # how it failed: program or infrastructure (None: ok)


@dataclass(frozen=True)
class Budget:
    """The restarts a run may spend: `--max-restarts` on program failures,
    `--max-infra-restarts` on infrastructure ones; `--restart-same-failure` lets a run restart
    after the same program failure twice in a row."""

    max_restarts: int = 0
    max_infra_restarts: int = 3
    restart_same_failure: bool = False

    def of(self, failure_class: FailureClass) -> int:
        return (
            self.max_restarts if failure_class is FailureClass.PROGRAM else self.max_infra_restarts
        )


def root_cause(failures: Sequence[Failure]) -> Failure | None:
    """The failure the store saw first (lowest sequence number); the rest are consequences."""
    ranked = [f for f in failures if not f.closed]
    return min(ranked, key=lambda f: f.seq if f.seq is not None else math.inf) if ranked else None


def judge(
    attempt: int,
    results: Sequence[Result],
    failures: Sequence[Failure],
    budget: Budget,
    replaceable: bool = False,
    earlier: Sequence[AttemptFailure | None] = (),
    script: str = "",
) -> Verdict:
    """`results`: one per node (how its ranks ended, or that node 0 declared it lost);
    `failures`: every failure record published in this attempt;
    `replaceable`: a spare (or a smaller world) can stand in for the lost nodes; `earlier`:
    how the run's earlier attempts failed, in order (each one was restarted); `script`: the
    run's, named by a failure without a traceback."""
    cause = root_cause(failures)
    ranks = [dict(e) for r in results for e in r.exits]
    lost = [r for r in results if r.lost]
    for r in lost:
        node, host = -1 if r.node is None else r.node, r.host or ""
        gone = RankExit(-1, -1, node, host, None, None, "lost", 0.0, None, attempt)
        ranks.append(gone.to_json())
    code = _code(cause, ranks, lost, results)
    signalled = any(r.signal for r in results)
    # An operator's stop is final; a lost node's place must be filled before the world can run;
    # a store an outsider tampers with would only be tampered with again.
    failure = classify(cause, failures, bool(lost), script) if code != ExitCode.OK else None
    restart = (
        failure is not None
        and _within(budget, failure, earlier)
        and not signalled
        and (not lost or replaceable)
        and not tampered(cause)
    )
    record = {
        "attempt": attempt,
        "root_cause": cause.to_json() if cause else None,
        "ranks": sorted(ranks, key=lambda e: e["rank"]),
        "lost_nodes": [r.node for r in lost],
        "warnings": [w for r in results for w in r.warnings][:1000],
        # what each node's audit ended or found still holding it (agent.run.leftovers)
        "leftovers": [dict(r.leftovers) for r in results if r.leftovers][:1000],
        **({"failure": failure.to_json()} if failure is not None else {}),
    }
    verdict = Verdict(int(code), restart, cause, record, failure)
    return verdict if budget.restart_same_failure else _guard_same(verdict, earlier, attempt)


def _within(budget: Budget, failure: AttemptFailure, earlier: Sequence[AttemptFailure | None]):
    """Whether the failure's class has a restart left: each earlier failure of the class spent
    one."""
    spent = sum(1 for e in earlier if e is not None and e.failure_class is failure.failure_class)
    return spent < budget.of(failure.failure_class)


def _guard_same(
    verdict: Verdict, earlier: Sequence[AttemptFailure | None], attempt: int
) -> Verdict:
    """A restart after the same program failure twice in a row is called off: a bug fails the
    same way every time, and each restart costs the whole allocation. The job ends with
    ExitCode.NO_PROGRESS (the loop guard's code), the attempt's own failure under "failure"."""
    failure, before = verdict.failure, earlier[-1] if earlier else None
    if not verdict.restart or failure is None or before is None:
        return verdict
    if not (failure.program and before.program and failure.signature == before.signature):
        return verdict
    assert failure.signature is not None
    how = f"the same failure twice: {failure.signature.text()}; not restarting"
    return _called_off(verdict, Kind.SAME_FAILURE, how, [attempt - 1, attempt])


def tampered(cause: Failure | None) -> bool:
    """Whether the root cause is an agent that found the store tampered with (a record the job
    wrote gone or altered: agent.run.bounded_wait)."""
    return cause is not None and cause.tampering


def guard_loop(verdict: Verdict, progressed: Sequence[bool]) -> Verdict:
    """The restart loop guard: `progressed` says, per attempt so far (this one last), whether
    any rank printed a progress line. A restart after two attempts in a row without one is
    called off: the job ends with ExitCode.NO_PROGRESS, the guard as its root cause (the
    attempt's own failure kept under "failure")."""
    if not verdict.restart or len(progressed) < 2 or any(progressed[-2:]):
        return verdict
    k = len(progressed) - 1
    how = f"no progress in attempts {k - 1} and {k}; not restarting"
    return _called_off(verdict, Kind.NO_PROGRESS, how, [k - 1, k])


def _called_off(verdict: Verdict, kind: Kind, how: str, attempts: list[int]) -> Verdict:
    """A restart called off (exit 5): the guard is the root cause, the attempt's own failure
    kept under "failure"."""
    cause = Failure(kind, how, attempts=tuple(attempts), failure=verdict.root_cause)
    record = {**verdict.record, "root_cause": cause.to_json()}
    return replace(
        verdict, code=int(ExitCode.NO_PROGRESS), restart=False, root_cause=cause, record=record
    )


def _stop_signal(cause: Failure | None, results: Sequence[Result]) -> int | None:
    """The signal an operator stopped the attempt with (Ctrl-C, scancel): the root cause's when
    the stop came first, else the one an agent received while its node was already stopping."""
    name = cause.signal if cause is not None and cause.kind is Kind.SIGNAL else None
    if isinstance(name, str) and name in signal.Signals.__members__:
        return int(signal.Signals[name])
    return next((r.signal for r in results if r.signal is not None), None)


def _code(
    cause: Failure | None,
    ranks: Sequence[Mapping[str, Any]],
    lost: Sequence[Result],
    results: Sequence[Result],
) -> int:
    stop = _stop_signal(cause, results)
    if stop:  # README's table: 130 after SIGINT, 143 after SIGTERM, whatever the ranks did then
        return 128 + stop
    if any(r.refused for r in results) or tampered(cause):
        return ExitCode.REFUSED
    if lost or (cause is not None and cause.kind is Kind.LOST):
        return ExitCode.RENDEZVOUS
    if any(e["state"] == "failed" for e in ranks) or cause is not None:
        return ExitCode.RANK_FAILED
    return ExitCode.OK


def with_collectives(verdict: Verdict, lines: Sequence[str]) -> Verdict:
    """The attempt's collectives from NCCL's own dumps (agent.hang.nccl_dumps) into its record;
    a rank's failure as the root cause says the first finding too (the timed-out rank's
    "Watchdog caught collective operation timeout" names one collective of one rank; the
    dumps say who waited for whom)."""
    if not lines:
        return verdict
    cause = verdict.root_cause
    if cause is not None and cause.kind is Kind.RANK:
        cause = replace(cause, how=f"{cause.how}; NCCL's dumps: {lines[0]}")
    root = cause.to_json() if cause else None
    record = {**verdict.record, "root_cause": root, "collectives": list(lines)}
    return replace(verdict, root_cause=cause, record=record)
