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
DETECTED = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \S+ no progress for \S+ s from the"
)


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


GROUP = re.compile(r"^---- ranks? (\S+) \((\d+) ranks? on ")


def _without_stack(out: str) -> int:
    """Ranks whose group says "no stack" (py-spy and the fallback both gave nothing in time)."""
    missing, size = 0, 0
    for line in out.splitlines():
        m = GROUP.match(line)
        if m:
            size = int(m.group(2))
        elif line.strip().startswith("no stack"):
            missing += size
    return missing


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
    result = {
        "native": native,
        "s": took,
        "rc": proc.returncode,
        "ok": ok,
        "bytes": len(proc.stdout),
        "without_stack": _without_stack(proc.stdout),
    }
    if not ok:
        result["error"] = (proc.stderr.strip() or proc.stdout.strip())[-400:]
    return result


def one_job(
    nodes: int,
    rep: int,
    reps: tuple[int, int],
    native: bool,
    budget: c.Budget,
    after: float,
    work: Path,
    log,
) -> dict[str, Any]:
    """Start the hung job, time `agent stacks` (reps[0], or up to reps[1] while the budget leaves
    `after` seconds for the later jobs; then one --native if `native`), then let --hang-timeout
    tear it down and time that."""
    tag = f"hang-{nodes}n-{rep}"
    where = work / tag
    where.mkdir()
    log_dir = launchers.ours_log_dir(work, tag)
    world, lone = nodes * NPROC, nodes * NPROC - 1
    marker = f"{c.RUN_ID}-{tag}"
    # one hang, then the verdict: a hang is an infrastructure failure, restarted 3 times by default
    extra = ["--hang-timeout", f"{HANG_TIMEOUT:g}", "--max-infra-restarts", "0"]
    prog = [c.program("hang_rank"), str(where)]
    cmds = launchers.ours(nodes, NPROC, prog, work, tag, extra, {JOB_MARK: marker})
    result: dict[str, Any] = {"nodes": nodes, "rep": rep, "ok": False, "stacks": []}
    run = c.start(cmds, work)
    try:
        ready = [where / f"ready-{r}" for r in range(world)] + [log_dir / "control.json"]
        deadline = time.monotonic() + 60 + 25 * nodes
        while not all(f.exists() for f in ready):
            if run.alive() < len(cmds) or time.monotonic() > deadline:
                result["error"] = "the job never came up: " + (c.tail(cmds[0][2]) or "no output")
                return result
            time.sleep(0.1)
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
        if native and run.alive() == len(cmds):
            result["stacks"].append(_stacks_once(log_dir, work, nodes, True, where / "native.txt"))
        for s in result["stacks"]:
            flag = "ok" if s["ok"] else f"FAILED ({s.get('without_stack')} without a stack)"
            log(f"hang: {nodes} × {NPROC} stacks{' --native' if s['native'] else ''}: "
                f"{secs(s['s'])} {flag}")  # fmt: skip
        if rep == 0:
            with contextlib.suppress(OSError):
                result["stacks_sample"] = (where / "stacks-0.txt").read_text()[:1500]
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
        # The recorders' finding first (which collective, who never came), then the stacks'.
        want = f"hang: no progress for {HANG_TIMEOUT:g} s from the {world} ranks still running; "
        behind = "entered all_reduce #"  # the recorders: where ranks 0..N-2 wait, for whom
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
                "root_cause_ok": how.startswith(want)
                and behind in how
                and f"rank {lone} in spin_without_progress" in how
                and "in wait_in_the_collective" in how,
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
COST = {2: 15.0, 8: 30.0}


