"""Who used the CPU during one timed run: the machine's busy core-seconds (/proc/stat), the
client (this process's reaped children), and, for agents that are this process's descendants,
each agent's own CPU, what it reaped (its ranks: adopted, so their whole CPU lands here when they
exit) and each zygote's own CPU and what it reaped (the middle processes of its forks).

On 2 cores a run whose processes keep both busy cannot end sooner than its CPU ÷ 2: the floor
the breakdown compares each figure with. Linux only (reads /proc)."""

from __future__ import annotations

import os
import resource
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

CLASSES = ("client", "agents", "ranks", "zygotes", "other")
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Snapshot:
    busy: float  # the machine's non-idle core-seconds since boot
    reaped: float  # this process's reaped children's CPU (the client, once it exited)
    tree: Mapping[int, tuple[str, float, float]]  # pid → (kind, own, reaped children) seconds


def snapshot() -> Snapshot:
    tree: dict[int, tuple[str, float, float]] = {}
    for proc in psutil.Process().children(recursive=True):
        found = _times(proc.pid)
        if found is not None:
            tree[proc.pid] = found
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return Snapshot(_busy(), usage.ru_utime + usage.ru_stime, tree)


def split(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """Core-seconds between the two snapshots per class (CLASSES), and "total" (the machine).
    Processes in both snapshots only: agents and zygotes outlive a warm run."""
    found = dict.fromkeys(CLASSES, 0.0)
    found["client"] = after.reaped - before.reaped
    for pid, (kind, own, reaped) in after.tree.items():
        if pid not in before.tree or before.tree[pid][0] != kind:
            continue
        own -= before.tree[pid][1]
        reaped -= before.tree[pid][2]
        if kind == "agent":
            found["agents"] += own
            found["ranks"] += reaped
        elif kind == "zygote":
            found["zygotes"] += own + reaped
    found["total"] = after.busy - before.busy
    named = sum(found[k] for k in CLASSES if k != "other")
    found["other"] = max(0.0, found["total"] - named)  # the bench, other users of the machine
    return found


def _busy() -> float:
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / _TICK  # less idle and iowait


def _times(pid: int) -> tuple[str, float, float] | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            argv = cmdline.read().split(b"\0")
    except OSError:
        return None
    kind = "zygote" if any(a.endswith(b"zygote_main.py") for a in argv) else "other"
    if kind == "other" and b"agent" in argv and b"serve" in argv:
        kind = "agent"
    own = (int(fields[11]) + int(fields[12])) / _TICK
    reaped = (int(fields[13]) + int(fields[14])) / _TICK
    return kind, own, reaped
