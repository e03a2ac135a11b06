"""Doctor: what this node offers a job (GPUs, NUMA, NICs, RoCE GIDs, env) and what to set."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from agent.doctor.advice import advise
from agent.doctor.facts import Gid, read_facts
from agent.run.leftovers import DEVICE_ROOT_ENV, LeftoverAudit

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["Gid", "advise", "main", "read_facts"]  # Gid, advise, read_facts: for tests and callers


def main(
    argv: list[str], env: Mapping[str, str], root: Path = Path("/"), console: Console | None = None
) -> int:
    from rich.console import Console

    from agent.doctor.report import render

    parser = argparse.ArgumentParser(prog="python -m agent doctor", description=__doc__)
    parser.add_argument(
        "--sysfs-root", type=Path, default=root, help="the directory holding sys/ (default: /)"
    )
    parser.add_argument(
        "--device-root",
        default=env.get(DEVICE_ROOT_ENV) or "/dev",
        help="where the NVIDIA device files are (default: /dev)",
    )
    args = parser.parse_args(argv)
    facts = read_facts(args.sysfs_root, env)
    # Who holds this node's GPUs now (a job's leftovers, another user's process): the driver's
    # daemons left out; another user's open files only where /proc lets us read them (root).
    holders = LeftoverAudit("", None, args.device_root).scan().foreign
    render(facts, advise(facts), console or Console(), holders)
    return 0