def run(
    sizes: list[int], rounds: int, reps: tuple[int, int], budget: c.Budget, work: Path, log
) -> dict[str, Any]:
    """Rounds of one job per size; the first round always (up to reps[1] stacks runs and one
    --native per job), later ones (reps[0] stacks runs) while the budget covers a job's cost."""
    jobs = []
    cost = dict(COST)
    for rnd in range(rounds):
        for index, nodes in enumerate(sizes):
            if rnd > 0 and budget.left() < cost.get(nodes, 5.0 * nodes) + 5.0:
                log(f"hang: {nodes} × {NPROC}: budget spent, {rnd} job(s)")
                continue
            after = sum(cost.get(n, 5.0 * n) for n in sizes[index + 1 :]) if rnd == 0 else 0.0
            started = time.monotonic()
            job = one_job(
                nodes, rnd, reps if rnd == 0 else (reps[0], reps[0]), rnd == 0, budget, after,
                work, log,
            )  # fmt: skip
            cost[nodes] = time.monotonic() - started
            jobs.append(job)
            if not job["ok"]:
                log(f"hang: {nodes} × {NPROC} job {rnd}: FAILED {job.get('error', '')[:400]}")
                continue
            log(
                f"hang: {nodes} × {NPROC} job {rnd}: up in {secs(job.get('up_s'))}; after T: "
                f"detected {secs(_minus(job['detected'], HANG_TIMEOUT))}, stacks written "
                f"{secs(_minus(job['stacks_written'], HANG_TIMEOUT))}, summary "
                f"{secs(_minus(job['summary'], HANG_TIMEOUT))}; teardown {secs(job['teardown'])}; "
                f"codes {job['codes']}; left behind {job['left_behind']}"
            )
    return {"nproc_per_node": NPROC, "hang_timeout": HANG_TIMEOUT, "jobs": jobs}


def _cell(values: list[float | None]) -> str:
    """median (min–max) over the jobs, as seconds."""
    got = [v for v in values if v is not None]
    if not got:
        return "n/a"
    return secs(median(got)) + ("" if len(got) == 1 else f" ({spread(got)})")


