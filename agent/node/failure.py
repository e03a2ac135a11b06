"""A failure record: what one agent tells the job went wrong (pure).

Every reporter builds a `Failure` and every reader gets one back: through the store (sealed,
`Scope.report` / `Scope.failure`), in a node's result, in summary.json's `root_cause` and in
the history. Its `Kind` says what failed; a reader matches on it exhaustively (`case _:
assert_never(...)`), so a new kind shows every consumer. `tampering` says the agent found the
store tampered with (agent.node.sealed.Tampered): the job ends with exit 4 and no restart. No
message text decides anything.

The JSON form keeps the keys and strings summary.json and the history have always had.
`from_json` reads what anyone may have written (a store value, a file on disk): a field of the
wrong type is absent, an unknown kind or a value that is no record gives None; it never raises.
"""

from __future__ import annotations

import enum
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

if sys.version_info >= (3, 11):
    from typing import assert_never
else:  # Python 3.10: what typing.assert_never does
    from typing import NoReturn

    def assert_never(value: NoReturn) -> NoReturn:
        raise AssertionError(f"unhandled value: {value!r}")


class Kind(str, enum.Enum):  # enum.StrEnum from Python 3.11 on
    RANK = "rank"  # a rank failed (its exit, stderr tail, traceback)
    LOST = "lost"  # node 0 declared a node lost (its agent stopped answering, or left)
    SIGNAL = "signal"  # an agent received a stop signal (Ctrl-C, scancel)
    SETUP = "setup"  # an agent could not set up or go on (a missing script, the store tampered)
    JOIN = "join"  # a run ended before its first attempt for another node's reason
    SECRET = "secret"  # an agent holds another secret than node 0
    EXCLUDED = "excluded"  # the lineup found no way on (too few nodes, node 0 unhealthy)
    HANG = "hang"  # node 0's hang judge: every rank still running is quiet
    DOWN = "down"  # node 0 stops serving (resident agents)
    NO_PROGRESS = "no_progress"  # the restart loop guard: two attempts without progress
    SAME_FAILURE = "same_failure"  # the same program failure twice in a row
    CLOSED = "closed"  # not a failure: node 0 closed the phase (every watcher wakes)

    def __str__(self) -> str:  # as StrEnum's: the value, in f-strings too
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


# Kinds whose record is a guard's: `how` says it all, the attempt's own failure is inside.
GUARDS = frozenset({Kind.NO_PROGRESS, Kind.SAME_FAILURE})
# Fields a record of these kinds always carried in JSON, even when null.
_ALWAYS = {
    Kind.RANK: (
        *("rank", "local_rank", "node_rank", "host", "returncode", "signal", "time"),
        "stderr_tail",
    ),
    Kind.LOST: ("node_rank", "host", "time"),
    Kind.SIGNAL: ("node_rank", "host", "time"),
    Kind.SETUP: ("node_rank", "host", "time"),
    Kind.SECRET: ("node_rank", "time"),
    Kind.EXCLUDED: ("node_rank", "host", "time"),
    Kind.HANG: ("node_rank", "host", "time"),
}


