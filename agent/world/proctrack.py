"""Whether Slurm itself signals the ranks of a step, so that the agent must not do it again.

srun passes the signals it gets (and `scancel --signal` sends its own) to slurmstepd, which
signals the step through its proctrack plugin:
- proctrack/cgroup (Slurm's default and the usual choice) signals only the tasks, our agents;
- proctrack/pgid signals each task's process group, which the ranks (own sessions) are not in;
- proctrack/linuxproc signals every descendant of the step: the ranks have the signal already.
A rank that gets USR2 twice can die of the second copy: CPython puts back the default action
(terminate) while it exits, so a rank that checkpointed on the first and is exiting is killed
by the second — a preemption warning turned into a failure.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from agent.world.env import lookup

# Where slurm.conf is when SLURM_CONF is not set: the configless cache of slurmd, the default.
CONF_PATHS = ("/run/slurm/conf/slurm.conf", "/etc/slurm/slurm.conf")
CONF_LIMIT = 1 << 20  # bytes read at most: ProctrackType sits near the top of any real file
DESCENDANTS = "proctrack/linuxproc"


def proctrack_type(text: str) -> str | None:
    """ProctrackType in slurm.conf's text, lowercased; None when it is not set (the last wins,
    keys are case-insensitive, `#` starts a comment)."""
    found = None
    for line in text.splitlines():
        key, sep, value = line.split("#", 1)[0].partition("=")
        if sep and key.strip().lower() == "proctracktype":
            found = value.strip().strip("\"'").lower() or None
    return found


def conf_paths(environ: Mapping[str, str]) -> tuple[str, ...]:
    given = environ.get("SLURM_CONF", "").strip()
    return (given,) if given else CONF_PATHS


def ancestor_names(pid: int = 0, limit: int = 64) -> list[str]:
    """The command names (`comm`) of this process's ancestors, parent first, as far as /proc
    shows them (a container's pid namespace ends the chain early)."""
    names: list[str] = []
    pid = pid or os.getpid()
    for _ in range(limit):
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                text = stat.read().decode(errors="replace")
        except OSError:
            break
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ')' ends it
        ppid = int(text[text.rindex(")") + 1 :].split()[1])
        if ppid <= 0:
            break
        try:
            with open(f"/proc/{ppid}/comm", encoding="utf-8", errors="replace") as comm:
                names.append(comm.read().strip())
        except OSError:
            break
        pid = ppid
    return names


def slurm_signals_ranks(
    environ: Mapping[str, str], ancestors: Callable[[], list[str]] = ancestor_names
) -> bool:
    """True only inside a Slurm job step — started under slurmstepd, not merely with SLURM_*
    in the env (as agents simulated on one machine are) — whose slurm.conf says
    proctrack/linuxproc; False otherwise (then the agent passes signals on itself)."""
    if lookup(environ, "SLURM_STEP_ID", "SLURM_STEPID") is None:
        return False
    if "slurmstepd" not in ancestors():
        return False
    for path in conf_paths(environ):
        try:
            with open(path, encoding="utf-8", errors="replace") as conf:
                text = conf.read(CONF_LIMIT)
        except OSError:
            continue
        return proctrack_type(text) == DESCENDANTS
    return False
