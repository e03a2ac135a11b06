"""8. Hangs: --hang-timeout detection and `agent stacks` latency on a hung job (N loopback nodes × 2
ranks; the last rank spins, the others block in a gloo all_reduce, as tests/fixtures/stuck_job.py).

One job per size serves both measures (scripts/bench/hang_rank.py): while the lone rank still
prints a line every 0.5 s (output is progress) `agent stacks LOG_DIR` is timed against the hung
ranks; then the lone rank writes time.time() and its last line, and the clock of --hang-timeout
runs: last output → stacks captured → summary.json → every agent exited.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from bench import common as c
from bench import launchers
from bench.stats import Table, Target, median, secs, spread

NPROC = 2
HANG_TIMEOUT = 5.0
JOB_MARK = "LA_BENCH_HANG_JOB"  # per job, inherited by its agents, ranks and py-spy
STACKS_BAR = 3.0  # the bar for `agent stacks` on 2 × 2
DETECTED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \S+ no rank made progress")


def _job_processes(marker: str) -> list[psutil.Process]:
    """Live processes of one job (the marker is in every descendant's environment)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(JOB_MARK) == marker:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _kill_job(marker: str) -> int:
    strays = _job_processes(marker)
    for proc in strays:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return len(strays)


def _read_time(path: Path) -> float | None:
    with contextlib.suppress(OSError, ValueError):
        return float(path.read_text())
    return None


def _mtime(path: Path) -> float | None:
    with contextlib.suppress(OSError):
        return path.stat().st_mtime_ns / 1e9
    return None


def _detected_at(agent_log: Path) -> float | None:
    """When node 0 logged the hang (its file log: local time, milliseconds)."""
    with contextlib.suppress(OSError):
        for line in agent_log.read_text(errors="replace").splitlines():
            m = DETECTED.match(line)
            if m:
                stamp = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
                return time.mktime(stamp.timetuple()) + int(m.group(2)) / 1000
    return None


def _stacks_ok(out: str, nodes: int, native: bool) -> bool:
    """The lone rank alone and first, the others in one group (plain dump)."""
    lone = nodes * NPROC - 1
    if native:
        return "spin_without_progress" in out and "wait_in_the_collective" in out
    return (
        f"---- rank {lone} (1 rank on 127.0.0.{nodes}) ----" in out
        and f"---- ranks 0-{lone - 1} ({lone} ranks on" in out
        and out.index("spin_without_progress") < out.index("wait_in_the_collective")
    )


def _stacks_once(log_dir: Path, work: Path, nodes: int, native: bool, out: Path) -> dict[str, Any]:
    argv = [c.PY, "-m", "agent", "stacks", str(log_dir), *(["--native"] if native else [])]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            argv,
            env=c.base_env(),
            cwd=work,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        return {"native": native, "s": None, "rc": None, "ok": False, "error": "timed out (60 s)"}
    took = time.monotonic() - t0
    out.write_text(proc.stdout + "\n---- stderr ----\n" + proc.stderr)
    ok = proc.returncode == 0 and _stacks_ok(proc.stdout, nodes, native)
    result = {"native": native, "s": took, "rc": proc.returncode, "ok": ok, "bytes": len(proc.stdout)}
    if not ok:
        result["error"] = (proc.stderr.strip() or proc.stdout.strip())[-400:]
    return result


def one_job(
    nodes: int, reps: tuple[int, int], budget: c.Budget, after: float, work: Path, log
) -> dict[str, Any]:
    """Start the hung job, time `agent stacks` (reps[0]..reps[1] plain, one --native), then let
    --hang-timeout tear it down and time that. `after`: seconds the later jobs need."""
    tag = f"hang-{nodes}n"
    where = work / tag
    where.mkdir()
    log_dir = launchers.ours_log_dir(work, tag)
    world, lone = nodes * NPROC, nodes * NPROC - 1
    marker = f"{c.RUN_ID}-{tag}"
    extra = ["--hang-timeout", f"{HANG_TIMEOUT:g}"]
    prog = [c.program("hang_rank"), str(where)]
    cmds = launchers.ours(nodes, NPROC, prog, work, tag, extra, {JOB_MARK: marker})
    result: dict[str, Any] = {"nodes": nodes, "ok": False, "stacks": []}
    run = c.start(cmds, work)
    try:
        ready = [where / f"ready-{r}" for r in range(world)] + [log_dir / "control.json"]
        if not c.wait_for_files(ready, 60 + 25 * nodes, interval=0.1):
            result["error"] = "the job never came up: " + (c.tail(cmds[0][2]) or "no output")
            return result
        result["up_s"] = time.monotonic() - run.t0
        time.sleep(0.5)  # every rank in its hang, past its first line
        # -- agent stacks while the job hangs (the lone rank still prints: no teardown yet)
        done = 0
        while done < reps[1] and (done < reps[0] or budget.left() > after + 15):
            if run.alive() < len(cmds):
                break
            out = where / f"stacks-{done}.txt"
            result["stacks"].append(_stacks_once(log_dir, work, nodes, False, out))
            done += 1
        if run.alive() == len(cmds):
            result["stacks"].append(_stacks_once(log_dir, work, nodes, True, where / "native.txt"))
        for s in result["stacks"]:
            flag = "ok" if s["ok"] else f"FAILED {s.get('error', '')[:200]}"
            log(f"hang: {nodes} × {NPROC} stacks{' --native' if s['native'] else ''}: "
                f"{secs(s['s'])} {flag}")  # fmt: skip
        sample = where / "stacks-0.txt"
        with contextlib.suppress(OSError):
            result["stacks_sample"] = sample.read_text()[:1500]
        if run.alive() < len(cmds):
            result["error"] = "an agent exited while the job was meant to hang: " + c.tail(
                cmds[0][2]
            )
            return result
        # -- --hang-timeout: the lone rank falls silent, the clock runs from its last line
        (where / "quiet").touch()
        if not c.wait_for_files([where / f"last-{lone}"], 10.0):
            result["error"] = "the lone rank never went quiet"
            return result
        summary_path = log_dir / "summary.json"
        c.wait_for_files([summary_path], HANG_TIMEOUT + 60.0)
        seen = time.time()
        run.wait(30.0)
        exited_all = run.alive() == 0
        left = _job_processes(marker) if exited_all else []
        lasts = [_read_time(where / f"last-{r}") for r in range(world)]
        last_output = max(t for t in lasts if t is not None)
        summary_at = _mtime(summary_path)
        stacks_at = _mtime(log_dir / "stacks-a0.txt")
        detected_at = _detected_at(log_dir / "agent-00000.log")
        ends = [run.wall_ends.get(i) for i in range(len(cmds))]
        how = ""
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            how = json.loads(summary_path.read_text())["root_cause"]["how"]
        want = f"hang: no progress for {HANG_TIMEOUT:g} s; rank {lone} in spin_without_progress"
        result.update(
            {
                "ok": summary_at is not None,
                "last_output": last_output,
                "detected": _minus(detected_at, last_output),
                "stacks_written": _minus(stacks_at, last_output),
                "summary": _minus(summary_at, last_output),
                "summary_seen": seen - last_output,
                "all_exited": (max(ends) - last_output) if exited_all else None,
                "teardown": _minus(max(ends), summary_at) if exited_all else None,
                "still_running": run.alive(),
                "codes": run.codes,
                "left_behind": len(left),
                "left_behind_names": sorted({_name(p) for p in left}),
                "root_cause": how[:300],
                "root_cause_ok": how.startswith(want) and "in wait_in_the_collective" in how,
            }
        )
        if not result["ok"]:
            result["error"] = "no summary.json: " + c.tail(cmds[0][2])
        return result
    finally:
        run.kill()
        result["killed_after"] = _kill_job(marker)


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _name(proc: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return " ".join(os.path.basename(a) for a in proc.cmdline()[:3])
    return "?"


# Rough cost of one job per size on 2 loaded cores (start-up + stacks + T + teardown), seconds.
COST = {2: 20.0, 8: 55.0}


def run(sizes: list[int], reps: tuple[int, int], budget: c.Budget, work: Path, log) -> dict:
    jobs = []
    for index, nodes in enumerate(sizes):
        after = sum(COST.get(n, 10.0 * n) for n in sizes[index + 1 :])
        job = one_job(nodes, reps, budget, after, work, log)
        jobs.append(job)
        if not job["ok"]:
            log(f"hang: {nodes} × {NPROC}: FAILED {job.get('error', '')[:400]}")
            continue
        log(
            f"hang: {nodes} × {NPROC}: up in {secs(job.get('up_s'))}; after T: detected "
            f"{secs(_minus(job['detected'], HANG_TIMEOUT))}, stacks written "
            f"{secs(_minus(job['stacks_written'], HANG_TIMEOUT))}, summary "
            f"{secs(_minus(job['summary'], HANG_TIMEOUT))}; teardown {secs(job['teardown'])}; "
            f"codes {job['codes']}; left behind {job['left_behind']}"
        )
    return {"nproc_per_node": NPROC, "hang_timeout": HANG_TIMEOUT, "jobs": jobs}


def summarize(data: dict[str, Any]) -> tuple[list[Table], list[Target], dict[str, Any]]:
    t, p = data["hang_timeout"], data["nproc_per_node"]
    detect = Table(
        f"8a. Hang detection (--hang-timeout {t:g}; N loopback nodes × {p} ranks; the last rank "
        "spins, the others wait in a gloo all_reduce; times from the last line any rank printed)",
        [
            "nodes × ranks",
            "detected after T",
            "stacks captured after T",
            "detect+capture after T (summary.json)",
            "teardown (summary → last agent exit)",
            "last output → every agent exited",
            "exit codes",
            "root cause names the lone rank",
            "processes left behind",
        ],
    )
    stacks = Table(
        f"8b. `agent stacks LOG_DIR` on the hung job (wall time of the command, interpreter "
        f"start included; the job keeps running)",
        ["nodes × ranks", "runs", "median", "min–max", "--native (1 run)", "output"],
    )
    summary: dict[str, Any] = {}
    targets: list[Target] = []
    for job in data["jobs"]:
        n = job["nodes"]
        name = f"{n} × {p}"
        plain = [s for s in job["stacks"] if not s["native"]]
        times_ok = [s["s"] for s in plain if s["ok"]]
        native = next((s for s in job["stacks"] if s["native"]), None)
        med = median(times_ok) if plain and len(times_ok) == len(plain) else None
        failed = len(plain) - len(times_ok)
        if plain:
            stacks.add(
                name,
                f"{len(plain)}" + (f" ({failed} failed)" if failed else ""),
                secs(med) if failed == 0 else "FAILED",
                spread(times_ok),
                "n/a" if native is None else secs(native["s"]) + ("" if native["ok"] else " FAILED"),
                "lone rank first, others grouped" if failed == 0 else "see bench.json",
            )
        if job.get("ok"):
            detect.add(
                name,
                secs(_minus(job["detected"], t)),
                secs(_minus(job["stacks_written"], t)),
                secs(_minus(job["summary"], t)),
                secs(job["teardown"]),
                secs(job["all_exited"])
                if job["all_exited"] is not None
                else f"{job['still_running']} agent(s) still running",
                " ".join("killed" if x is None else str(x) for x in job["codes"]),
                "yes" if job["root_cause_ok"] else f"NO: {job['root_cause'][:120]}",
                job["left_behind"],
            )
        else:
            detect.add(name, "FAILED", job.get("error", "")[:150], "", "", "", "", "", "")
        summary[name] = {
            "stacks_median": med,
            "stacks_native": None if native is None else native["s"],
            "detect_capture_after_t": _minus(job.get("summary"), t),
            "teardown": job.get("teardown"),
        }
        if n == 2:
            targets.append(
                Target(
                    f"`agent stacks` on a hung {name} job",
                    f"≤ {STACKS_BAR:g} s",
                    secs(med) if plain else "n/a",
                    None if med is None else med <= STACKS_BAR,
                )
            )
        elif plain:
            targets.append(
                Target(f"`agent stacks` on a hung {name} job", "reported", secs(med), None)
            )
    detect.notes += [
        "last output = time.time() a rank wrote just before its last line (the lone rank's "
        "'going quiet'); detected = node 0's 'no rank made progress' log line (ms resolution); "
        "stacks captured = mtime of stacks-a0.txt; summary.json = its mtime (the hang is the root "
        "cause, the stacks in it). Each agent checks its ranks about once a second, so "
        "detection lands 0–~1 s after T by design.",
        "teardown: node 0 SIGTERMs the ranks of every node, gathers every node's result, writes "
        "summary.json; 'last agent exit' is the waitpid of the last of the N agents. 'processes "
        "left behind': live processes carrying the job's env marker once every agent had exited "
        "(killed by the bench if any).",
        "Peers, published (not run here): NVIDIA ft_launcher (nvidia-resiliency-ext) detects a "
        "hang only from heartbeats/sections the training script must send (RankMonitorClient, a "
        "code change); its rank monitors check every workload_check_interval = 5 s (default), so "
        "detection lands up to 5 s after the timeout (defaults 60 min for the first heartbeat, "
        "45 min after), and it kills the rank with rank_termination_signal = SIGKILL (default) "
        "— no stacks. torchrun has no hang detection: a hung job runs until the Slurm time limit, "
        "unless a collective's own timeout (30 min for gloo, 10 min for NCCL by default) fails "
        "the ranks waiting in it — without any rank's stack, and never for a rank hung outside a "
        "collective.",
    ]
    stacks.notes += [
        "Each run is a fresh `python -m agent stacks LOG_DIR` (node 0 found from "
        "LOG_DIR/control.json, the secret proved, every agent dumps its ranks with py-spy at "
        "once, node 0 collates). 'output': the lone rank's group comes first, ranks 0..N-2 in one "
        "group. While it is timed the lone rank prints a line every 0.5 s (so --hang-timeout "
        "does not fire yet) and spins at 100 % of a core, as a hung rank can.",
    ]
    return [detect, stacks], targets, summary
