"""Doctor: what this node offers a job (GPUs, NUMA, NICs, RoCE GIDs, env) and what to set."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from agent.doctor.advice import advise
from agent.doctor.facts import Gid, read_facts

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
    facts = read_facts(parser.parse_args(argv).sysfs_root, env)
    render(facts, advise(facts), console or Console())
    return 0