def summarize(data: dict[str, Any]) -> tuple[list[Table], list[Target], dict[str, Any]]:
    t, p = data["hang_timeout"], data["nproc_per_node"]
    detect = Table(
        f"8a. Hang detection (--hang-timeout {t:g}; N loopback nodes × {p} ranks; the last rank "
        "spins, the others wait in a gloo all_reduce; times from the last line any rank printed; "
        "median (min–max) over the jobs)",
        [
            "nodes × ranks",
            "jobs",
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
        "8b. `agent stacks LOG_DIR` on the hung job (wall time of the command, interpreter "
        "start included; the job keeps running)",
        ["nodes × ranks", "runs", "median", "min–max", "--native (1 run)", "output"],
    )
    summary: dict[str, Any] = {}
    targets: list[Target] = []
    for n in sorted({job["nodes"] for job in data["jobs"]}):
        name = f"{n} × {p}"
        jobs = [job for job in data["jobs"] if job["nodes"] == n]
        done = [job for job in jobs if job.get("ok")]
        failed_jobs = len(jobs) - len(done)
        # -- agent stacks
        plain = [s for job in jobs for s in job["stacks"] if not s["native"]]
        good = [s["s"] for s in plain if s["ok"]]
        bad = len(plain) - len(good)
        med = median(good) if plain and not bad else None
        native = next((s for job in jobs for s in job["stacks"] if s["native"]), None)
        if native is None:
            native_cell = "n/a"
        elif native["ok"]:
            native_cell = secs(native["s"])
        else:
            native_cell = (
                f"{secs(native['s'])}, {native.get('without_stack', '?')} of {n * p} ranks "
                'without a stack ("py-spy gave no stack within 2s")'
            )
        if plain:
            stacks.add(
                name,
                f"{len(plain)} in {len(jobs)} job(s)" + (f", {bad} FAILED" if bad else ""),
                secs(med) if not bad else f"FAILED (median of the good: {secs(median(good))})",
                spread(good),
                native_cell,
                "lone rank first, others grouped" if not bad else "see bench.json",
            )
        # -- detection
        if done:
            exited = [job["all_exited"] for job in done]
            detect.add(
                name,
                f"{len(done)}" + (f" (+{failed_jobs} failed)" if failed_jobs else ""),
                _cell([_minus(job["detected"], t) for job in done]),
                _cell([_minus(job["stacks_written"], t) for job in done]),
                _cell([_minus(job["summary"], t) for job in done]),
                _cell([job["teardown"] for job in done]),
                _cell(exited)
                if None not in exited
                else f"{sum(e is None for e in exited)} job(s) with agents still running",
                " ".join("killed" if x is None else str(x) for x in done[-1]["codes"]),
                "yes"
                if all(job["root_cause_ok"] for job in done)
                else "NO: " + next(j["root_cause"] for j in done if not j["root_cause_ok"])[:120],
                max(job["left_behind"] for job in done),
            )
        else:
            error = jobs[0].get("error", "") if jobs else ""
            detect.add(name, "0", "FAILED", error[:150], "", "", "", "", "", "")
        summary[name] = {
            "stacks_median": med,
            "stacks_native": None if native is None else native["s"],
            "stacks_native_without_stack": None if native is None else native["without_stack"],
            "detect_capture_after_t": median(
                [v for v in (_minus(job["summary"], t) for job in done) if v is not None]
            ),
            "teardown": median([job["teardown"] for job in done if job["teardown"] is not None]),
            "exited_after_t": median(
                [job["all_exited"] - t for job in done if job["all_exited"] is not None]
            ),
        }
        wanted = f"≤ {STACKS_BAR:g} s" if n == 2 else "reported"
        targets.append(
            Target(
                f"`agent stacks` on a hung {name} job (median)",
                wanted,
                (secs(med) if med is not None else "FAILED") if plain else "n/a",
                (None if med is None else med <= STACKS_BAR) if n == 2 else None,
            )
        )
    detect.notes += [
        "last output = time.time() a rank wrote just before its last line (the lone rank's "
        "'going quiet'); detected = node 0's 'no progress for T s from the N ranks still "
        "running' log line (ms resolution); stacks captured = mtime of stacks-a0.txt; "
        "summary.json = its mtime (the hang is the root cause, the stacks in it). Each agent "
        "looks at its ranks' output about once a second, then seals its quiet standing and "
        "re-posts it every second; node 0's coordinator reads the standings every 0.5 s and "
        "judges only once every quiet node has posted again (an old record written back cannot "
        "fake a hang), so detection lands up to ~3 s after T by design.",
        "teardown: node 0 SIGTERMs the ranks of every node, gathers every node's result, writes "
        "summary.json; 'last agent exit' is the waitpid of the last of the N agents. 'processes "
        "left behind': live processes carrying the job's env marker once every agent had exited "
        "(killed by the bench if any).",
    ]
    stacks.notes += [
        "Each run is a fresh `python -m agent stacks LOG_DIR` (node 0 found from "
        "LOG_DIR/control.json, the secret proved, every agent dumps its ranks with py-spy at "
        "once, node 0 collates). 'output': the lone rank's group comes first, ranks 0..N-2 in one "
        "group. While it is timed the lone rank prints a line every 0.5 s (so --hang-timeout "
        "does not fire yet) and spins at 100 % of a core, as a hung rank can.",
    ]
    return [detect, stacks, _peers(t, summary)], targets, summary


def _peers(t: float, summary: dict[str, Any]) -> Table:
    table = Table(
        "8c. Hang handling against the peers (published figures: the same run cannot include "
        "them — ft_launcher needs code in the training script, torchrun has no hang detection)",
        ["launcher", "a hang is", "after the timeout T", "every rank's stack", "script changes"],
    )
    ours = "; ".join(
        f"{name}: stacks in summary.json {secs(row['detect_capture_after_t'])}, every agent "
        f"exited {secs(row['exited_after_t'])}"
        for name, row in summary.items()
    )
    table.add(
        "launch-agent --hang-timeout (this run)",
        "no output line (or no --progress-regex match) from any rank on any node for T",
        ours or "n/a",
        "yes: collated into summary.json and stacks-a<N>.txt; `agent stacks` any time",
        "none",
    )
    table.add(
        "NVIDIA ft_launcher (nvidia-resiliency-ext)",
        "a rank's heartbeat or section update missing for its timeout (defaults 60 min first, "
        "45 min after)",
        "rank monitors check every workload_check_interval = 5 s (default): up to T + 5 s, then "
        "rank_termination_signal = SIGKILL (default)",
        "no",
        "yes: RankMonitorClient heartbeats/sections (or the Lightning callback)",
    )
    table.add(
        "torchrun",
        "not detected",
        "never: the job runs until the Slurm time limit (ranks waiting in a collective fail at "
        "its own timeout, 30 min gloo / 10 min NCCL by default; a rank hung outside one never)",
        "no",
        "-",
    )
    table.notes.append(
        f"ours with T = {t:g} s here; the same mechanism with T = 600 s adds the same seconds "
        "after T. Sources: nvidia-resiliency-ext FaultToleranceConfig defaults and usage guide; "
        "torch.distributed default_pg_timeout / default_pg_nccl_timeout."
    )
    return table
