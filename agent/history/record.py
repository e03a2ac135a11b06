"""summary.json → the rows `agent history` keeps (pure: a summary and a clock in, frozen values out).

A summary anyone may have written is read by `summary_doc.read_summary`: missing or odd fields
become None, 0 or empty, never an exception; here they are cut to what a row holds. A job (or resident run) is one `JobRecord`; each of its attempts
is an `AttemptRecord`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.history.summary_doc import Attempt, Seat, Straggler, Summary, read_summary
from agent.node.failure import words
from agent.plan.run_id import run_id

TEXT_CAP = 1000  # characters of a command or a cause kept in the database
MAX_NODE_RANKS = 1 << 16  # ranks one node's range may count (a summary anyone could write)


@dataclass(frozen=True)
class AttemptRecord:
    attempt: int
    start: float | None  # the earliest rank start (epoch seconds); None: no rank started
    end: float | None  # the latest rank end
    nodes: int  # nodes that ran ranks
    ranks: int
    failed: int  # ranks that failed or were lost with their node (not those the agents stopped)
    spares: tuple[str, ...]  # hosts that waited as spares in this attempt
    lost_nodes: tuple[int, ...]
    cause: str | None  # this attempt's root cause, one line
    failure_class: str | None = None  # program | infrastructure (agent.run.failure_class)
    held: str | None = None  # GPUs still held after it: `HOST: GPUs still held by pid N (...)`


@dataclass(frozen=True)
class JobRecord:
    run_id: str  # the id `agent history` shows and takes (agent.plan.run_id): `8.0`, `8.0.r3`
    job_id: str
    step: str
    command: str
    start: float
    end: float
    nodes: int
    ranks: int
    spares_used: tuple[str, ...]  # spares seated in a node's place in a later attempt
    exit_code: int | None  # None: the job has not ended (its record from the start)
    status: str  # succeeded | failed | running (| killed, as a reader judged a running record)
    cause: str | None  # the job's root cause, one line
    restarts: int
    stragglers: tuple[str, ...]  # from summary.json's "stragglers" when it has one
    log_dir: str
    attempts: tuple[AttemptRecord, ...]
    node0: Mapping[str, Any] | None = None  # a running record: node 0's agent (history.liveness)
    max_restarts: int | None = None  # the restart budgets (None: a summary that predates them)
    max_infra_restarts: int | None = None
    stop: str | None = None  # a stop for preemption: its line (agent.run.preemption)


def from_summary(summary: Summary | Mapping[str, Any], now: float) -> JobRecord:
    """The history record of one finished job or run (a `Summary`, or summary.json parsed:
    read by `read_summary`); `now` stands in for times the summary lacks (a job that ended
    before any rank started)."""
    doc = summary if isinstance(summary, Summary) else read_summary(summary)
    job = doc.job
    attempts = tuple(attempt_record(a) for a in doc.attempts)
    starts = [a.start for a in attempts if a.start is not None]
    ends = [a.end for a in attempts if a.end is not None]
    start = min(starts) if starts else now
    end = max(ends) if ends else now
    running = doc.running  # node 0's record from the job's start
    exit_code = None if running else (1 if doc.exit_code is None else doc.exit_code)
    last = attempts[-1] if attempts else None
    job_id = _text(job.id, 100) or "local"
    step = _text(job.step, 100)
    return JobRecord(
        # A summary of an older version has no run_id: the id its job and step make.
        run_id=_text(job.run_id, 300) or run_id(job_id, step),
        job_id=job_id,
        step=step,
        command=_text(" ".join(job.command), TEXT_CAP),
        start=start,
        end=max(end, start),
        nodes=last.nodes if last and last.nodes else job.nnodes or 0,
        ranks=last.ranks if last and last.ranks else job.world_size or 0,
        spares_used=_spares_used(doc.attempts),
        exit_code=exit_code,
        status="running" if running else "succeeded" if exit_code == 0 else "failed",
        cause=cause_line(doc.root_cause),
        restarts=max(0, len(attempts) - 1),
        stragglers=tuple(_straggler(s) for s in doc.stragglers[:100]),
        log_dir=_text(job.log_dir, 4096),
        attempts=attempts,
        node0=dict(doc.node0) if running and doc.node0 is not None else None,
        max_restarts=job.max_restarts,
        max_infra_restarts=job.max_infra_restarts,
        stop=_stop(doc.preemption),
    )


def _stop(preemption: Mapping[str, Any] | None) -> str | None:
    line = (preemption or {}).get("line")
    return (_text(line, TEXT_CAP) or None) if isinstance(line, str) else None


def attempt_record(attempt: Attempt) -> AttemptRecord:
    ranks = attempt.ranks
    starts = [t for t in (r.started for r in ranks) if t is not None]
    ends = [t for t in (r.ended for r in ranks) if t is not None]
    ran = {r.node_rank for r in ranks if r.state != "lost"}
    planned = _planned(attempt.seating.nodes)  # a lost node has one row for all its ranks (rank -1)
    return AttemptRecord(
        attempt=attempt.attempt,
        start=min(starts) if starts else None,
        end=max(ends) if ends else None,
        nodes=len(attempt.seating.nodes) or len(ran),
        ranks=sum(planned.values()) or sum(1 for r in ranks if r.rank >= 0),
        failed=sum(
            planned.get(r.node_rank, 1) if r.rank < 0 else 1
            for r in ranks
            if r.state not in ("succeeded", "terminated")
        ),
        spares=tuple(_text(h, 256) for h in attempt.seating.spares[:1000]),
        lost_nodes=attempt.lost_nodes[:1000],
        cause=cause_line(attempt.root_cause),
        failure_class=_failure_class(attempt.failure),
        held=_held(attempt.leftovers),
    )


def _planned(nodes: Sequence[Seat]) -> dict[int, int]:
    """How many ranks each node of an attempt was to run (its `ranks`: [first, last])."""
    planned = {}
    for node in nodes:
        if node.ranks is not None and min(node.ranks) >= 0:
            size = node.ranks[1] - node.ranks[0] + 1
            planned[node.node] = max(0, min(size, MAX_NODE_RANKS))
    return planned


def _held(leftovers: Sequence[Mapping[str, Any]]) -> str | None:
    """The nodes an attempt left unusable (agent.run.leftovers' reason), one line."""
    lines = [
        f"{_text(n.get('host'), 256)}: {_text(n.get('reason'), 300)}"
        for n in leftovers[:100]
        if n.get("unusable")
    ]
    return "; ".join(lines)[:TEXT_CAP] or None


def cause_line(cause: Any) -> str | None:
    """One line naming a failure (agent.node.failure's words; a guard's without the attempt's
    own failure: the column is short)."""
    text = words(cause, inner=False)
    return None if text is None else _text(text, TEXT_CAP)


def _failure_class(failure: Mapping[str, Any] | None) -> str | None:
    value = (failure or {}).get("class")
    return value if value in ("program", "infrastructure") else None


def _spares_used(attempts: Sequence[Attempt]) -> tuple[str, ...]:
    """Hosts that first waited as spares and later ran ranks, in the order they were seated."""
    waited: set[str] = set()
    used: list[str] = []
    for attempt in attempts:
        for node in attempt.seating.nodes:
            host = _text(node.host, 256)
            if host in waited and host not in used:
                used.append(host)
        waited.update(_text(h, 256) for h in attempt.seating.spares)
    return tuple(used)


def _straggler(value: Straggler) -> str:
    """`rank 3 on n1`, or `node 1 (n1)` for a whole node that straggles (it has no rank)."""
    if value.rank is None:
        return _text(f"node {value.node_rank} ({value.host})", 256)
    return _text(f"rank {value.rank} on {value.host}", 256)


def _text(value: Any, limit: int) -> str:
    if value is None:
        return ""
    text = " ".join(str(value).split())  # one line
    if not text.isascii():  # a lone surrogate (a file name's non-UTF-8 byte) as its escape:
        text = text.encode("utf-8", "backslashreplace").decode()  # SQLite holds UTF-8 only
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _is_map(value: Any) -> bool:
    return isinstance(value, Mapping)
