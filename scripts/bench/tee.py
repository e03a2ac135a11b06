"""4. Tee throughput: ranks spewing to stdout; lines (bytes) per second reaching the per-rank files,
direct to a file vs through our agent vs torchrun --tee 3; every byte checked (size + sha1)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from bench import common as c
from bench import launchers, spew
from bench.stats import Table, Target, median, mib, rate, ratio, spread, times

MODES = ("direct", "pipe", "ours", "ours-quiet", "torchrun")
MODE_NAMES = {
    "direct": "direct to file (no launcher)",
    "pipe": "through a pipe to `cat > file` (any pipe tee's ceiling)",
    "ours": "ours, console on (→ /dev/null)",
    "ours-quiet": "ours, --console-ranks none",
    "ours-progress": "ours, console on, --progress-regex matching every line",
    "torchrun": "torchrun --tee 3 (console → /dev/null)",
}
BUFFERED = {"PYTHONUNBUFFERED": ""}  # empty = unset for Python; the agent keeps an inherited value
LINE_BYTES = 64
PROGRESS = r"line (?P<step>\d+) "  # every line of spew.py's: each one a step
BULK_CHUNK = 1 << 20


def cases(lines: int, bulk_mib: int) -> list[dict[str, Any]]:
    return [
        {
            "name": f"{lines // 1000}k lines × 1 rank",
            "key": "lines-1",
            "mode": "lines",
            "count": lines,
            "size": LINE_BYTES,
            "nproc": 1,
            "env": BUFFERED,
            "rounds": 3,
        },
        {
            "name": f"{lines // 1000}k lines × 8 ranks",
            "key": "lines-8",
            "mode": "lines",
            "count": lines,
            "size": LINE_BYTES,
            "nproc": 8,
            "env": BUFFERED,
            "rounds": 1,
            "modes": ("direct", "ours", "ours-quiet", "torchrun"),
        },
        {
            "name": f"{bulk_mib} MiB, no newline, 1 MiB writes × 1 rank",
            "key": "bulk-1",
            "mode": "bulk",
            "count": bulk_mib << 20,
            "size": BULK_CHUNK,
            "nproc": 1,
            "env": BUFFERED,
            "rounds": 3,
        },
    ]


def unbuffered_case(lines: int) -> dict[str, Any]:
    """The agent's default env (PYTHONUNBUFFERED=1 for ranks): one write(2) per line."""
    return {
        "name": f"{lines // 1000}k lines × 1 rank, unbuffered (agent default env)",
        "key": "lines-1-unbuf",
        "mode": "lines",
        "count": lines,
        "size": LINE_BYTES,
        "nproc": 1,
        "env": {},
        "rounds": 2,
        "direct_env": {"PYTHONUNBUFFERED": "1"},
        "modes": ("direct", "ours", "ours-progress"),
    }


def _commands(
    mode: str, case: dict[str, Any], where: Path, work: Path, tag: str
) -> list[launchers.Cmd]:
    prog = [
        c.program("spew"),
        case["mode"],
        str(case["count"]),
        str(case["size"]),
        str(where),
        str(case["rounds"]),
    ]
    if mode == "direct":
        return launchers.floor(
            1, case["nproc"], prog, work, tag, case.get("direct_env", case["env"])
        )
    if mode == "pipe":  # the same rank, its stdout through one pipe copied by cat (C) into the file
        cmds = launchers.floor(1, case["nproc"], prog, work, tag, case["env"])
        return [
            (["sh", "-c", '"$@" | cat > "$0"', str(out), *argv], env, Path(os.devnull))
            for argv, env, out in cmds
        ]
    devnull = Path(os.devnull)
    if mode == "torchrun":
        extra = ["--tee", "3", "--log-dir", str(where / "torchrun-logs")]
        cmds = launchers.torchrun(1, case["nproc"], prog, work, tag, extra, case["env"])
    else:
        extra = {
            "ours-quiet": ["--console-ranks", "none"],
            "ours-progress": ["--progress-regex", PROGRESS],
        }.get(mode, [])
        cmds = launchers.ours(1, case["nproc"], prog, work, tag, extra, case["env"])
    return [(argv, env, devnull) for argv, env, _ in cmds]


