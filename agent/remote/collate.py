"""Per-node command results → dshbak -c style groups: identical output under one hostlist (pure)."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass

import hostlist

from agent.plan.rank_set import format_ranges

_RULE = "-" * 16


@dataclass(frozen=True)
class NodeOutput:
    """What one node's command printed and how it ended."""

    node: int
    host: str
    output: str  # stdout and stderr, interleaved as the command wrote them
    code: int | None  # exit status; negative: killed by signal -code; None: no result
    timed_out: bool = False
    missing: str = ""  # why there is no result (code None): "never joined", "interrupted", ...
    tampered: bool = False  # no result because what is in its place does not open (exit 4)

    @property
    def ok(self) -> bool:
        return self.code == 0 and not self.timed_out

    @property
    def status(self) -> str:
        if self.code is None:
            return f"no result: {self.missing}" if self.missing else "no result"
        if self.timed_out:
            return "timed out, killed"
        if self.code < 0:
            return f"killed by {_signal_name(-self.code)}"
        return f"exit {self.code}"


@dataclass(frozen=True)
class Group:
    """Nodes whose command printed the same output and ended the same way."""

    nodes: tuple[int, ...]
    hosts: tuple[str, ...]
    output: str
    status: str
    ok: bool

    @property
    def label(self) -> str:
        """`n[1-3,7]`; node indices are added when hosts repeat (several agents on one host)."""
        compressed = hostlist.collect_hostlist(list(self.hosts))
        if len(set(self.hosts)) == len(self.hosts):
            return compressed
        return f"{compressed} (nodes {format_ranges(self.nodes)})"


def collate(results: Sequence[NodeOutput]) -> list[Group]:
    """Group by (output, status), in the order of each group's first node."""
    members: dict[tuple[str, str], list[NodeOutput]] = {}
    for result in sorted(results, key=lambda r: r.node):
        members.setdefault((result.output, result.status), []).append(result)
    return [
        Group(
            nodes=tuple(r.node for r in rs),
            hosts=tuple(r.host for r in rs),
            output=output,
            status=status,
            ok=rs[0].ok,
        )
        for (output, status), rs in members.items()
    ]


def render(groups: Sequence[Group]) -> str:
    """dshbak -c's layout, with each group's exit status in its header."""
    parts = []
    for group in groups:
        body = (
            group.output if not group.output or group.output.endswith("\n") else group.output + "\n"
        )
        parts.append(f"{_RULE}\n{group.label} ({group.status})\n{_RULE}\n{body}")
    return "".join(parts)


def failures(groups: Sequence[Group]) -> str | None:
    """`127.0.0.4 (exit 3); n[5-6] (no result: never joined)`, or None when every node succeeded."""
    failed = [f"{g.label} ({g.status})" for g in groups if not g.ok]
    return "; ".join(failed) if failed else None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
