"""5. CLI start: wall time of the --help paths (they must never import torch)."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Any

from bench import common as c
from bench.stats import Table, Target, median, secs, spread

COMMANDS = {
    "python -c pass (interpreter floor)": ["-c", "pass"],
    "python -m agent --help": ["-m", "agent", "--help"],
    "python -m agent logs --help": ["-m", "agent", "logs", "--help"],
    "python -m bootstrap --help": ["-m", "bootstrap", "--help"],
}
REFERENCE = {"torchrun --help (reference)": ["-m", "torch.distributed.run", "--help"]}
TARGETED = ("python -m agent --help", "python -m agent logs --help", "python -m bootstrap --help")


def time_once(args: list[str], work: Path) -> tuple[float, int]:
    t0 = time.monotonic()
    proc = subprocess.run(
        [c.PY, *args],
        env=c.base_env(),
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    return time.monotonic() - t0, proc.returncode


def imports_torch(args: list[str], work: Path) -> bool:
    """Whether the command imports torch (checked once, untimed, with -X importtime)."""
    proc = subprocess.run(
        [c.PY, "-X", "importtime", *args],
        env=c.base_env(),
        cwd=work,
        capture_output=True,
        timeout=60,
    )
    return re.search(rb"\|\s+torch(\.|$)", proc.stderr, re.MULTILINE) is not None


def run(reps: int, work: Path, log) -> dict[str, Any]:
    rows = {}
    plan = [(name, args, reps) for name, args in COMMANDS.items()]
    plan += [(name, args, min(reps, 2)) for name, args in REFERENCE.items()]
    for name, args, count in plan:
        time_once(args, work)  # warm the page cache once, untimed
        samples = [time_once(args, work) for _ in range(count)]
        rows[name] = {
            "times": [t for t, _ in samples],
            "codes": sorted({code for _, code in samples}),
            "imports_torch": imports_torch(args, work) if name in TARGETED else None,
        }
        log(f"cli: {name}: median {median(rows[name]['times']):.3f} s")
    return {"rows": rows}


def summarize(data: dict[str, Any]) -> tuple[Table, list[Target], dict[str, Any]]:
    table = Table(
        "5. CLI start (wall, fresh interpreter each time; one untimed warm-up run)",
        ["command", "runs", "median", "min–max", "exit code", "imports torch"],
    )
    targets, summary = [], {}
    for name, row in data["rows"].items():
        med = median(row["times"])
        torch_cell = (
            "-" if row["imports_torch"] is None else ("YES" if row["imports_torch"] else "no")
        )
        table.add(
            f"`{name}`",
            len(row["times"]),
            secs(med, 3),
            spread(row["times"]),
            ",".join(map(str, row["codes"])),
            torch_cell,
        )
        summary[name] = med
        if name in TARGETED:
            targets.append(
                Target(f"CLI start: {name}", "< 0.3 s", secs(med, 3), med is not None and med < 0.3)
            )
    return table, targets, summary