@dataclass(frozen=True)
class Failure:
    kind: Kind
    how: str = ""  # one line; for a lost node only what befell it (`lost: ...`, `left: ...`)
    node_rank: int | None = None
    host: str | None = None
    time: float | None = None
    agent: int | None = None  # the agent that reported it (or, lost: the one lost)
    seq: int | None = None  # its place in the phase's failures (1: the root cause)
    tampering: bool = False  # the store was found tampered with: exit 4, never a restart
    # a rank's
    rank: int | None = None
    local_rank: int | None = None
    returncode: int | None = None
    signal: str | None = None  # also a stop signal's name (kind signal)
    stderr_tail: tuple[str, ...] = ()
    traceback: str | None = None
    # a hang's
    stacks: str | None = None
    stacks_file: str | None = None
    # a guard's: the attempts it looked at, the attempt's own failure
    attempts: tuple[int, ...] = ()
    failure: Failure | None = None
    note: str | None = None  # e.g. details cut to fit the store

    @property
    def closed(self) -> bool:
        return self.kind is Kind.CLOSED

    def to_json(self) -> dict[str, Any]:
        """The record as summary.json and the store carry it: kind first, nulls left out
        unless the kind always carried them; `tampering` only when set."""
        always = _ALWAYS.get(self.kind, ())
        data: dict[str, Any] = {"kind": self.kind.value}
        for name in _ORDER:
            value = getattr(self, name)
            if name == "failure":
                value = value.to_json() if value is not None else None
            elif name in ("stderr_tail", "attempts"):
                value = list(value) if value or name in always else None
            elif name == "how" and self.kind is Kind.CLOSED:
                continue
            if value is not None or name in always:
                data[name] = value
        if self.tampering:
            data["tampering"] = True
        return data

    def line(self, inner: bool = True) -> str:
        """One line naming the failure, the same in the console report, `agent logs`, the
        history and the timeline: a node named once, by its fields (`inner`: a guard's says
        the attempt's own failure too)."""
        match self.kind:
            case Kind.NO_PROGRESS | Kind.SAME_FAILURE:  # a guard's words say it all
                last = self.failure
                return self.how + (f" (last: {last.line()})" if inner and last else "")
            case Kind.RANK:
                return f"rank {self.rank} on {self.host} (node {self.node_rank}) {self.how}"
            case (
                Kind.LOST
                | Kind.SIGNAL
                | Kind.SETUP
                | Kind.JOIN
                | Kind.SECRET
                | Kind.EXCLUDED
                | Kind.HANG
                | Kind.DOWN
                | Kind.CLOSED
            ):
                if self.node_rank is None:  # not one node's: a join timeout, a mismatch
                    return f"{self.kind.value}: {self.how}"
                node = f"node {self.node_rank} ({self.host})"
                # A lost node's `how` is what befell it (`lost: ...`, `left: ...`): no colon.
                return f"{node} {self.how}" if self.kind is Kind.LOST else f"{node}: {self.how}"
            case _:
                assert_never(self.kind)

    def with_seq(self, seq: int) -> Failure:
        return replace(self, seq=seq)

    @staticmethod
    def from_json(data: Any, depth: int = 1) -> Failure | None:
        """A record anyone may have written → a Failure, or None when it is no record (not a
        mapping, no known kind). Wrong-typed fields are absent; a guard's inner failure is
        read `depth` levels deep at most."""
        if not isinstance(data, Mapping):
            return None
        try:
            kind = Kind(data.get("kind"))
        except ValueError:
            return None
        inner = Failure.from_json(data.get("failure"), depth - 1) if depth > 0 else None
        return Failure(
            kind,
            how=_text(data.get("how")) or "",
            node_rank=_int(data.get("node_rank")),
            host=_text(data.get("host")),
            time=_number(data.get("time")),
            agent=_int(data.get("agent")),
            seq=_int(data.get("seq")),
            tampering=data.get("tampering") is True,
            rank=_int(data.get("rank")),
            local_rank=_int(data.get("local_rank")),
            returncode=_int(data.get("returncode")),
            signal=_text(data.get("signal")),
            stderr_tail=_texts(data.get("stderr_tail")),
            traceback=_text(data.get("traceback")),
            stacks=_text(data.get("stacks")),
            stacks_file=_text(data.get("stacks_file")),
            attempts=tuple(a for a in _list(data.get("attempts")) if _int(a) is not None),
            failure=inner,
            note=_text(data.get("note")),
        )


_ORDER = (
    "rank",
    "local_rank",
    "node_rank",
    "host",
    "returncode",
    "how",
    "signal",
    "time",
    "agent",
    "seq",
    "stderr_tail",
    "traceback",
    "stacks",
    "stacks_file",
    "attempts",
    "failure",
    "note",
)


def words(data: Any, inner: bool = True) -> str | None:
    """A failure record read from a file (summary.json, the history) → its line; None when it
    is no mapping. A kind this version does not know is worded by its own fields."""
    if not isinstance(data, Mapping):
        return None
    failure = Failure.from_json(data)
    if failure is not None:
        return failure.line(inner)
    return f"{data.get('kind') or 'failure'}: {data.get('how')}"


def closed() -> Failure:
    """The record that closes a phase: over, no failure."""
    return Failure(Kind.CLOSED)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        return None
    return number if math.isfinite(number) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _texts(value: Any) -> tuple[str, ...]:
    return tuple(v for v in _list(value) if isinstance(v, str))
