"""The scale harness's end-to-end run for one N: node 0's agent in one process, the other N-1
agents as threads in light processes (scale_agents.py), real store and protocol, fake ranks.

Measured from the moment every agent is released at once: joined (past the join barrier),
plan (the signed, encrypted payload received and opened), ranks started on every node; then
node 0's CPU while every agent heartbeats and its fake ranks "run"; then one rank on the last
node fails and we time until every agent has seen the abort (its supervisor tore its ranks
down), summary.json (node 0's verdict over every node's result), every agent back from the run
(the verdict read), every agent gone (leave).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import resource
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench import common as c

# Agents per light process (each agent: ~10 fds, ~6 threads). Fewer per process: less waiting
# on one interpreter lock, more memory (~60 MiB per process once the agent is imported).
PER_PROCESS = int(os.environ.get("LA_SCALE_PER_PROCESS", "128"))


def heartbeat_timeout(n: int) -> float:
    """--heartbeat-timeout of the simulated job: the default (6 s) up to 256 agents; above,
    thousands of agent threads on 2 cores can keep one from running for longer than that (at
    1,024, twice in a row on 2026-11-26, 5-7 live agents were declared lost in the burst after
    the abort, and the job ended exit 3 instead of 1: a cluster gives each agent its own CPU)."""
    return 6.0 if n <= 256 else 60.0


LEADER_SHARE = -15  # node 0's autogroup nice: weight 29154 against 1024 per other process


class AgentProcess:
    """One scale_agents.py process and the JSON lines it prints."""

    def __init__(self, argv: list[str], env: dict[str, str], errors: Path, share: int = 0) -> None:
        """Each process leads a session of its own, i.e. (Linux autogroup) a CPU share of its
        own; `share` < 0 weighs node 0's share up (autogroup nice), so its process gets about a
        core when it needs one however many agent threads the others run, as a real node 0 has
        its machine."""
        with open(errors, "wb") as sink:
            self.proc = subprocess.Popen(
                [c.PY, c.program("scale_agents"), *argv],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=sink,
                start_new_session=True,
            )
        if share:
            with contextlib.suppress(OSError):  # no autogroup, or not allowed: equal shares
                Path(f"/proc/{self.proc.pid}/autogroup").write_text(str(share))
        c._LIVE.append(self.proc)
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.ps = psutil.Process(self.proc.pid)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.lines.put(json.loads(line))
            except ValueError:
                continue
        self.lines.put(None)

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(text.encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:
            pass

    def expect(self, key: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                record = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                return {"error": f"no {key!r} within {timeout:.0f} s"}
            if record is None:
                return {"error": f"exited (code {self.proc.poll()}) before {key!r}"}
            if key in record:
                return record

    def cpu(self) -> float:
        try:
            t = self.ps.cpu_times()
        except psutil.Error:
            return float("nan")
        return t.user + t.system


def _thread_cpu(ps: psutil.Process) -> dict[int, float]:
    """CPU seconds of each thread of `ps`: the scheduler's own count (schedstat, ns) where
    Linux keeps one. The tick-sampled times psutil reads lag behind for threads that run in
    slices shorter than a tick, as an idle agent's threads do: with 444 of them in one process,
    they showed 4 ticks where the scheduler counted 0.35 s (and the rest looked like threads
    that came and went)."""
    found = {}
    try:
        for t in ps.threads():
            try:
                with open(f"/proc/{ps.pid}/task/{t.id}/schedstat") as f:
                    found[t.id] = int(f.read().split()[0]) / 1e9
            except (OSError, ValueError, IndexError):
                found[t.id] = t.user_time + t.system_time
    except psutil.Error:
        return {}
    return found


def _by_thread(
    before: dict[int, float], after: dict[int, float], names: dict[int, str], span: float
) -> dict[str, float]:
    """% of one core per thread kind of node 0's process: Python threads by name (numbers
    dropped), the rest native (torch's store server loop among them)."""
    kinds: dict[str, float] = {}
    for tid, cpu in after.items():
        name = names.get(tid, "native (store server, ...)")
        name = "".join(ch for ch in name.split(" (")[0] if not ch.isdigit()).rstrip("-")
        kinds[name] = kinds.get(name, 0.0) + 100.0 * (cpu - before.get(tid, 0.0)) / span
    return {k: round(v, 2) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]) if v >= 0.01}