def _rank_files(
    mode: str, case: dict[str, Any], where: Path, work: Path, tag: str, cmds: list[launchers.Cmd]
) -> list[Path]:
    n = case["nproc"]
    if mode in ("direct", "pipe"):
        return [cmd[2] for cmd in launchers_floor_files(cmds, mode)]
    if mode == "torchrun":
        found = sorted(
            where.glob("torchrun-logs/*/attempt_0/*/stdout.log"), key=lambda p: int(p.parent.name)
        )
        return found if len(found) == n else []
    log_dir = launchers.ours_log_dir(work, tag)
    return [log_dir / f"rank-{r:05d}.out" for r in range(n)]


def launchers_floor_files(cmds: list[launchers.Cmd], mode: str) -> list[launchers.Cmd]:
    """The rank files of the launcher-less modes: stdout itself, or the file cat writes."""
    return cmds if mode == "direct" else [(argv, env, Path(argv[3])) for argv, env, _ in cmds]


def one_run(mode: str, case: dict[str, Any], work: Path, rep: int, expect: dict) -> dict[str, Any]:
    tag = f"tee-{case['key']}-{mode}-{rep}"
    where = work / tag
    where.mkdir()
    cmds = _commands(mode, case, where, work, tag)
    run = c.run_all(cmds, work, timeout=180)
    result: dict[str, Any] = {
        "mode": mode,
        "case": case["key"],
        "rep": rep,
        "codes": run.codes,
        "ok": False,
    }
    files = _rank_files(mode, case, where, work, tag, cmds)
    n = case["nproc"]
    if len(files) != n:
        result["error"] = (
            f"found {len(files)} rank files, expected {n}; launcher output: {c.tail(cmds[0][2])}"
        )
        return result
    rounds = case["rounds"]
    try:
        t0 = [[float((where / f"t0-{k}-{r}").read_text()) for k in range(n)] for r in range(rounds)]
        t1 = [[float((where / f"t1-{k}-{r}").read_text()) for k in range(n)] for r in range(rounds)]
        ends = [f.stat().st_mtime_ns / 1e9 for f in files]
    except (OSError, ValueError) as exc:
        result["error"] = f"{exc}; launcher output: {c.tail(cmds[0][2])}"
        return result
    got = [spew.file_digest(f) for f in files]
    want = [_expected(expect, case, k) for k in range(n)]
    # Every round but the last ends when the ranks' writes returned (the pipe holds at most its
    # buffer); the last one ends when the last byte reached the files.
    round_s = [max(t1[r]) - min(t0[r]) for r in range(rounds - 1)] + [max(ends) - min(t0[-1])]
    result.update(
        {
            "ok": all(code == 0 for code in run.codes),
            "intact": got == want,
            "lost_bytes": sum(max(0, w[0] - g[0]) for g, w in zip(got, want, strict=True)),
            "extra_bytes": sum(max(0, g[0] - w[0]) for g, w in zip(got, want, strict=True)),
            "bytes": sum(g[0] for g in got),
            "round_bytes": sum(g[0] for g in got) // rounds,
            "round_lines": case["count"] * n if case["mode"] == "lines" else 0,
            "round_s": round_s,
            "to_file_s": round_s[-1],
            "rank_side_s": max(t1[-1]) - min(t0[-1]),
        }
    )
    for path in files:  # the disk is shared; a run's 64-512 MiB go as soon as they are checked
        path.unlink(missing_ok=True)
    shutil.rmtree(where, ignore_errors=True)
    return result


def _expected(cache: dict, case: dict[str, Any], rank: int) -> tuple[int, str]:
    key = (case["mode"], case["count"], case["size"], rank, case["rounds"])
    if key not in cache:
        cache[key] = spew.expected(case["mode"], case["count"], case["size"], rank, case["rounds"])
    return cache[key]


