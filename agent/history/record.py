"""summary.json → the rows `agent history` keeps (pure: a summary and a clock in, frozen values out).

Everything here reads a summary that anyone may have written: missing or odd fields become None,
0 or empty, never an exception. A job (or resident run) is one `JobRecord`; each of its attempts
is an `AttemptRecord`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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


def from_summary(summary: Mapping[str, Any], now: float) -> JobRecord:
    """The history record of one finished job or run; `now` stands in for times the summary
    lacks (a job that ended before any rank started)."""
    job = _map(summary.get("job"))
    attempts = tuple(
        attempt_record(a, i) for i, a in enumerate(_list(summary.get("attempts"))) if _is_map(a)
    )
    starts = [a.start for a in attempts if a.start is not None]
    ends = [a.end for a in attempts if a.end is not None]
    start = min(starts) if starts else now
    end = max(ends) if ends else now
    running = summary.get("status") == "running"  # node 0's record from the job's start
    exit_code = None if running else _int(summary.get("exit_code"), 1)
    last = attempts[-1] if attempts else None
    job_id = _text(job.get("id"), 100) or "local"
    step = _text(job.get("step"), 100)
    return JobRecord(
        # A summary of an older version has no run_id: the id its job and step make.
        run_id=_text(job.get("run_id"), 300) or run_id(job_id, step),
        job_id=job_id,
        step=step,
        command=_command(job.get("command")),
        start=start,
        end=max(end, start),
        nodes=last.nodes if last and last.nodes else _int(job.get("nnodes"), 0),
        ranks=last.ranks if last and last.ranks else _int(job.get("world_size"), 0),
        spares_used=_spares_used(_list(summary.get("attempts"))),
        exit_code=exit_code,
        status="running" if running else "succeeded" if exit_code == 0 else "failed",
        cause=cause_line(summary.get("root_cause")),
        restarts=max(0, len(attempts) - 1),
        stragglers=tuple(_straggler(s) for s in _list(summary.get("stragglers"))[:100]),
        log_dir=_text(job.get("log_dir"), 4096),
        attempts=attempts,
        node0=dict(summary["node0"]) if running and _is_map(summary.get("node0")) else None,
        max_restarts=_count_or_none(job.get("max_restarts")),
        max_infra_restarts=_count_or_none(job.get("max_infra_restarts")),
        stop=_stop(summary.get("preemption")),
    )


def _stop(preemption: Any) -> str | None:
    line = _map(preemption).get("line")
    return (_text(line, TEXT_CAP) or None) if isinstance(line, str) else None


def attempt_record(attempt: Mapping[str, Any], position: int) -> AttemptRecord:
    ranks = [r for r in _list(attempt.get("ranks")) if _is_map(r)]
    starts = [t for t in (_time(r.get("start")) for r in ranks) if t is not None]
    ends = [t for t in (_time(r.get("end")) for r in ranks) if t is not None]
    nodes = [n for n in _list(attempt.get("nodes")) if _is_map(n)]
    ran = {r.get("node_rank") for r in ranks if r.get("state") != "lost"}
    planned = _planned(nodes)  # a lost node has one row for all its ranks (rank -1)
    return AttemptRecord(
        attempt=_int(attempt.get("attempt"), position),
        start=min(starts) if starts else None,
        end=max(ends) if ends else None,
        nodes=len(nodes) or len(ran),
        ranks=sum(planned.values()) or sum(1 for r in ranks if _int(r.get("rank"), -1) >= 0),
        failed=sum(
            planned.get(r.get("node_rank"), 1) if _int(r.get("rank"), -1) < 0 else 1
            for r in ranks
            if r.get("state") not in ("succeeded", "terminated")
        ),
        spares=tuple(_text(h, 256) for h in _list(attempt.get("spares"))[:1000]),
        lost_nodes=tuple(_int(n, -1) for n in _list(attempt.get("lost_nodes"))[:1000]),
        cause=cause_line(attempt.get("root_cause")),
        failure_class=_failure_class(attempt.get("failure")),
        held=_held(attempt.get("leftovers")),
    )


def _planned(nodes: Sequence[Mapping[str, Any]]) -> dict[int, int]:
    """How many ranks each node of an attempt was to run (its `ranks`: [first, last])."""
    planned = {}
    for node in nodes:
        first_last = _list(node.get("ranks"))
        if len(first_last) == 2 and all(_int(n, -1) >= 0 for n in first_last):
            size = first_last[1] - first_last[0] + 1
            planned[_int(node.get("node"), -1)] = max(0, min(size, MAX_NODE_RANKS))
    return planned


def _held(leftovers: Any) -> str | None:
    """The nodes an attempt left unusable (agent.run.leftovers' reason), one line."""
    lines = [
        f"{_text(n.get('host'), 256)}: {_text(n.get('reason'), 300)}"
        for n in _list(leftovers)[:100]
        if _is_map(n) and n.get("unusable")
    ]
    return "; ".join(lines)[:TEXT_CAP] or None


def cause_line(cause: Any) -> str | None:
    """One line naming a failure (agent.node.failure's words; a guard's without the attempt's
    own failure: the column is short)."""
    text = words(cause, inner=False)
    return None if text is None else _text(text, TEXT_CAP)


def _failure_class(failure: Any) -> str | None:
    value = _map(failure).get("class")
    return value if value in ("program", "infrastructure") else None


def _count_or_none(value: Any) -> int | None:
    number = _int(value, -1)
    return number if number >= 0 else None


def _spares_used(attempts: Sequence[Any]) -> tuple[str, ...]:
    """Hosts that first waited as spares and later ran ranks, in the order they were seated."""
    waited: set[str] = set()
    used: list[str] = []
    for attempt in attempts:
        if not _is_map(attempt):
            continue
        for node in _list(attempt.get("nodes")):
            host = _text(_map(node).get("host"), 256)
            if host in waited and host not in used:
                used.append(host)
        waited.update(_text(h, 256) for h in _list(attempt.get("spares")))
    return tuple(used)


def _command(value: Any) -> str:
    if isinstance(value, list):
        value = " ".join(str(v) for v in value)
    return _text(value, TEXT_CAP)


def _straggler(value: Any) -> str:
    """`rank 3 on n1`, or `node 1 (n1)` for a whole node that straggles (it has no rank)."""
    if not _is_map(value):
        return _text(value, 256)
    if value.get("rank") is None:
        return _text(f"node {value.get('node_rank')} ({value.get('host')})", 256)
    return _text(f"rank {value.get('rank')} on {value.get('host')}", 256)


def _text(value: Any, limit: int) -> str:
    if value is None:
        return ""
    text = " ".join(str(value).split())  # one line
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _int(value: Any, default: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        return default
    return value


def _time(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _is_map(value: Any) -> bool:
    return isinstance(value, Mapping)


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
