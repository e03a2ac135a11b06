"""Benchmarks of launch-agent against torchrun on one machine (loopback nodes, CPU, gloo).

    python scripts/bench.py [--quick] [--out bench-results] [--only launch,teardown,...]
    python scripts/bench.py --only scale [--quick]   # not in the default run (~3 min; --quick <1)
    python scripts/bench.py --only debug             # not in the default run (~10 s)
    python scripts/bench.py --only recorder          # not in the default run (~40 s)

Writes a markdown report to stdout and <out>/bench.md, raw numbers to <out>/bench.json.
Sections: launch overhead, teardown latency, rendezvous scale (+ reverse DNS), tee throughput,
CLI start, steady-state agent cost, relaunch latency (resident agents, warm ranks), hang detection
and `agent stacks`, node loss → the next attempt on a hot spare, lifelines at 4,096 agents,
refusals of hostile input; on request only (`--only NAME`): scale, metrics (one scrape of node
0's /metrics against its pace look), warm fork (what adopting warm ranks costs),
`agent debug` (a pdb line to a paused rank).
Each section has a time budget; repetitions stop when it is spent (every cell still gets at least
one run), so the whole run stays under 10 minutes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import (  # noqa: E402
    cli_start,
    debug,
    hang,
    launch,
    lifelines,
    metrics,
    node_loss,
    rdzv,
    recorder,
    refusals,
    relaunch,
    scale,
    steady,
    teardown,
    tee,
    warm_fork,
)
from bench import common as c  # noqa: E402
from bench.stats import Table, Target, targets_table  # noqa: E402

SECTIONS = (
    "launch",
    "teardown",
    "rdzv",
    "tee",
    "cli",
    "steady",
    "relaunch",
    "hang",
    "nodeloss",
    "lifelines",
    "refusals",
    "scale",
    "metrics",
    "warmfork",
    "debug",
    "recorder",
)
# Sections run only when --only names them: scale alone takes 2.5-4.5 minutes (--quick: < 1);
# warmfork measures one design choice of agent.warm (what adopting warm ranks costs).
ON_REQUEST = ("scale", "metrics", "warmfork", "debug", "recorder")
# What each section costs with one repetition per cell on this machine (seconds, loaded); the
# sections before it keep this much of the run's time free for it.
MIN_COST = {
    "launch": 150,
    "teardown": 85,
    "rdzv": 70,
    "tee": 55,
    "cli": 20,
    "steady": 30,
    "relaunch": 120,
    "hang": 50,
    "nodeloss": 60,
    "lifelines": 25,
    "refusals": 5,
    "scale": 60,
    "metrics": 30,
    "warmfork": 60,
    "debug": 20,
    "recorder": 40,
}
RUN_SECONDS = 560  # the whole run; the hard limit is 10 minutes


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--quick", action="store_true", help="one repetition per cell, shorter caps (~6 min)"
    )
    p.add_argument("--out", default="bench-results", help="directory for bench.md and bench.json")
    default = [s for s in SECTIONS if s not in ON_REQUEST]
    p.add_argument(
        "--only",
        default=",".join(default),
        help=f"comma list of sections: {','.join(SECTIONS)} (default: all but {','.join(ON_REQUEST)})",
    )
    p.add_argument(
        "--keep", action="store_true", help="keep the scratch directory (logs of every run)"
    )
    args = p.parse_args(argv)
    args.sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        p.error(f"unknown section(s) {', '.join(sorted(unknown))}; valid: {', '.join(SECTIONS)}")
    return args


def machine_facts() -> dict[str, Any]:
    import torch  # only for its version; the benchmarks start their own processes

    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "kernel": platform.release(),
        "machine": platform.machine(),
        "gpu": bool(torch.cuda.is_available()),
        "loadavg_start": os.getloadavg(),
    }


def compile_bytecode() -> list[str]:
    """Our packages' bytecode written once, as installing the wheel leaves it: in an editable
    install under PYTHONDONTWRITEBYTECODE=1 (this sandbox's) every fresh interpreter (each
    client, each cold rank) would otherwise compile every module of ours it imports (0.07-0.1 s
    of a client's start); pip wrote the dependencies' bytecode when it installed them."""
    import compileall

    packages = [c.REPO / name for name in ("agent", "bootstrap", "scripts/bench")]
    for package in packages:
        compileall.compile_dir(package, quiet=1)
    return [str(p.relative_to(c.REPO)) for p in packages]


def plan(quick: bool) -> dict[str, Any]:
    """Repetitions and budgets (seconds) per section; a budget caps repetitions, never cells."""
    if quick:
        return {
            "launch": {"sizes": [1, 4, 8], "reps": {1: 1, 4: 1, 8: 1}, "budget": 100},
            "teardown": {"ours_reps": 1, "torchrun_reps": 1, "budget": 90},
            "rdzv": {"reps": 1, "torch_cap": 20.0, "budget": 60},
            "tee": {"reps": 1, "budget": 60, "lines": 1_000_000, "bulk_mib": 64},
            "cli": {"reps": 5},
            "steady": {"seconds": 10.0},
            "relaunch": {"rounds": 1, "warm_per_round": 5, "slurm_warm": 5, "budget": 120},
            "hang": {"sizes": [2, 8], "rounds": 1, "stacks_reps": [3, 3], "budget": 60},
            "nodeloss": {"sizes": [4], "reps": 1, "budget": 60},
            "lifelines": {"sizes": [4096], "idle_s": 3.0},
            "refusals": {"tries": 1},
            "scale": {"sizes": list(scale.QUICK), "idle_s": 3.0, "budget": 60},
            "metrics": {"sizes": [64, 1024], "reps": 10},
            "warmfork": {"reps": 3},
            "debug": {"reps": 5},
            "recorder": {"reps": 10},
        }
    return {
        "launch": {"sizes": [1, 4, 8], "reps": {1: 3, 4: 3, 8: 2}, "budget": 280},
        "teardown": {"ours_reps": 3, "torchrun_reps": 1, "budget": 100},
        "rdzv": {"reps": 3, "torch_cap": 30.0, "budget": 75},
        "tee": {"reps": 2, "budget": 100, "lines": 1_000_000, "bulk_mib": 64},
        "cli": {"reps": 10},
        "steady": {"seconds": 20.0},
        "relaunch": {"rounds": 2, "warm_per_round": 6, "slurm_warm": 8, "budget": 150},
        "hang": {"sizes": [2, 8], "rounds": 3, "stacks_reps": [3, 5], "budget": 110},
        "nodeloss": {"sizes": [4, 8], "reps": 2, "budget": 150},
        "lifelines": {"sizes": [4096], "idle_s": 5.0},
        "refusals": {"tries": 5},
        "scale": {"sizes": list(scale.SIZES), "idle_s": 5.0, "budget": 300},
        "metrics": {"sizes": [64, 1024, 4096], "reps": 40},
        "warmfork": {"reps": 10},
        "debug": {"reps": 10},
        "recorder": {"reps": 20},
    }


def run_section(
    name: str, cfg: dict[str, Any], work: Path, raw: dict[str, Any], sections: list[str]
) -> dict[str, Any]:
    later = sections[sections.index(name) + 1 :]
    overlapped = "steady" if "teardown" in sections and "steady" in sections else None
    reserve = sum(MIN_COST[s] for s in later if s != overlapped)
    budget = c.Budget(cfg[name].get("budget", 600), reserve)
    mine = cfg[name]
    if name == "launch":
        return launch.run(mine["sizes"], mine["reps"], budget, work, log)
    if name == "teardown":
        during = None
        if (
            "steady" in sections
        ):  # the steady-state run fits in torchrun's idle 60 s cap: overlap them

            def during() -> None:
                raw["steady"] = steady.run(cfg["steady"]["seconds"], work, log)

        return teardown.run(mine["ours_reps"], mine["torchrun_reps"], budget, work, log, during)
    cfg = mine
    if name == "rdzv":
        return rdzv.run(cfg["reps"], cfg["torch_cap"], budget, work, log)
    if name == "tee":
        return tee.run(cfg["reps"], cfg["lines"], cfg["bulk_mib"], budget, work, log)
    if name == "cli":
        return cli_start.run(cfg["reps"], work, log)
    if name == "relaunch":
        return relaunch.run(
            cfg["rounds"], cfg["warm_per_round"], cfg["slurm_warm"], budget, work, log
        )
    if name == "debug":
        return debug.run(cfg["reps"], work, log)
    if name == "recorder":
        return recorder.run(cfg["reps"], work, log)
    if name == "hang":
        return hang.run(cfg["sizes"], cfg["rounds"], tuple(cfg["stacks_reps"]), budget, work, log)
    if name == "scale":
        return scale.run(tuple(cfg["sizes"]), cfg["idle_s"], budget, work, log)
    if name == "nodeloss":
        return node_loss.run(cfg["sizes"], cfg["reps"], budget, work, log)
    if name == "lifelines":
        return lifelines.run(tuple(cfg["sizes"]), cfg["idle_s"], work, log)
    if name == "refusals":
        return refusals.run(cfg["tries"], work, log)
    if name == "metrics":
        return metrics.run(cfg["sizes"], cfg["reps"], work, log)
    if name == "warmfork":
        return warm_fork.run(cfg["reps"], work, log)
    return steady.run(cfg["seconds"], work, log)


SUMMARIZERS: dict[
    str, Callable[[dict[str, Any]], tuple[Table | list[Table], list[Target], Any]]
] = {
    "launch": launch.summarize,
    "teardown": teardown.summarize,
    "rdzv": rdzv.summarize,
    "tee": tee.summarize,
    "cli": cli_start.summarize,
    "steady": steady.summarize,
    "relaunch": relaunch.summarize,
    "hang": hang.summarize,
    "nodeloss": node_loss.summarize,
    "lifelines": lifelines.summarize,
    "refusals": refusals.summarize,
    "scale": scale.summarize,
    "metrics": metrics.summarize,
    "warmfork": warm_fork.summarize,
    "debug": debug.summarize,
    "recorder": recorder.summarize,
}


def render(facts: dict[str, Any], tables: list[Table], targets: list[Target], quick: bool) -> str:
    head = [
        "## Benchmark run" + (" (--quick)" if quick else ""),
        "",
        f"- date: {facts['date']}; total wall {facts['total_s']:.0f} s",
        f"- machine: {facts['cores']} cores ({facts['usable_cores']} usable), {facts['machine']}, kernel "
        f"{facts['kernel']}, GPU: {'yes' if facts['gpu'] else 'none'}",
        f"- python {facts['python']}, torch {facts['torch']}",
        f"- load average at start {_load(facts['loadavg_start'])}, at end {_load(facts['loadavg_end'])} "
        "(the machine is shared: compare ratios within this run, not across runs)",
        f"- bytecode compiled before the run: {', '.join(facts.get('bytecode_compiled', [])) or 'no'}"
        " (as a wheel install leaves it; the dependencies' by pip)",
        "",
    ]
    body = [targets_table(targets).markdown()] + [t.markdown() for t in tables]
    return "\n".join(head) + "\n" + "\n".join(body)


def _load(values: Any) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    c.install_cleanup()
    t0 = time.monotonic()
    c.DEADLINE = t0 + RUN_SECONDS
    facts = machine_facts()
    facts["bytecode_compiled"] = compile_bytecode()
    work = Path(tempfile.mkdtemp(prefix="la-bench-"))
    log(f"scratch dir {work}; sections {', '.join(args.sections)}")
    cfg = plan(args.quick)
    raw: dict[str, Any] = {}
    try:
        for name in args.sections:
            if name in raw:
                continue  # already measured alongside another section
            started = time.monotonic()
            raw[name] = run_section(name, cfg, work, raw, args.sections)
            raw[name]["section_s"] = time.monotonic() - started
            log(f"{name}: done in {raw[name]['section_s']:.0f} s")
            strays = c.cleanup()
            if strays:
                log(f"{name}: killed {strays} stray process(es)")
    finally:
        c.cleanup()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    facts["loadavg_end"] = os.getloadavg()
    facts["total_s"] = time.monotonic() - t0
    tables: list[Table] = []
    targets: list[Target] = []
    summaries: dict[str, Any] = {}
    for name in args.sections:
        table, found, summaries[name] = SUMMARIZERS[name](raw[name])
        tables += table if isinstance(table, list) else [table]
        targets += found
    text = render(facts, tables, targets, args.quick)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.md").write_text(text)
    document = {
        "facts": facts,
        "plan": cfg,
        "raw": raw,
        "summary": summaries,
        "targets": [t.__dict__ for t in targets],
    }
    (out / "bench.json").write_text(json.dumps(document, indent=1, default=str))
    print(text)
    log(f"wrote {out / 'bench.md'} and {out / 'bench.json'} in {facts['total_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