def run(reps: int, lines: int, bulk_mib: int, budget: c.Budget, work: Path, log) -> dict[str, Any]:
    todo = cases(lines, bulk_mib) + [unbuffered_case(lines)]
    expect: dict = {}
    runs: list[dict[str, Any]] = []
    for rep in range(reps):
        for case in todo:
            if rep > 0 and budget.left() < 40:
                break
            for mode in case.get("modes", MODES):
                result = one_run(mode, case, work, rep, expect)
                runs.append(result)
                if result["ok"]:
                    shown = " ".join(f"{x:.2f}" for x in result["round_s"])
                    log(
                        f"tee: {case['key']:14s} {mode:10s} rep {rep}: rounds {shown} s, intact={result['intact']}"
                    )
                else:
                    log(
                        f"tee: {case['key']} {mode} rep {rep}: FAILED {result.get('error', result['codes'])}"
                    )
    return {"cases": todo, "runs": runs}


def _per_s(case: dict[str, Any], runs: list[dict[str, Any]]) -> list[float]:
    """One sample per round of every run: lines (or bytes) per second."""
    unit = "round_lines" if case["mode"] == "lines" else "round_bytes"
    return [r[unit] / s for r in runs for s in r["round_s"]]


def summarize(data: dict[str, Any]) -> tuple[Table, list[Target], dict[str, Any]]:
    table = Table(
        "4. Tee throughput (to the per-rank files; median of samples; ratio = mode / direct)",
        [
            "case",
            "mode",
            "samples",
            "throughput (min–max)",
            "vs direct",
            "rank busy writing",
            "bytes checked",
            "lost bytes",
        ],
    )
    summary: dict[str, Any] = {}
    targets = []
    for case in data["cases"]:
        base = None
        for mode in case.get("modes", MODES):
            runs = [
                r
                for r in data["runs"]
                if r["case"] == case["key"] and r["mode"] == mode and r["ok"]
            ]
            if not runs:
                continue
            speeds = _per_s(case, runs)
            value = median(speeds)
            base = value if mode == "direct" else base
            rel = ratio(value, base) if mode != "direct" else None
            intact = all(r["intact"] for r in runs)
            unit = "lines" if case["mode"] == "lines" else "B"
            table.add(
                case["name"],
                MODE_NAMES[mode],
                f"{len(runs)} run(s) × {case['rounds']}",
                f"{rate(value).replace('/s', f' {unit}/s')}"
                + (f" ({spread([s / 1e6 for s in speeds])} M)" if len(speeds) > 1 else ""),
                times(rel) if rel else "1.00×",
                f"{median([r['rank_side_s'] for r in runs]):.2f} s",
                f"{mib(runs[-1]['bytes'])} {'identical' if intact else 'DIFFER'}",
                sum(r["lost_bytes"] for r in runs),
            )
            summary[f"{case['key']}/{mode}"] = {"per_s": value, "vs_direct": rel, "intact": intact}
            if mode in ("ours", "ours-quiet") and case["key"] != "lines-1-unbuf":
                targets.append(
                    Target(
                        f"tee {case['key']} ({mode})",
                        "≥ 0.9 × direct, 0 bytes lost",
                        f"{times(rel)}, lost {sum(r['lost_bytes'] for r in runs)}",
                        rel is not None and rel >= 0.9 and intact,
                    )
                )
    table.notes += [
        "A rank writes its stream `rounds` times back to back (samples = runs × rounds). A round's time runs from "
        "the rank's clock just before its first write to: its last write returning (pipe back-pressure means "
        "at most one pipe buffer is still in flight), or, for the last round, the last modification of the rank "
        "files, i.e. end to end including the launcher's copy into the file.",
        "'rank busy writing' = how long the ranks' write loops took (back-pressure from the pipe shows here).",
        "Every rank file is compared with the exact expected stream (size + sha1): 'identical' means no byte was "
        "lost, added or reordered. torchrun's ranks write their files themselves (--log-dir redirect); its tee "
        "re-reads the files for the console.",
        "Rows except the 'unbuffered' one run with the program's default block-buffered stdout in every mode "
        "(PYTHONUNBUFFERED passed empty). The agent's default env sets PYTHONUNBUFFERED=1 for ranks, so a "
        "print()-heavy rank makes one write(2) per line; the 'unbuffered' row compares that with direct "
        "PYTHONUNBUFFERED=1.",
        "'through a pipe to cat': what any launcher that reads the ranks' pipes can reach at best on this "
        "machine (one pipe copy, a C reader, no console); the targets are measured against 'direct', which no "
        "pipe-based tee can match for large writes.",
    ]
    return table, targets, summary
