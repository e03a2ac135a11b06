"""An attempt's failure classed (pure): a bug in the program, or a fault of the infrastructure.

The input is what the reporters already publish (agent.node.failure.Failure; for a rank,
`summary.rank_failure`: its `how`, `returncode`, `traceback` from TORCHELASTIC_ERROR_FILE,
`stderr_tail`); the output is a frozen `AttemptFailure`. The restart
policy (`verdict.judge`) spends `--max-restarts` on program failures and `--max-infra-restarts`
on infrastructure ones, and stops when two attempts in a row fail with the same `Signature`.

- infrastructure: a node lost (any node lost in the attempt explains the rest), a failed health
  check, a signal from the scheduler or an operator, the store lost or tampered with, a setup or
  join failure, and a hang. A hang is infrastructure because from outside the agent cannot tell a
  deadlock from a stalled GPU, NIC or peer (the stacks say where the ranks wait, not why); it is
  the collective timeout torch would raise later, which this table counts as infrastructure too
  when a peer died first; a restart cures the transient causes, and the deterministic ones are
  bounded by `--max-infra-restarts` (and by the progress guard with `--progress-regex`).
- program: a rank's exception or exit code while its peers were healthy. A rank killed by a
  signal is a program failure too (SIGSEGV, SIGABRT, the OOM killer's SIGKILL): a scheduler's
  signal reaches the agents themselves and is recorded as `Kind.SIGNAL`.
- a rank's collective error (connection reset or closed by a peer, a collective timeout) is the
  class of the peer that died first when the attempt has one (its failure record, or its node
  lost); with every peer healthy it is the rank's own program failure (a mismatched collective
  times out at the same line every time).
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.node.failure import Failure, Kind, assert_never


class FailureClass(enum.Enum):
    PROGRAM = "program"
    INFRA = "infrastructure"


@dataclass(frozen=True)
class Frame:
    """One `File "path", line N, in function` line of a traceback."""

    path: str
    line: int
    function: str

    def where(self) -> str:
        return f"{os.path.basename(self.path)}:{self.line}"


@dataclass(frozen=True)
class Signature:
    """What makes two program failures the same: the exception type and the innermost user
    frame, or, without a traceback, how the rank ended (`exit code 3`, `killed by SIGSEGV`)
    and the script."""

    exception: str | None
    frame: Frame | None
    ended: str | None  # without a traceback: the rank's `how`
    script: str

    def text(self) -> str:
        """`ValueError at train.py:88`, `exit code 3 from train.py`."""
        if self.exception is not None and self.frame is not None:
            return f"{self.exception} at {self.frame.where()}"
        return f"{self.ended} from {os.path.basename(self.script) or 'the script'}"


@dataclass(frozen=True)
class AttemptFailure:
    """How one attempt failed: its class, one line saying why, and (program) its signature."""

    failure_class: FailureClass
    why: str
    signature: Signature | None = None

    @property
    def program(self) -> bool:
        return self.failure_class is FailureClass.PROGRAM

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"class": self.failure_class.value, "why": self.why}
        if self.signature is not None:
            data["signature"] = self.signature.text()
        return data


def classify(
    cause: Failure | None,
    failures: Sequence[Failure],
    lost: bool,
    script: str,
) -> AttemptFailure:
    """The failed attempt's class. `cause`: its root cause (the first failure); `failures`:
    every failure record of the attempt; `lost`: some node of it was lost."""
    lost_record = next((f for f in _by_seq(failures) if f.kind is Kind.LOST), None)
    if lost or lost_record is not None:
        where = lost_record or cause
        node, host = (where.node_rank, where.host) if where is not None else (None, None)
        return _infra(f"node {node} ({host}) lost")
    if cause is None:  # a failed attempt whose record never reached the store
        return _infra("no failure record")
    match cause.kind:
        case Kind.RANK:
            pass
        case (
            Kind.LOST
            | Kind.SIGNAL
            | Kind.SETUP
            | Kind.JOIN
            | Kind.SECRET
            | Kind.EXCLUDED
            | Kind.HANG
            | Kind.DOWN
            | Kind.NO_PROGRESS
            | Kind.SAME_FAILURE
            | Kind.CLOSED
        ):
            return _infra(cause.kind.value)
        case _:
            assert_never(cause.kind)
    if _peer_error(cause):
        # A collective error: the peer that died first, when the attempt names one, is why.
        first = next(
            (f for f in _by_seq(failures) if f.kind is Kind.RANK and not _peer_error(f)),
            None,
        )
        if first is not None:
            return _program(first, script)
    return _program(cause, script)


def signature_of(record: Failure, script: str) -> Signature:
    """A rank's failure record → its signature: the traceback from the error file, else one
    the rank printed on stderr (its last lines), else how it ended."""
    for text in (record.traceback, "\n".join(record.stderr_tail)):
        if text:
            parsed = _parse(text)
            if parsed is not None:
                exception, frame = parsed
                return Signature(exception, frame, None, script)
    return Signature(None, None, record.how or "failure", script)


def _program(record: Failure, script: str) -> AttemptFailure:
    signature = signature_of(record, script)
    return AttemptFailure(
        FailureClass.PROGRAM, f"rank {record.rank}: {signature.text()}", signature
    )


def _infra(why: str) -> AttemptFailure:
    return AttemptFailure(FailureClass.INFRA, why)


def _by_seq(failures: Sequence[Failure]) -> list[Failure]:
    found = [f for f in failures if not f.closed]
    return sorted(found, key=lambda f: f.seq if f.seq is not None else float("inf"))


_FRAME = re.compile(r'^\s*File "(?P<path>[^"]*)", line (?P<line>\d+), in (?P<function>.*)$')
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::|$)")
# Library frames: a traceback's innermost *user* frame is the last one outside these.
_LIBRARY = re.compile(r"/(site|dist)-packages/|/lib/python\d[\d.]*/|^<")
# A rank's error that says a peer went away or never answered (gloo, NCCL, c10d).
_PEER_ERROR = re.compile(
    r"Connection (reset|closed|refused) by peer|Broken pipe|Timed out waiting|"
    r"collective operation timeout|DistNetworkError|DistBackendError|DistStoreError"
)


def _parse(text: str) -> tuple[str, Frame] | None:
    """A Python traceback → (exception type, innermost user frame): the last traceback of a
    chain (the one the rank died of); the innermost frame of all when every one is a
    library's. None when the text holds no frame and exception line."""
    lines = text.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call")]
    lines = lines[heads[-1] :] if heads else lines
    frames: list[Frame] = []
    exception: str | None = None
    for line in lines:
        match = _FRAME.match(line)
        if match:
            frames.append(Frame(match["path"], int(match["line"]), match["function"].strip()))
            exception = None  # the exception line comes after the last frame
            continue
        found = _EXCEPTION.match(line)
        if frames and exception is None and found and not line.startswith(" "):
            exception = found["type"]
    if not frames or exception is None:
        return None
    user = [f for f in frames if not _LIBRARY.search(f.path)]
    return exception, (user or frames)[-1]


def _peer_error(record: Failure) -> bool:
    """Whether a rank died of a collective error (its exception, or its last stderr lines)."""
    text = "\n".join([record.traceback or "", *record.stderr_tail])
    return bool(_PEER_ERROR.search(text))
