"""NCCL's own flight-recorder dumps, read into the same view as the probes' answers.

When a collective times out, torch's NCCL watchdog dumps the rank's flight recorder (the agent
sets TORCH_NCCL_DUMP_ON_TIMEOUT=1 and the path, agent.plan.ranks.flight_recorder:
LOG_DIR/nccl-trace.a<attempt>.rank-<rank>) and then aborts the rank. Those ranks are gone by the
time anyone asks: their dumps are all that says which collective each was in. Node 0 reads the
attempt's dumps at its verdict (`recorders`) into the typed `RankRecorder` the probes give, so
agent.hang.collectives collates them alike.

A dump is a pickle of plain data (dicts, lists, tuples, strings, numbers). It is never
unpickled: agent.hang.plain_data decodes plain data opcode by opcode and refuses the rest — a
file that names a class is no dump of torch's and is skipped — only from regular files this
user owns (not through a link), at most DUMP_LIMIT bytes each.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Mapping
from typing import Any

from agent.hang.plain_data import NotPlainData, plain_data
from agent.hang.recorder import RankRecorder
from agent.plan.log_dir import nccl_trace_rank

log = logging.getLogger("agent")
DUMP_LIMIT = 32 << 20  # bytes: 2,000 entries with their frames are a few MB
TAIL = 4  # entries per process group kept, as the probe sends them
MAX_DUMPS = 65536  # files read per attempt at most


def recorders(log_dir: str, attempt: int) -> dict[int, RankRecorder]:
    """rank → its recorder, from every dump of `attempt` in `log_dir` ({} when there are none:
    no NCCL, or no collective timed out)."""
    try:
        names = os.listdir(log_dir)
    except OSError:
        return {}
    found: dict[int, RankRecorder] = {}
    for name in names[:MAX_DUMPS]:
        rank = nccl_trace_rank(name, attempt)
        if rank is None:
            continue
        trace = read_dump(os.path.join(log_dir, name))
        if trace is not None:
            found[rank] = recorder_of(trace)
    return found


def read_dump(path: str) -> Mapping[str, Any] | None:
    """The dump's dict; None (logged) when it is not one of ours or not torch's."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        log.warning("cannot read NCCL dump %s: %s", path, exc.strerror or exc)
        return None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            log.warning("NCCL dump %s skipped: not a regular file of this user", path)
            return None
        data = f.read(DUMP_LIMIT + 1)
    if len(data) > DUMP_LIMIT:
        log.warning("NCCL dump %s skipped: over %d MiB", path, DUMP_LIMIT >> 20)
        return None
    try:
        trace = plain_data(data)
    except NotPlainData as exc:
        log.warning("NCCL dump %s skipped: %s", path, str(exc)[:200])
        return None
    return trace if isinstance(trace, dict) else None


def recorder_of(trace: Mapping[str, Any]) -> RankRecorder:
    """torch's flight-recorder dump (pure) → the recorder the probe would have answered: per
    process group the last collective entered and completed, and its last few entries."""
    status = trace.get("pg_status")
    config = trace.get("pg_config")
    status = status if isinstance(status, dict) else {}
    config = config if isinstance(config, dict) else {}
    entries: dict[str, list[Mapping[str, Any]]] = {}
    raw = trace.get("entries")
    for entry in raw if isinstance(raw, list) else []:
        group = entry.get("process_group") if isinstance(entry, dict) else None
        if isinstance(group, (tuple, list)) and group:
            entries.setdefault(str(group[0]), []).append(entry)
    groups = []
    for name, state in status.items():
        if not isinstance(state, dict):
            continue
        mine = entries.get(str(name), [])
        found = config.get(name)
        described = found if isinstance(found, dict) else {}
        desc = described.get("desc") or (mine[-1]["process_group"][1] if mine else "")
        groups.append(
            {
                "name": str(name),
                "desc": str(desc),
                "ranks": _ranks(described.get("ranks")),
                "entered": state.get("last_enqueued_collective", 0) or 0,
                "completed": state.get("last_completed_collective", 0) or 0,
                "last": [_entry(e) for e in mine[-TAIL:]],
            }
        )
    return RankRecorder.from_json({"torch": True, "initialised": True, "groups": groups})


def _ranks(value: object) -> list[int]:
    """NCCL's pg_config names a group's members as the text of a list: "[0, 1, 2, 3]"."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return []
    if isinstance(value, list) and all(isinstance(r, int) for r in value):
        return value
    return []


def _entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "seq": entry.get("collective_seq_id"),
        "op": str(entry.get("profiling_name", "")).rpartition(":")[2],
        "sizes": entry.get("input_sizes"),
        "dtypes": entry.get("input_dtypes"),
        "timeout_ms": entry.get("timeout_ms"),
        "created_ns": entry.get("time_created_ns"),
    }


def dump_findings(log_dir: str, attempt: int, ended: Mapping[int, int]) -> list[str]:
    """The collectives view from the attempt's dumps ([] without any); `ended`: every rank's
    exit code (a rank with a dump is placed by its dump, not by its exit)."""
    from agent.hang.collectives import findings

    found = recorders(log_dir, attempt)
    if not found:
        return []
    return findings(found, {}, {r: code for r, code in ended.items() if r not in found})
