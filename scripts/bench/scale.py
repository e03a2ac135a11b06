"""9. Scale: N simulated nodes (8 fake ranks each) on this one machine, end to end, N = 256,
1024, 4096 (--quick: 256 and 1024).

Per N: the end-to-end run (scale_e2e: node 0's real agent in its own process, the other N-1
real agents as threads in light processes, the real store and protocol, fake ranks); then the
log dir it left gets every rank's files (8 per node, 2 streams, tiny) and a fresh process times
node 0's verdict and summary over those results, `agent logs --summary` and `agent logs -n 5`
in process, and `stacks` collation of every rank (scale_offline); the two `agent logs` commands
are also timed as the user runs them (a fresh interpreter each).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bench import common as c
from bench import scale_e2e
from bench.stats import Table, Target, secs

SIZES = (256, 1024, 4096)
QUICK = (256, 1024)


def _cli(argv: list[str], cwd: Path) -> dict[str, Any]:
    t = time.monotonic()
    done = subprocess.run(
        [c.PY, "-m", "agent", "logs", *argv],
        env=c.base_env(),
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=300,
    )
    return {"s": time.monotonic() - t, "code": done.returncode, "err": done.stderr[-300:].decode()}


def _offline(log_dir: str, n: int, work: Path) -> dict[str, Any]:
    done = subprocess.run(
        [c.PY, c.program("scale_offline"), log_dir, str(n)],
        env=c.base_env(LA_SCALE_REPS="2"),
        cwd=work,
        capture_output=True,
        timeout=400,
    )
    for line in done.stdout.decode().splitlines():
        if line.startswith("{"):
            return json.loads(line)
    return {"error": done.stderr.decode()[-500:]}


def run(sizes: tuple[int, ...], idle_s: float, budget: c.Budget, work: Path, log) -> dict[str, Any]:
    rows = []
    for n in sizes:
        if rows and budget.left() < 30:
            rows.append({"n": n, "error": "not run: the section's time was spent"})
            continue
        started = time.monotonic()
        row = scale_e2e.measure(n, work, idle_s, log)
        log_dir = row.get("log_dir")
        if log_dir and Path(log_dir, "summary.json").exists():
            row["rank_files_s"] = scale_e2e.rank_files(Path(log_dir), n * 8)
            row["offline"] = _offline(log_dir, n, work)
            row["cli_summary"] = _cli([log_dir, "--summary"], work)
            row["cli_tail5"] = _cli([log_dir, "-n", "5"], work)
            off = row["offline"]
            log(
                f"scale {n}: verdict+summary {secs(off.get('verdict', {}).get('total_s'), 3)}, "
                f"logs --summary {secs(row['cli_summary']['s'])} (in process "
                f"{secs(off.get('logs', {}).get('summary_s'), 3)}), logs -n 5 "
                f"{secs(row['cli_tail5']['s'])}, stacks {secs(off.get('stacks', {}).get('total_s'))}"
            )
        row["cell_s"] = time.monotonic() - started
        shutil.rmtree(work / f"scale-{n}", ignore_errors=True)  # 64K files at 4096
        rows.append(row)
    return {"rows": rows, "idle_s": idle_s}


def _get(row: dict[str, Any], *path: str) -> Any:
    value: Any = row
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} %"


COLUMNS = [
    ("joined (barrier)", lambda r: secs(r.get("join_s"))),
    ("signed plan on every agent", lambda r: secs(r.get("payload_s"))),
    ("ranks started everywhere", lambda r: secs(r.get("started_s"))),
    ("CPU to start, per agent", lambda r: _per_agent(r, "startup_cpu_s")),
    ("… less idle × start time", lambda r: _beyond_idle(r)),
    ("reference work's CPU", lambda r: _ms(r.get("reference_cpu_ms"))),
    ("store queries to start, per agent", lambda r: _queries(r)),
    ("node 0 idle CPU", lambda r: _pct(r.get("leader_cpu_pct"))),
    ("node 0 fds", lambda r: str(r.get("leader_fd_count", "n/a"))),
    ("abort → all saw it", lambda r: secs(r.get("fanout_s"), 3)),
    ("CPU to see it, per agent", lambda r: _per_agent(r, "abort_cpu_s")),
    ("results → summary.json", lambda r: secs(r.get("summary_s"), 3)),
    ("every agent has the verdict", lambda r: secs(r.get("verdict_all_s"))),
    ("verdict+summary (node 0 work)", lambda r: secs(_get(r, "offline", "verdict", "total_s"), 3)),
    ("`logs --summary`", lambda r: secs(_get(r, "cli_summary", "s"))),
    ("`logs -n 5`", lambda r: secs(_get(r, "cli_tail5", "s"))),
    ("stacks parse+collate", lambda r: secs(_get(r, "offline", "stacks", "total_s"))),
]


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} ms"


def _per_agent(row: dict[str, Any], key: str) -> str:
    cpu = row.get(key)
    return "n/a" if cpu is None else f"{1000 * cpu / row['n']:.2f} ms"


def _queries(row: dict[str, Any]) -> str:
    """What one agent other than node 0 asked of the store from release to ranks started
    (queries and connects, the mean of one light process's agents), its heartbeats apart: they
    are paced by the clock, so a start that 2 cores make long has more of them."""
    ops = row.get("startup_ops")
    if not ops or not ops[1]:
        return "n/a"
    beats = sum(v for k, v in ops[1].items() if k.startswith("heartbeat "))
    return f"{sum(ops[1].values()) - beats:.1f} + {beats:.1f} beats"


def _beyond_idle(row: dict[str, Any]) -> str:
    """The start's CPU per agent less what every agent would have spent idle over the start's
    wall time (node 0's and the others' idle rates, measured after the start): the work that
    starting costs, apart from the background threads' cost of a start that 2 cores make long."""
    cpu, wall = row.get("startup_cpu_s"), row.get("started_s")
    node0, others = row.get("leader_cpu_pct"), row.get("followers_cpu_pct")
    if None in (cpu, wall, node0, others):
        return "n/a"
    return f"{1000 * (cpu - (node0 + others) / 100 * wall) / row['n']:.2f} ms"


def _ratio(row: dict[str, Any], base: dict[str, Any], per_reference: bool = False) -> float | None:
    """CPU to start per agent at `row`'s size ÷ at `base`'s; `per_reference`: each first
    divided by its size's reference work CPU (the machine's cost of one operation there)."""
    mine, theirs = row.get("startup_cpu_s"), base.get("startup_cpu_s")
    if mine is None or theirs is None:
        return None
    ratio = (mine / row["n"]) / (theirs / base["n"])
    if per_reference:
        unit, unit_base = row.get("reference_cpu_ms"), base.get("reference_cpu_ms")
        if not unit or not unit_base:
            return None
        ratio /= unit / unit_base
    return ratio


def summarize(data: dict[str, Any]) -> tuple[list[Table], list[Target], dict[str, Any]]:
    rows = data["rows"]
    table = Table(
        "9. Scale: N simulated nodes × 8 fake ranks on this machine (node 0's agent in its own "
        "process, the others as threads in light processes; real store, protocol and node-0 code)",
        ["N (ranks)", *(name for name, _ in COLUMNS)],
    )
    for row in rows:
        if "error" in row and "fanout_s" not in row:
            table.add(
                f"{row['n']} ({row['n'] * 8})", *([row["error"][:80]] + ["-"] * (len(COLUMNS) - 1))
            )
            continue
        table.add(f"{row['n']} ({row['n'] * 8})", *(fmt(row) for _, fmt in COLUMNS))
    table.notes += [
        "times from the release of every agent at once (join, plan, ranks) or from the failing "
        "rank's exit (abort); 'all saw it' = the last agent's supervisor tearing its ranks down; "
        "the fake ranks then die when every agent has seen the abort (so one node's teardown "
        "does not compete with the others' wake-up: here they share 2 cores); 'results → "
        "summary.json' = from the last node's result in the store to summary.json's mtime",
        f"node 0 idle CPU: its process (store server included) over {data['idle_s']:g} s while "
        "every agent heartbeats and its ranks run; 'CPU to start, per agent' = every process's "
        "CPU from release to ranks started, divided by N (what one real node would spend); "
        "'… less idle × start time' takes from it every agent's idle CPU (the rate measured "
        "in the idle window, node 0's and the others') over the start's wall time: what the "
        "start itself costs, apart from the background threads (heartbeat, collectives watch) "
        "running for as long as 2 cores make a start of N agents last",
        "reference work: the same few records sealed and opened and store queries, done by "
        "every agent once right after it joined, under the start's load (median CPU); its "
        "growth from 1,024 agents to N is what N agents sharing 2 cores add to every "
        "operation (threads, processes, caches), not what an agent does more of; it is taken "
        "out of the start's CPU; 'store queries to start': what one agent other than node 0 "
        "sent node 0's store from release to ranks started (every query and connect, the "
        "mean of one light process's agents), its heartbeats apart (one every 2 s at 1,024, "
        "8 s at 4,096: their number follows the start's wall time)",
        "--heartbeat-timeout 6 s (the default) up to 256 agents, 60 s above (thousands of "
        "agent threads on 2 cores can keep one from running for more than 6 s); above 3,948 "
        "agents the others' failure reports share their main connection (node 0 serves 4 "
        "connections per agent instead of 5: 5 would pass this machine's 20,000 fds)",
        "verdict+summary, `logs`, stacks: the log dir the run left (summary.json, ranks.json, "
        "one agent log per node) plus 2 tiny files per rank; `logs` wall times include the "
        "interpreter start (a fresh `python -m agent logs` each)",
    ]
    targets: list[Target] = []
    big = max((r for r in rows if "fanout_s" in r), key=lambda r: r["n"], default=None)
    if big is not None:
        n = big["n"]
        for name, wanted, value, limit in (
            (f"join + payload on every agent, {n} agents", "≤ 5 s", big.get("payload_s"), 5.0),
            (f"node 0 idle, {n} heartbeating peers", "≤ 10 % of a core", big.get("leader_cpu_pct"), 10.0),
            (f"abort fan-out, {n} agents", "≤ 1 s", big.get("fanout_s"), 1.0),
            (f"verdict + summary of {n * 8} ranks", "≤ 1 s", big.get("summary_s"), 1.0),
            (f"`agent logs --summary`, {n * 8} ranks", "≤ 1 s", _get(big, "cli_summary", "s"), 1.0),
        ):  # fmt: skip
            shown = _pct(value) if "%" in wanted else secs(value, 3)
            targets.append(Target(name, wanted, shown, None if value is None else value <= limit))
        base = next((r for r in rows if r["n"] == 1024 and "fanout_s" in r), None)
        if base is not None and n > 1024:
            for name, ratio in (
                (f"CPU to start per agent, {n} ÷ 1,024", _ratio(big, base)),
                ("… per unit of the reference work's CPU", _ratio(big, base, per_reference=True)),
            ):
                shown = "n/a" if ratio is None else f"{ratio:.2f}×"
                targets.append(
                    Target(name, "≤ 1.2×", shown, None if ratio is None else ratio <= 1.2)
                )
    return [table], targets, {"rows": rows}
