"""summary.json as one typed document (pure): node 0 writes it, every reader reads it here.

Node 0 writes the job's record at its start (`"status": "running"`) and at its end
(agent.run.summary builds both; `SCHEMA` names their version). Every reader — `agent logs
--summary`, its hosts and `--timeline`, `agent history`, the liveness judge, `agent
stacks`/`debug` on a finished job — turns the parsed JSON into a `Summary` with `read_summary`,
which never raises: a summary anyone may have written (an older agent, a hand, a hostile user)
gives defaults for whatever is missing or of the wrong type (None, 0, -1, "" or empty), and
list entries that are not objects are skipped.

A failure record (an attempt's or the job's `root_cause`, an attempt's `failure` class) stays
the mapping it was: its kinds belong to the node's records, not to this document.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

# summary.json's version. 0: the summaries written before it carried one (the same keys);
# 1: "schema" added. A reader reads every version: keys are only ever added.
SCHEMA = 1


@dataclass(frozen=True)
class RankExit:
    """How one rank of one attempt ended. state: succeeded | failed | terminated | lost (a lost
    node's record: rank -1). Written by the supervisor (`to_json`), read back by `from_json`."""

    rank: int
    local_rank: int
    node_rank: int
    host: str
    pid: int | None
    returncode: int | None
    state: str
    start: float  # epoch seconds; 0.0: never started (a lost node's record)
    end: float | None
    attempt: int
    binding: str | None = None  # what /proc showed once the rank ran: "cpus 0-15, memory prefer:0"
    how: str | None = None  # the file's words; None: said from the returncode (`describe`)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["how"] = self.how if self.how is not None else describe(self.returncode)
        return data

    @property
    def words(self) -> str:
        """How it ended, in words."""
        return self.how if self.how is not None else describe(self.returncode)

    @property
    def started(self) -> float | None:
        """Its start as a time (None: it never started, or the file's value is not a time)."""
        return _time(self.start)

    @property
    def ended(self) -> float | None:
        return _time(self.end)

    @classmethod
    def from_json(cls, value: Any, attempt: int = -1) -> RankExit:
        entry = _map(value)
        start = _number(entry.get("start"))
        return cls(
            rank=_int(entry.get("rank")),
            local_rank=_int(entry.get("local_rank")),
            node_rank=_int(entry.get("node_rank")),
            host=_str(entry.get("host")),
            pid=_int_or_none(entry.get("pid")),
            returncode=_int_or_none(entry.get("returncode")),
            state=_str(entry.get("state")),
            start=start if start is not None else 0.0,
            end=_number(entry.get("end")),
            attempt=_int(entry.get("attempt"), attempt),
            binding=_str(entry.get("binding")) or None,
            how=_str(entry.get("how")) if "how" in entry else None,
        )


def signal_name(returncode: int | None) -> str | None:
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def describe(returncode: int | None) -> str:
    if returncode is None:
        return "did not exit (agent lost)"
    name = signal_name(returncode)
    return f"killed by {name}" if name else f"exit code {returncode}"


@dataclass(frozen=True)
class Seat:
    """One node of an attempt's seating: its position, host and ranks (first, last)."""

    node: int
    host: str
    ranks: tuple[int, int] | None  # None: not a pair of numbers

    @classmethod
    def from_json(cls, value: Any) -> Seat:
        entry = _map(value)
        ranks = entry.get("ranks")
        pair = (
            (ranks[0], ranks[1])
            if isinstance(ranks, list) and len(ranks) == 2 and all(_is_int(r) for r in ranks)
            else None
        )
        return cls(_int(entry.get("node")), _str(entry.get("host")), pair)


@dataclass(frozen=True)
class Seating:
    """Who ran an attempt, who waited as a spare, who was excluded before it (as summary.json's
    attempts and ranks.json's "attempts" record it)."""

    attempt: int
    nodes: tuple[Seat, ...]
    spares: tuple[str, ...]
    excluded: tuple[str, ...]  # the hosts taken out before it

    @classmethod
    def from_json(cls, value: Any, attempt: int = -1) -> Seating:
        entry = _map(value)
        return cls(
            attempt=_int(entry.get("attempt"), attempt),
            nodes=tuple(Seat.from_json(n) for n in _maps(entry.get("nodes"))),
            spares=tuple(_str(h) for h in _list(entry.get("spares"))),
            excluded=tuple(_str(e.get("host")) for e in _maps(entry.get("excluded"))),
        )


@dataclass(frozen=True)
class Attempt:
    attempt: int
    ranks: tuple[RankExit, ...]
    root_cause: Mapping[str, Any] | None  # the failure record that ended it (opaque here)
    lost_nodes: tuple[int, ...]
    seating: Seating  # an attempt recorded before seatings were: empty (see `seated`)
    seated: bool  # whether the record holds its seating ("nodes")
    failure: Mapping[str, Any] | None  # its class (agent.run.failure_class), opaque here
    leftovers: tuple[Mapping[str, Any], ...]  # what each node's audit found (agent.run.leftovers)

    @classmethod
    def from_json(cls, value: Any, position: int) -> Attempt:
        entry = _map(value)
        number = _int(entry.get("attempt"), position)
        return cls(
            attempt=number,
            ranks=tuple(RankExit.from_json(r, number) for r in _maps(entry.get("ranks"))),
            root_cause=_map_or_none(entry.get("root_cause")),
            lost_nodes=tuple(_int(n) for n in _list(entry.get("lost_nodes"))),
            seating=Seating.from_json(entry, number),
            seated="nodes" in entry,
            failure=_map_or_none(entry.get("failure")),
            leftovers=tuple(_maps(entry.get("leftovers"))),
        )


@dataclass(frozen=True)
class Straggler:
    """A rank (or a whole node: rank None) node 0 named as behind the job's pace."""

    attempt: int
    rank: int | None
    node_rank: int
    host: str
    median: float | None  # its seconds per step
    job_median: float | None
    since: float | None  # when node 0 named it
    until: float | None  # when it kept pace again (None: not before its attempt ended)

    @property
    def words(self) -> str:
        """`straggler in attempt 1: rank 3 on n1 (node 0) at 2.5 s/step, the job's median 1.2
        s/step` (the pace when the record has it); shared by the report, `agent logs --summary`
        and the timeline."""
        what = (
            f"node {self.node_rank} ({self.host})"
            if self.rank is None
            else f"rank {self.rank} on {self.host} (node {self.node_rank})"
        )
        pace = (
            f" at {self.median:.3g} s/step, the job's median {self.job_median:.3g} s/step"
            if self.median is not None and self.job_median is not None
            else ""
        )
        return f"straggler in attempt {self.attempt}: {what}{pace}"

    @classmethod
    def from_json(cls, value: Any) -> Straggler:
        entry = _map(value)
        return cls(
            attempt=_int(entry.get("attempt")),
            rank=_int_or_none(entry.get("rank")),
            node_rank=_int(entry.get("node_rank")),
            host=_str(entry.get("host")),
            median=_number(entry.get("median")),
            job_median=_number(entry.get("job_median")),
            since=_time(entry.get("since")),
            until=_time(entry.get("until")),
        )


@dataclass(frozen=True)
class Job:
    """summary.json's "job": who ran what, where (agent.run.summary.job_record)."""

    run_id: str = ""  # "" in a summary older than run ids
    id: str = ""
    step: str = ""
    source: str = ""
    nnodes: int | None = None
    world_size: int | None = None
    nproc_per_node: int | None = None
    log_dir: str = ""
    command: tuple[str, ...] = ()
    max_restarts: int | None = None  # None: a summary older than the restart budgets
    max_infra_restarts: int | None = None

    @classmethod
    def from_json(cls, value: Any) -> Job:
        entry = _map(value)
        command = entry.get("command")
        return cls(
            run_id=_str(entry.get("run_id")),
            id=_str(entry.get("id")),
            step=_str(entry.get("step")),
            source=_str(entry.get("source")),
            nnodes=_int_or_none(entry.get("nnodes")),
            world_size=_int_or_none(entry.get("world_size")),
            nproc_per_node=_int_or_none(entry.get("nproc_per_node")),
            log_dir=_str(entry.get("log_dir")),
            command=tuple(_str(c) for c in command)
            if isinstance(command, list)
            else ((_str(command),) if _str(command) else ()),
            max_restarts=_count(entry.get("max_restarts")),
            max_infra_restarts=_count(entry.get("max_infra_restarts")),
        )


RUNNING = "running"  # a job's record from its start (agent.history.liveness judges it)


@dataclass(frozen=True)
class Summary:
    schema: int  # 0: written before summaries carried their version
    status: str  # succeeded | failed | running ("" when the file says nothing usable)
    exit_code: int | None
    job: Job
    root_cause: Mapping[str, Any] | None  # the job's root cause (opaque here)
    attempts: tuple[Attempt, ...]
    stragglers: tuple[Straggler, ...]
    node0: Mapping[str, Any] | None  # a running record: node 0's agent (agent.history.liveness)
    preemption: Mapping[str, Any] | None = None  # a stop for preemption (agent.run.preemption)

    @property
    def running(self) -> bool:
        """Whether this is the job's record from its start (no verdict yet)."""
        return self.status == RUNNING


def read_summary(value: Any) -> Summary:
    """Parsed summary.json (anything json.load can give, and then some) → a `Summary`; never
    raises."""
    doc = _map(value)
    return Summary(
        schema=_int(doc.get("schema"), 0),
        status=_str(doc.get("status")),
        exit_code=_int_or_none(doc.get("exit_code")),
        job=Job.from_json(doc.get("job")),
        root_cause=_map_or_none(doc.get("root_cause")),
        attempts=tuple(
            Attempt.from_json(a, i) for i, a in enumerate(_list(doc.get("attempts"))) if _is_map(a)
        ),
        stragglers=tuple(Straggler.from_json(s) for s in _maps(doc.get("stragglers"))),
        node0=_map_or_none(doc.get("node0")),
        preemption=_map_or_none(doc.get("preemption")),
    )


def read_seatings(value: Any) -> dict[int, Seating]:
    """ranks.json's "attempts" → attempt → its seating (for attempts whose summary record
    predates seatings)."""
    seatings = (Seating.from_json(s) for s in _maps(value))
    return {s.attempt: s for s in seatings}


# -- tolerant conversions: a value of the wrong type is the default, never an exception -----


# Each conversion first asks for the exact type json.loads makes: 32K ranks' records are
# ~400,000 values, and an isinstance against a union or an ABC costs several times more.


def _is_int(value: Any) -> bool:
    return type(value) is int or (isinstance(value, int) and not isinstance(value, bool))


def _int(value: Any, default: int = -1) -> int:
    return value if _is_int(value) else default


def _int_or_none(value: Any) -> int | None:
    return value if _is_int(value) else None


def _count(value: Any) -> int | None:
    """A count: a number of 0 or more, else None."""
    return value if _is_int(value) and value >= 0 else None


def _number(value: Any) -> float | None:
    """A finite number as a float (an integer beyond any float is none)."""
    if type(value) is float:
        return value if math.isfinite(value) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _time(value: Any) -> float | None:
    """A time: a finite number after the epoch."""
    number = _number(value)
    return number if number is not None and number > 0 else None


def _str(value: Any) -> str:
    """Text: a string as it is, a number as its digits, anything else ""."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return ""


def _is_map(value: Any) -> bool:
    return isinstance(value, Mapping)


def _map(value: Any) -> Mapping[str, Any]:
    return value if type(value) is dict or isinstance(value, Mapping) else {}


def _map_or_none(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) and value else None


def _list(value: Any) -> Sequence[Any]:
    return value if isinstance(value, list) else []


def _maps(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in _list(value) if isinstance(v, Mapping)]
