"""3. Rendezvous scale: N agents against one store, ours (O(1) ops) vs torch's c10d dynamic
rendezvous handler; and the reverse-DNS effect on a 64-client connect storm."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from bench import common as c
from bench.stats import Table, Target, median, ratio, secs, spread, times

OURS = [
    "ours:proc:64:2",
    "ours:proc:256:2",
    "null:proc:64:1",
    "null:proc:256:1",
    "ours:thread:64",
    "ours:thread:256",
    "ours:thread:1024",
]
TORCH = [
    ("torch:proc:64", 2),
    ("torch:thread:64", 1),
    ("torch:proc:256", 1),
    ("torch:thread:1024", 1),
]
CELLS = [("proc", 64), ("proc", 256), ("thread", 64), ("thread", 256), ("thread", 1024)]
STORM_N = 64


def measure(
    specs: list[str], reps: int, cap: float, work: Path, tag: str, dnsfix: bool = True
) -> list[dict]:
    """Run rdzv_worker.py in a fresh process (the DNS flag is process-wide) and parse its lines."""
    argv = [c.PY, c.program("rdzv_worker"), ",".join(specs), str(reps), str(cap)]
    if not dnsfix:
        argv = _dropping_resolver(work) + argv + ["--no-dnsfix", "--swallow-dns"]
    out = work / f"rdzv-{tag}.log"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            argv,
            env=c.base_env(),
            stdout=subprocess.PIPE,
            stderr=sink,
            stdin=subprocess.DEVNULL,
            cwd=work,
            start_new_session=True,
        )
    c._LIVE.append(proc)
    try:
        stdout, _ = proc.communicate(timeout=60 + len(specs) * reps * (cap + 10))
    except subprocess.TimeoutExpired:
        stdout = b""
    finally:
        c.kill_group([proc])
    rows = [json.loads(line) for line in stdout.decode().splitlines() if line.startswith("{")]
    if not rows:
        rows = [{"error": c.tail(out), "specs": specs}]
    return rows


def _dropping_resolver(work: Path) -> list[str]:
    """Run in a private network + mount namespace whose resolver (127.0.0.1:53, served by the
    worker) drops every query: the slow-DNS case, reproduced without a packet leaving loopback."""
    resolv = work / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\n")
    script = 'ip link set lo up && mount --bind "$0" /etc/resolv.conf && exec "$@"'
    return ["unshare", "--mount", "--net", "sh", "-c", script, str(resolv)]


def _spec(spec: str) -> tuple[str, str, int]:
    protocol, driver, n = spec.split(":")
    return protocol, driver, int(n)


def run(reps: int, torch_cap: float, budget: c.Budget, work: Path, log) -> dict[str, Any]:
    rows = measure(OURS, reps, 60.0, work, "ours")
    log(
        "rdzv: "
        + ", ".join(
            f"{r.get('protocol')} {r.get('driver')} {r.get('n')}: {secs(r.get('total_s'), 3)}"
            for r in rows
        )
    )
    for spec, wanted in TORCH:
        protocol, driver, n = _spec(spec)
        smaller = [
            r
            for r in rows
            if r.get("protocol") == "torch" and r.get("n", n) < n and r.get("n", 0) > 64
        ]
        if smaller and not all(r.get("finished") for r in smaller):
            rows.append(
                {
                    "protocol": "torch",
                    "driver": driver,
                    "n": n,
                    "skipped": f"not run: {smaller[-1]['n']} agents already did not finish in {torch_cap:.0f} s",
                }
            )
            continue
        got = measure([spec], min(reps, wanted), torch_cap, work, f"torch{n}")
        log(
            f"rdzv: torch {driver} {n}: "
            + ", ".join(
                secs(r.get("total_s"))
                if r.get("finished")
                else f"did not finish ({r.get('done')}/{n} done)"
                for r in got
            )
        )
        rows += got
    for dnsfix in (True, False):
        got = measure([f"storm:thread:{STORM_N}"], 1, 40.0, work, f"storm-{dnsfix}", dnsfix=dnsfix)
        log(f"rdzv: connect storm {STORM_N}, dnsfix={dnsfix}: {secs(got[0].get('total_s'))}")
        rows += got
    return {"rows": rows, "torch_cap_s": torch_cap}


def _cell(
    rows: list[dict], protocol: str, driver: str, n: int, cap: float
) -> tuple[str, float | None, dict]:
    mine = [
        r
        for r in rows
        if r.get("protocol") == protocol and r.get("driver") == driver and r.get("n") == n
    ]
    if not mine:
        return "not run", None, {}
    if "skipped" in mine[0]:
        return mine[0]["skipped"], None, mine[0]
    done = [r["total_s"] for r in mine if r.get("finished")]
    if len(done) < len(mine):
        bad = next(r for r in mine if not r.get("finished"))
        why = f"; {bad['errors'][0]}" if bad.get("errors") else ""
        return f"did not finish in {cap:.0f} s ({bad.get('done')}/{n} agents done{why})", None, bad
    value = median(done)
    text = f"{value:.3f} s" + (f" ({spread(done)})" if len(done) > 1 else "")
    return text, value, mine[-1]


def _ops(row: dict) -> str:
    return "-" if row.get("ops_mean") is None else f"{row['ops_mean']:.1f} ({row['ops_max']})"


def summarize(data: dict[str, Any]) -> tuple[list[Table], list[Target], dict[str, Any]]:
    rows, cap = data["rows"], data["torch_cap_s"]
    table = Table(
        "3. Rendezvous scale (N agents, one store on 127.0.0.1; release → last agent done)",
        [
            "N",
            "driver",
            "ours",
            "torch c10d handler",
            "torch/ours",
            "driver alone (no store)",
            "store ops per agent: ours",
            "torch",
        ],
    )
    summary: dict[str, Any] = {}
    targets = []
    for driver, n in CELLS:
        ours_text, ours_s, ours_row = _cell(rows, "ours", driver, n, 60.0)
        has_torch = any(
            r.get("protocol") == "torch" and r.get("driver") == driver and r.get("n") == n
            for r in rows
        )
        torch_text, torch_s, torch_row = (
            _cell(rows, "torch", driver, n, cap) if has_torch else ("-", None, {})
        )
        speedup = ratio(torch_s, ours_s)
        if torch_s is None and ours_s and torch_text.startswith("did not finish"):
            shown = f"> {cap / ours_s:.0f}×"
        else:
            shown = times(speedup)
        has_null = any(
            r.get("protocol") == "null" and r.get("driver") == driver and r.get("n") == n
            for r in rows
        )
        null_text = _cell(rows, "null", driver, n, 60.0)[0] if has_null else "-"
        table.add(
            n, driver, ours_text, torch_text, shown, null_text, _ops(ours_row), _ops(torch_row)
        )
        summary[f"{driver}-{n}"] = {
            "ours_s": ours_s,
            "torch_s": torch_s,
            "torch_over_ours": speedup,
        }
    for driver in ("thread", "proc"):
        got = summary[f"{driver}-256"]["ours_s"]
        targets.append(
            Target(
                f"rendezvous, 256 agents (ours, {driver}s)",
                "≤ 1 s",
                secs(got, 3),
                None if got is None else got <= 1.0,
            )
        )
    ours256 = summary["proc-256"]["ours_s"]
    t256 = summary["proc-256"]
    if t256["torch_s"] is not None:
        targets.append(
            Target(
                "rendezvous, 256: torch/ours",
                "≥ 10×",
                times(t256["torch_over_ours"]),
                (t256["torch_over_ours"] or 0) >= 10,
            )
        )
    elif ours256:
        targets.append(
            Target(
                "rendezvous, 256: torch/ours",
                "≥ 10×",
                f"torch did not finish in {cap:.0f} s: > {cap / ours256:.0f}×",
                True,
            )
        )
    table.notes += [
        "ours: agent.node.membership.Membership claim + join on agent.node.store.Store (add claim, set signed note, add arrived, last one sets "
        "all-arrived, wait, check abort); torch: DynamicRendezvousHandler.from_backend(C10dRendezvousBackend, "
        "min=max=N).next_rendezvous(). Each agent opens its own TCPStore client; connect time is included.",
        "proc = os.fork() children of a process that imported torch (light); thread = threads of one process. "
        "'driver alone': the same release with agents that do nothing, i.e. what waking N processes costs here. "
        "Both sides run with c10d reverse DNS off (agent.dnsfix), so the comparison is the protocol alone.",
        f"torch's handler is capped at {cap:.0f} s; a larger N is not run once a smaller one did not finish.",
    ]
    dns = Table(
        f"3b. Reverse DNS: {STORM_N} TCPStore clients connecting at once (threads, one process each)",
        ["variant", "all connected after", "median connect"],
    )
    for dnsfix, name in (
        (True, "agent.dnsfix.disable_reverse_dns applied"),
        (False, "torch as shipped (no fix)"),
    ):
        row = next(
            (r for r in rows if r.get("protocol") == "storm" and r.get("dnsfix") == dnsfix), {}
        )
        dns.add(
            name,
            secs(row.get("total_s"), 3) if row.get("finished") else "did not finish in 40 s",
            secs(row.get("connect_median_s"), 3),
        )
        summary[f"storm-dnsfix-{dnsfix}"] = row.get("total_s")
    dns.notes.append(
        "Without the fix every accepted connection makes the store server call getnameinfo() on "
        "`::ffff:127.0.0.1` (not in /etc/hosts) serially on its one loop thread. The unfixed run "
        "happens in a private network and mount namespace (unshare) whose resolv.conf names a "
        "resolver on 127.0.0.1 that drops every query, i.e. the broken-DNS case reproduced without "
        "a packet leaving loopback; glibc then waits out its 5 s retry."
    )
    return [table, dns], targets, summary
