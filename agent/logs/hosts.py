"""Which host and node ran each rank: from ranks.json, summary.json or the agent logs."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable
from typing import Any

from agent.history.summary_doc import read_summary
from agent.logs.logdir import open_regular, read_json
from agent.logs.selection import Where
from agent.plan.log_dir import LogDir, is_agent_log

_STARTING = re.compile(rb"attempt \d+: starting ranks (\d{1,9})(?:-(\d{1,9}))? on (\S{1,255})")
_AGENT_LOG_HEAD = 1 << 14  # the "starting ranks" line is near the top of an agent log
_MAX_SPAN = 1 << 12  # ranks one agent starts: a line claiming more is not the agent's
_MAX_HOST = 255  # characters; a longer "host" is not one
_MAX_RANKS = 1 << 20  # ranks named from agent logs: bounded memory whatever the logs say


def read_where(log_dir: str, names: Iterable[str]) -> dict[int, Where]:
    """rank → host from ranks.json, else summary.json, else the agent logs' first lines."""
    for source, path in (
        (where_from_ranks_json, LogDir(log_dir).ranks),
        (where_from_summary, LogDir(log_dir).summary),
    ):
        try:
            found = source(read_json(path))
        except (OSError, ValueError):
            found = {}  # being written, or damaged: the next source may know
        if found:
            return found
    return where_from_agent_logs(_heads(log_dir, sorted(n for n in names if is_agent_log(n))))


def where_from_ranks_json(data: Any) -> dict[int, Where]:
    """{"ranks": [{"rank": 0, "host": "n1", "node": 0}, ...]} → {0: Where("n1", 0)}."""
    entries = data.get("ranks") if isinstance(data, dict) else None
    return _where_from_entries(_listed(entries))


def where_from_summary(data: Any) -> dict[int, Where]:
    """summary.json: every attempt's ranks carry rank, host and node_rank."""
    where: dict[int, Where] = {}
    for attempt in read_summary(data).attempts:
        for r in attempt.ranks:
            if r.rank >= 0 and 0 < len(r.host) <= _MAX_HOST:
                where[r.rank] = Where(r.host, r.node_rank if r.node_rank >= 0 else None)
    return where


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _where_from_entries(entries: Iterable[Any]) -> dict[int, Where]:
    """ranks.json's entries: {"rank", "host", "node"}."""
    where: dict[int, Where] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        rank, host, node = entry.get("rank"), entry.get("host"), entry.get("node")
        usable = isinstance(host, str) and 0 < len(host) <= _MAX_HOST
        if isinstance(rank, int) and _number(rank) and isinstance(host, str) and usable:
            where[rank] = Where(host, node if _number(node) else None)
    return where


def where_from_agent_logs(texts: Iterable[bytes]) -> dict[int, Where]:
    """ "attempt 0: starting ranks 4-7 on n2" lines; nodes numbered by each host's lowest rank,
    since a node's ranks follow node 0's (global rank = node * nproc + local rank)."""
    hosts: dict[int, str] = {}
    for text in texts:
        for match in _STARTING.finditer(text):
            low, high = int(match[1]), int(match[2] or match[1])
            if not 0 <= high - low < _MAX_SPAN or len(hosts) >= _MAX_RANKS:
                continue
            host = match[3].decode("utf-8", "replace")
            hosts.update({rank: host for rank in range(low, high + 1)})
    first: dict[str, int] = {}
    for _, host in sorted(hosts.items()):
        first.setdefault(host, len(first))
    return {rank: Where(host, first[host]) for rank, host in hosts.items()}


def _heads(log_dir: str, names: Iterable[str]) -> list[bytes]:
    heads = []
    for name in names:
        with contextlib.suppress(OSError), open_regular(os.path.join(log_dir, name)) as f:
            heads.append(f.read(_AGENT_LOG_HEAD))
    return heads
