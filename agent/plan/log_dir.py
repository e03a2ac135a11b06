"""A job's log dir and every file in it, named once (pure): the writers (node 0's summary,
ranks.json, control.json, metrics.prom, stacks; each agent's log and config; each rank's files)
and the readers (`agent logs`, `stacks`, `debug`, `history`, the claim of a log dir) all ask a
`LogDir`, so a file's name cannot drift between the one who writes it and the one who reads it.

The rank files are flat and greppable: rank-00003.out, and rank-00003.r1.out for restart 1.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

SUMMARY = "summary.json"  # node 0: the job's record (agent.history.summary_doc), at start and end
RANKS = "ranks.json"  # node 0: who runs which rank now, and each attempt's seating
CONTROL = "control.json"  # node 0: where `agent stacks LOG_DIR` finds its endpoint (0600)
METRICS = "metrics.prom"  # node 0, --metrics-port: node-exporter's textfile collector reads *.prom
SUMMARY_RESERVE = ".summary-reserve"  # node 0's room for summary.json; created first, it claims
NCCL_TRACE = "nccl-trace"  # torch appends the rank to the prefix we give: nccl-trace.a0.rank-3

_RANK_STEM = "rank-{rank:05d}"
_RANK_FILE = re.compile(r"rank-(\d+)(?:\.r(\d+))?\.(out|err)")
_AGENT_LOG = "agent-{index:05d}.log"
_AGENT_LOG_FILE = re.compile(r"agent-\d+\.log")
_CONFIG = "resolved-config.agent-{index:05d}.json"
_STACKS = "stacks-a{attempt}.txt"
_STACKS_FILE = re.compile(r"stacks-a(\d+)\.txt")
# What a job writes into its log dir: a directory that holds any of these holds a job already.
_JOB_FILE = re.compile(
    r"rank-\d+\..*|agent-\d+\.log|resolved-config\.agent-\d+\.json|stacks-a\d+\.txt"
    rf"|nccl-trace\..*|{'|'.join(re.escape(n) for n in (SUMMARY, RANKS, CONTROL, METRICS, SUMMARY_RESERVE))}"
)


class RankFiles(NamedTuple):
    """One rank's files of one attempt: its stdout, its stderr, torch's error file."""

    out: str
    err: str
    error_json: str


class RankFileName(NamedTuple):
    """What a rank file's name says: rank-00003.r1.err is rank 3, attempt 1, stream err."""

    rank: int
    attempt: int
    stream: str  # out | err


@dataclass(frozen=True)
class LogDir:
    """The log dir at `path` and the name of every file a job leaves in it."""

    path: str

    def _join(self, name: str) -> str:
        return os.path.join(self.path, name)

    @property
    def summary(self) -> str:
        return self._join(SUMMARY)

    @property
    def ranks(self) -> str:
        return self._join(RANKS)

    @property
    def control(self) -> str:
        return self._join(CONTROL)

    @property
    def metrics(self) -> str:
        return self._join(METRICS)

    @property
    def summary_reserve(self) -> str:
        return self._join(SUMMARY_RESERVE)

    def rank_files(self, rank: int, attempt: int) -> RankFiles:
        """rank-00003.out (attempt 0), rank-00003.r1.out for restart 1; .err; .error.json."""
        stem = self._join(_RANK_STEM.format(rank=rank) + (f".r{attempt}" if attempt else ""))
        return RankFiles(stem + ".out", stem + ".err", stem + ".error.json")

    def agent_log(self, agent_index: int) -> str:
        return self._join(_AGENT_LOG.format(index=agent_index))

    def resolved_config(self, agent_index: int | None) -> str:
        """Each agent's copy of the resolved config (None: the name's pattern, for --dry-run)."""
        if agent_index is None:
            return self._join(_CONFIG.replace("{index:05d}", "NNNNN"))
        return self._join(_CONFIG.format(index=agent_index))

    def stacks(self, attempt: int) -> str:
        """The stacks node 0's hang judge collected in that attempt."""
        return self._join(_STACKS.format(attempt=attempt))

    def nccl_trace_prefix(self, attempt: int) -> str:
        """TORCH_NCCL_DEBUG_INFO_TEMP_FILE: torch appends the rank (nccl-trace.a0.rank-3)."""
        return self._join(f"{NCCL_TRACE}.a{attempt}.rank-")


def rank_file(name: str) -> RankFileName | None:
    """A rank file's name read back (None: not one)."""
    match = _RANK_FILE.fullmatch(name)
    if match is None:
        return None
    return RankFileName(int(match[1]), int(match[2] or 0), match[3])


def is_agent_log(name: str) -> bool:
    return _AGENT_LOG_FILE.fullmatch(name) is not None


def stacks_attempt(name: str) -> int | None:
    """The attempt a stacks file is of (None: not one)."""
    match = _STACKS_FILE.fullmatch(name)
    return int(match[1]) if match else None


def nccl_trace_rank(name: str, attempt: int) -> int | None:
    """The rank of one of torch's flight recorder dumps of that attempt (None: not one)."""
    match = re.fullmatch(rf"{re.escape(NCCL_TRACE)}\.a{attempt}\.rank-(\d+)", name)
    return int(match[1]) if match else None


def is_nccl_trace(name: str) -> bool:
    """A flight recorder dump of any attempt."""
    return name.startswith(NCCL_TRACE + ".")


def job_files(names: Iterable[str]) -> list[str]:
    """The names among a directory's entries that a job wrote (sorted)."""
    return sorted(n for n in names if _JOB_FILE.fullmatch(n))