def _latest(values: list[list[float | None]], since: float) -> tuple[float | None, int]:
    """The last of every agent's time (seconds since `since`), and how many agents have one."""
    got = [v for part in values for v in part if v is not None]
    return (max(got) - since if got else None), len(got)


def measure(n: int, work: Path, idle_s: float, log) -> dict[str, Any]:
    run = work / f"scale-{n}"
    logs = run / "logs"
    run.mkdir(parents=True, exist_ok=True)
    script = run / "train.py"
    script.write_text("print('never started: the scale bench fakes its ranks')\n")
    config = run / "model.yml"  # a payload of a realistic size (~20 KiB once sealed)
    config.write_text("".join(f"layer_{i}: {{width: {i * 64}, act: gelu}}\n" for i in range(600)))
    port = c.free_port()
    # Node 0 serves 5 connections per agent during an attempt: past the hard fd limit, the
    # other agents' failure reports share their main connection (4 per agent; proposal P1).
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    shared = os.environ.get("LA_SCALE_SHARED_REPORTS") == "1" or n * 5 + 256 > hard
    env = c.base_env(
        TORCH_CPP_LOG_LEVEL="ERROR",
        LA_SCALE_SHARED_REPORTS="1" if shared else "0",
        # the store queries each agent sends, counted (a few µs of its ~60 queries' CPU)
        LA_SCALE_OPS=os.environ.get("LA_SCALE_OPS", "1"),
        LA_SCALE_HEARTBEAT_TIMEOUT=os.environ.get(
            "LA_SCALE_HEARTBEAT_TIMEOUT", str(heartbeat_timeout(n))
        ),
    )
    out: dict[str, Any] = {"n": n, "nproc": 8, "ranks": n * 8, "shared_reports": shared}
    clock = time.time() - time.monotonic()
    procs: list[AgentProcess] = []
    try:
        leader = AgentProcess(
            ["leader", str(n), str(port), str(logs), str(script), str(config)],
            env,
            run / "leader.err",
            share=LEADER_SHARE,
        )
        procs.append(leader)
        ready = [leader.expect("ready", 120)]
        if "error" in ready[0]:
            out["error"] = "node 0: " + ready[0]["error"] + " " + c.tail(run / "leader.err")
            return out
        for k, lo in enumerate(range(1, n, PER_PROCESS)):
            hi = min(n, lo + PER_PROCESS)
            argv = ["followers", str(n), str(port), str(logs), str(lo), str(hi)]
            procs.append(AgentProcess(argv, env, run / f"followers-{k}.err"))
        ready += [p.expect("ready", 120) for p in procs[1:]]
        bad = [r["error"] for r in ready if "error" in r]
        if bad:
            out["error"] = "start: " + bad[0]
            return out
        out["processes"] = len(procs)
        out["fd_limit"] = ready[0].get("fd_limit")
        log(f"scale {n}: {len(procs)} processes ready; releasing {n} agents")

        cpu_before = [p.cpu() for p in procs]
        go = time.monotonic()
        for p in procs:
            p.send("go")
        spawned = [p.expect("spawned", 300) for p in procs]
        busy = time.monotonic() - go
        cpu_after = [p.cpu() for p in procs]
        # every agent's reference work (scale_agents.reference_work) is not the start's
        references = [r for s in spawned for r in s.get("reference", []) if r is not None]
        out["startup_cpu_s"] = sum(a - b for a, b in zip(cpu_after, cpu_before, strict=True)) - sum(
            references
        )
        out["reference_cpu_ms"] = (
            1000 * sorted(references)[len(references) // 2] if references else None
        )
        out["startup_leader_cpu_s"] = cpu_after[0] - cpu_before[0]
        out["startup_wall_s"] = busy
        out["imports_s"] = max(r.get("imports_s", 0.0) for r in ready)
        errors = [e for s in spawned for e in s.get("errors", [])] + [
            s["error"] for s in spawned if "error" in s
        ]
        out["join_s"], joined = _latest([s.get("joined", []) for s in spawned], go)
        out["payload_s"], _ = _latest([s.get("received", []) for s in spawned], go)
        out["plan_s"], planned = _latest([s.get("planned", []) for s in spawned], go)
        out["started_s"], started = _latest([s.get("started", []) for s in spawned], go)
        out["agents_started"] = started
        for phase in ("join", "payload", "plan", "start"):  # ms of one agent's main thread, median
            values = sorted(v for s in spawned[1:] for v in (s.get("cpu") or {}).get(phase, []))
            out[f"agent_{phase}_cpu_ms"] = 1000 * values[len(values) // 2] if values else None
        out["errors"] = errors[:5]
        # CPU seconds by thread kind from release to ranks started: node 0, one process of others
        out["startup_threads"] = [spawned[0].get("by_thread"), spawned[1].get("by_thread")]
        if spawned[1].get("ops"):  # LA_SCALE_OPS: store queries per agent, release → started
            out["startup_ops"] = [spawned[0]["ops"], spawned[1]["ops"]]
            log(f"scale {n}: store queries per agent from release to ranks started: node 0 "
                f"{spawned[0]['ops']}; one process of others {spawned[1]['ops']}")  # fmt: skip
        out["leader_fds"] = spawned[0].get("fds")
        out["follower_fds"] = [s.get("fds") for s in spawned[1:]]
        out["threads"] = [s.get("threads") for s in spawned]
        log(
            f"scale {n}: joined {out['join_s']}, payload on all {out['payload_s']}, ready (log dir, "
            f"config) {out['plan_s']}, ranks started on "
            f"all {out['started_s']} ({started}/{n} agents){'; ' + errors[0] if errors else ''}; "
            f"CPU {out['startup_cpu_s']:.2f} s in {busy:.2f} s (node 0 {out['startup_leader_cpu_s']:.2f} s); "
            f"per agent (ms, main thread) join {out['agent_join_cpu_ms']}, payload "
            f"{out['agent_payload_cpu_ms']}, ready {out['agent_plan_cpu_ms']}, start ranks "
            f"{out['agent_start_cpu_ms']}"
        )
        if started < n:
            out["error"] = f"only {started} of {n} agents started their ranks"
            return out

        time.sleep(1.0)  # let the start-up's stragglers settle before the idle window
        names = {int(k): v for k, v in (spawned[0].get("names") or {}).items()}
        # one process of other agents too (the first slice): where an idle agent's CPU goes
        sample = procs[1]
        names_of_sample = {int(k): v for k, v in (spawned[1].get("names") or {}).items()}
        threads_before = _thread_cpu(leader.ps)
        sample_before = _thread_cpu(sample.ps)
        before = [p.cpu() for p in procs]
        t0 = time.monotonic()
        for p in procs:
            p.send("count")  # LA_SCALE_OPS: store queries counted from here
        time.sleep(idle_s)
        span = time.monotonic() - t0
        after = [p.cpu() for p in procs]
        out["leader_threads_pct"] = _by_thread(threads_before, _thread_cpu(leader.ps), names, span)
        by_kind = _by_thread(sample_before, _thread_cpu(sample.ps), names_of_sample, span)
        # threads that came and went inside the window (a probe's asker): the process's rest
        whole = 100.0 * (after[1] - before[1]) / span
        by_kind["short-lived threads"] = round(whole - sum(by_kind.values()), 2)
        out["sample_agents"] = ready[1].get("agents")
        out["sample_threads_pct"] = by_kind
        out["idle_window_s"] = span
        out["leader_cpu_pct"] = 100.0 * (after[0] - before[0]) / span
        out["followers_cpu_pct"] = (
            100.0 * sum(a - b for a, b in zip(after[1:], before[1:], strict=True)) / span
        )
        try:
            out["leader_rss_mib"] = leader.ps.memory_info().rss / 2**20
            out["leader_threads"] = leader.ps.num_threads()
            out["leader_fd_count"] = leader.ps.num_fds()
            out["followers_rss_mib"] = sum(p.ps.memory_info().rss for p in procs[1:]) / 2**20
        except psutil.Error:
            pass
        log(
            f"scale {n}: idle {span:.1f} s: node 0 {out['leader_cpu_pct']:.1f} % of a core "
            f"{out['leader_threads_pct']} (fds {out.get('leader_fd_count')}), the other agents "
            f"{out['followers_cpu_pct']:.1f} %; one process of them: {out['sample_threads_pct']}"
        )

        observer = AgentProcess(["observer", str(n), str(port)], env, run / "observer.err")
        procs.append(observer)
        if "error" in observer.expect("ready", 60):
            out["error"] = "the observer could not reach the store"
            return out
        observer.send("watch")
        agents = procs[:-1]
        victim = n - 1
        for p in agents:
            p.send(f"abort {victim}")
        cpu_before = [p.cpu() for p in agents]
        seen = [p.expect("seen", 120) for p in agents]
        out["abort_cpu_s"] = sum(p.cpu() for p in agents) - sum(cpu_before)
        # CPU seconds by thread kind, and store queries per agent, from the abort to all seen
        out["abort_threads"] = [seen[0].get("by_thread"), seen[1].get("by_thread")]
        if seen[1].get("abort_ops"):
            out["abort_ops"] = [seen[0]["abort_ops"], seen[1]["abort_ops"]]
        log(f"scale {n}: from the abort to every agent's teardown, CPU by thread: node 0 "
            f"{seen[0].get('by_thread')}; one process of others {seen[1].get('by_thread')}; "
            f"its store queries per agent {seen[1].get('abort_ops')}")  # fmt: skip
        if seen[0].get("ops"):  # LA_SCALE_OPS: queries a second before the abort, by thread kind
            out["idle_ops_per_s"] = [seen[0]["ops"], seen[1]["ops"]]
            log(f"scale {n}: store queries a second, node 0 {seen[0]['ops']}; one process of "
                f"others {seen[1]['ops']}")  # fmt: skip
        failed = [s["failed_at"] for s in seen if s.get("failed_at") is not None]
        if not failed:
            out["error"] = "the failing rank's process did not answer"
            return out
        at = failed[0]
        abort_at = observer.expect("abort_at", 60).get("abort_at")
        out["abort_set_s"] = abort_at - at if abort_at else None
        out["fanout_s"], saw = _latest([s.get("at", []) for s in seen], at)
        out["agents_saw"] = saw
        released = time.monotonic()
        cpu_before = [p.cpu() for p in agents]
        for p in agents:
            p.send("release")
        done = [p.expect("done", 300) for p in agents]
        # CPU from the release (the fake ranks end) to every agent back from the run
        out["teardown_cpu_s"] = sum(p.cpu() for p in agents) - sum(cpu_before)
        out["teardown_leader_cpu_s"] = agents[0].cpu() - cpu_before[0]
        # CPU seconds by thread kind from the release to every agent back: node 0, one process
        out["teardown_threads"] = [done[0].get("by_thread"), done[1].get("by_thread")]
        results_at = observer.expect("results_at", 60).get("results_at")
        verdict_at = observer.expect("verdict_at", 60).get("verdict_at")
        out["results_s"] = results_at - released if results_at else None
        out["verdict_s"] = verdict_at - results_at if verdict_at and results_at else None
        out["verdict_all_s"], back = _latest([d.get("finished", []) for d in done], released)
        out["left_all_s"], _ = _latest([d.get("left", []) for d in done], released)
        codes: dict[str, int] = {}
        for d in done:
            for code, count in (d.get("codes") or {}).items():
                codes[code] = codes.get(code, 0) + count
        out["codes"] = codes
        out["errors"] += [e for d in done for e in d.get("errors", [])][:5]
        summary = logs / "summary.json"
        if summary.exists():
            out["summary_s"] = (
                summary.stat().st_mtime - (results_at + clock) if results_at else None
            )
            out["summary_bytes"] = summary.stat().st_size
        ranks = logs / "ranks.json"
        out["ranks_json_bytes"] = ranks.stat().st_size if ranks.exists() else None
        out["log_dir"] = str(logs)
        log(
            f"scale {n}: abort in the store {out['abort_set_s']}, seen by {saw}/{n} agents "
            f"{out['fanout_s']}; released → every result {out['results_s']} → summary.json "
            f"{out.get('summary_s')}, verdict {out['verdict_s']}; every agent back "
            f"{out['verdict_all_s']}; codes {codes}; CPU {out['teardown_cpu_s']:.1f} s (node 0 "
            f"{out['teardown_leader_cpu_s']:.1f} s)"
        )
        return out
    finally:
        c.kill_group([p.proc for p in procs])


def rank_files(log_dir: Path, ranks: int) -> float:
    """The files 8 ranks per node would have left (tiny: a few lines each), named as the agent
    names them (agent.plan.log_dir.LogDir.rank_files); returns the seconds it took."""
    t = time.monotonic()
    for rank in range(ranks):
        for stream in ("out", "err"):
            fd = os.open(log_dir / f"rank-{rank:05d}.{stream}", os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, b"".join(b"rank %d step %d loss 0.5\n" % (rank, i) for i in range(12)))
            os.close(fd)
    return time.monotonic() - t
