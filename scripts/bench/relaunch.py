"""7. Relaunch latency: from pressing Enter (just before the launching command's Popen) to (a) every
rank at its first line of user code, (b) the first gloo all_reduce done on every rank, (c) the
command exiting. Warm `agent run` on resident agents against --cold, the one-shot agent and
torchrun (4 loopback nodes × 2 ranks), and on the local Slurm (2 nodes: srun + one-shot agent,
srun + torchrun, warm `agent run` in an salloc). Plus restart latency: a rank fails once, time
from its exit to every rank of attempt 1 at its first line, warm (zygote) against --cold.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import breakdown, cpu_split, launchers
from bench import common as c
from bench.stats import Table, Target, median, ratio, secs, spread, times

NODES, NPROC = 4, 2
SLURM_NODES = 2
RESTART_NODES = 1
FAIL_RANK, FAIL_AFTER = 0, 8.0  # attempt 0's rank 0 fails 8 s after its first line
RUN_TIMEOUT = 120.0
READY_TIMEOUT = 120.0
WARM_WAIT = 30.0  # once every agent is ready, how long to wait for every zygote (then go on)
# Before each timed run, every launcher's: a user's edit → Enter loop is seconds apart, and the
# resident agents do what nobody waits for in that time (the next run's ranks forked ahead).
THINK = 1.0
START_CLUSTER = c.REPO / "scripts" / "slurm" / "start-cluster.sh"
STOP_CLUSTER = c.REPO / "scripts" / "slurm" / "stop-cluster.sh"
# Rough cost of one run of each cell on a loaded 2-core machine (seconds), to plan repetitions.
COST = {"warm": 3.0, "cold": 10.0, "oneshot": 10.0, "torchrun": 12.0}
SLURM_WARM_MIN = 5  # timed warm runs in the salloc session whatever the budget says
SLURM_RESERVE = 45.0  # srun + one-shot, srun + torchrun, the salloc session (serve + runs)

Cmd = launchers.Cmd
CELLS = {  # key: (label, platform)
    "warm": ("`agent run` (warm, resident agents)", "loopback"),
    "cold": ("`agent run --cold` (resident agents)", "loopback"),
    "oneshot": ("one-shot agent (`python -m agent` per node)", "loopback"),
    "torchrun": ("torchrun (c10d, per node)", "loopback"),
    "slurm-warm": ("`agent run` (warm, `srun agent serve` in an salloc)", "slurm"),
    "slurm-oneshot": ("`srun python -m agent`", "slurm"),
    "slurm-torchrun": ("`srun torchrun`", "slurm"),
}


def prog(where: Path, *fail: str) -> list[str]:
    return [c.program("relaunch_rank"), str(where), *fail]


# -- one timed run ------------------------------------------------------------------------------
def timed(
    cmds: Sequence[Cmd],
    where: Path,
    world: int,
    cwd: Path,
    timeout: float = RUN_TIMEOUT,
    log_dir: Path | None = None,
) -> dict[str, Any]:
    """Start `cmds` at once (press = just before the first Popen), wait for them, read the ranks'
    files in `where`: first line, all_reduce done, exit — seconds after the press; with the
    run's `log_dir`, where the time went (breakdown.phases)."""
    time.sleep(THINK)
    cpu_before = cpu_split.snapshot() if log_dir is not None else None
    press = time.time()
    run = c.start(cmds, cwd)
    try:
        run.wait(timeout)
    finally:
        run.kill()
    cpu = cpu_split.split(cpu_before, cpu_split.snapshot()) if cpu_before is not None else None
    exited = len(run.wall_ends) == len(cmds)
    ranks = _rank_records(where, world, 0)
    ok = exited and all(code == 0 for code in run.codes) and len(ranks) == world
    ok = ok and all(r.get("ok") for r in ranks)
    result: dict[str, Any] = {"ok": ok, "codes": run.codes, "ranks_reported": len(ranks)}
    if ok:
        result.update(
            first_line=max(r["first_line"] for r in ranks) - press,
            all_reduce=max(r["all_reduce"] for r in ranks) - press,
            exit=max(run.wall_ends.values()) - press,
            preloaded=sum(1 for r in ranks if r.get("preloaded")),
        )
        if log_dir is not None:
            found = breakdown.phases(press, max(run.wall_ends.values()), ranks, log_dir)
            if found is not None:
                result["phases"] = found
            if cpu is not None:
                result["cpu"] = cpu
    else:
        result["error"] = (
            ("timed out; " if not exited else "") + c.tail(cmds[0][2]) or c.tail(cmds[-1][2])
        )[-1500:]
    return result


def _rank_records(where: Path, world: int, attempt: int) -> list[dict[str, Any]]:
    found = []
    for rank in range(world):
        with contextlib.suppress(OSError, ValueError):
            found.append(json.loads((where / f"rank-{rank}-a{attempt}.json").read_text()))
    return found


# -- resident agents --------------------------------------------------------------------------
def node_states(status_text: str) -> list[tuple[str, str]]:
    """(state, warm|cold) per node line of `agent status`."""
    return re.findall(r"^\s*node\s+\S+\s+\S+\s+(\S+)\s+(warm|cold)\b", status_text, re.M)


def await_agents(
    status: Callable[[], str], nodes: int, timeout: float, alive: Callable[[], bool]
) -> tuple[bool, bool, str]:
    """Until every node is ready and warm (ready, warm, last status text): `timeout` for ready,
    then at most WARM_WAIT more for warm; stops early when the agents die."""
    deadline = time.monotonic() + timeout
    text, ready, warm = "", False, False
    while time.monotonic() < deadline and alive():
        text = status()
        states = node_states(text)
        ready = len(states) == nodes and all(s == "ready" for s, _ in states)
        warm = ready and all(w == "warm" for _, w in states)
        if warm:
            break
        if ready:
            deadline = min(deadline, time.monotonic() + WARM_WAIT)
        time.sleep(0.2)
    return ready, warm, text


class Loopback:
    """NODES `python -m agent serve` on 127.0.0.1..N, each with a fake SLURM env."""

    def __init__(self, work: Path, nodes: int) -> None:
        self.work, self.nodes = work, nodes
        self.job = c.unique_job()
        self.state = work / "relaunch-state"
        self.started: c.Started | None = None

    def client_env(self) -> dict[str, str]:
        """The allocation's shell: SLURM_JOB_ID, state dir and secret, no step variables."""
        return c.base_env(SLURM_JOB_ID=self.job, AGENT_STATE_DIR=str(self.state))

    def start(self) -> None:
        port = c.free_port()
        cmds = [
            (
                [c.PY, "-m", "agent", "serve", "--master-port", str(port)],
                c.base_env(**c.slurm_env(self.job, self.nodes, i), AGENT_STATE_DIR=str(self.state)),
                self.work / f"relaunch-serve{i}.log",
            )
            for i in range(self.nodes)
        ]
        self.started = c.start(cmds, self.work)

    def alive(self) -> bool:
        return self.started is not None and self.started.alive() == len(self.started.procs)

    def status(self) -> str:
        proc = subprocess.run(
            [c.PY, "-m", "agent", "status"],
            env=self.client_env(),
            cwd=self.work,
            capture_output=True,
            text=True,
            timeout=30,
        )
        return proc.stdout

    def run_cmd(self, tag: str, where: Path, extra: Sequence[str] = ()) -> list[Cmd]:
        argv = [c.PY, "-m", "agent", "run", "--nproc-per-node", str(NPROC)]
        argv += ["--log-dir", str(self.work / f"{tag}-logs"), *extra, *prog(where)]
        return [(argv, self.client_env(), self.work / f"{tag}-client.log")]

    def down(self) -> dict[str, Any]:
        """`agent down`, then every agent gone (killed after 30 s); exit codes."""
        if self.started is None:
            return {}
        code: int | str
        try:
            code = subprocess.run(
                [c.PY, "-m", "agent", "down"],
                env=self.client_env(),
                cwd=self.work,
                capture_output=True,
                timeout=30,
            ).returncode
        except subprocess.TimeoutExpired:
            code = "timed out"
        exited = self.started.wait(30.0)
        self.started.kill()
        return {"down_rc": code, "agents_exited": exited, "agent_codes": self.started.codes}

    def dump(self) -> str:
        return "\n".join(c.tail(cmd, 8) for cmd in (self.work.glob("relaunch-serve*.log")))


# -- Slurm ------------------------------------------------------------------------------------
def ctld_reachable() -> bool:
    """slurmctld answers TCP at the address slurm.conf names (sinfo takes ~10 s to give up on a
    controller that is down)."""
    conf = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
    try:
        text = conf.read_text(errors="replace")
    except OSError:
        return False
    host = re.search(r"^\s*SlurmctldHost=([^\s(]+)(?:\(([^)\s]+)\))?", text, re.M | re.I)
    port = re.search(r"^\s*SlurmctldPort=(\d+)", text, re.M | re.I)
    if not host:
        return False
    address = (host.group(2) or host.group(1), int(port.group(1)) if port else 6817)
    try:
        socket.create_connection(address, timeout=1.0).close()
        return True
    except OSError:
        return False


def slurm_nodes() -> list[str]:
    if not ctld_reachable():
        return []
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=10
        ).stdout
        return sorted({n for n, s in re.findall(r"^(\S+) (\S+)$", out, re.M) if s in _UP})
    return []


_UP = ("idle", "mix", "alloc", "comp")


def ensure_slurm(log) -> dict[str, Any]:
    """The local Slurm: used when sinfo answers with 2 nodes; else started with
    scripts/slurm/start-cluster.sh when its binaries are here and we are root (no install)."""
    if not shutil.which("srun") or not shutil.which("salloc"):
        return {"available": False, "why": "no srun/salloc on this machine"}
    if len(slurm_nodes()) >= SLURM_NODES:
        return {"available": True, "started_by_bench": False, "nodes": slurm_nodes()}
    if os.geteuid() != 0 or not shutil.which("slurmctld") or not START_CLUSTER.exists():
        return {"available": False, "why": "sinfo shows no 2 nodes and start-cluster.sh cannot run"}
    log("relaunch: starting the local Slurm (scripts/slurm/start-cluster.sh 2)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["SLURM_LOCAL_NO_INSTALL"] = "1"
    if ctld_reachable():  # a controller that is up, without our 2 nodes: leave it alone
        return {"available": False, "why": "slurmctld is up but sinfo shows no 2 usable nodes"}
    try:
        proc = subprocess.run(
            ["bash", str(START_CLUSTER), str(SLURM_NODES)],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
    except subprocess.TimeoutExpired:
        return {"available": False, "why": "start-cluster.sh did not finish in 90 s"}
    if proc.returncode != 0 or len(slurm_nodes()) < SLURM_NODES:
        return {"available": False, "why": "start-cluster.sh failed: " + proc.stderr[-300:]}
    return {"available": True, "started_by_bench": True, "nodes": slurm_nodes()}


def release_slurm(info: dict[str, Any], log) -> None:
    """Stop the cluster when the bench started it and nobody else has a job on it."""
    if not info.get("started_by_bench") or os.environ.get("LA_BENCH_KEEP_SLURM") == "1":
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        jobs = subprocess.run(
            ["squeue", "-h", "-o", "%A"], capture_output=True, text=True, timeout=10
        ).stdout.split()
        if jobs:
            info["left_running"] = f"jobs {' '.join(jobs)} on it"
            return
        subprocess.run(["bash", str(STOP_CLUSTER)], capture_output=True, timeout=60)
        info["stopped"] = True
        log("relaunch: stopped the local Slurm it had started")


def slurm_env() -> dict[str, str]:
    env = c.base_env()
    env["PATH"] = os.path.dirname(c.PY) + os.pathsep + env.get("PATH", "")
    return env


def srun_oneshot(work: Path, tag: str, where: Path) -> list[Cmd]:
    argv = ["srun", f"-N{SLURM_NODES}", "--ntasks-per-node=1", "--immediate=60", "-J", tag]
    argv += [c.PY, "-m", "agent", "--nproc-per-node", str(NPROC)]
    argv += ["--log-dir", str(work / f"{tag}-logs"), *prog(where)]
    return [(argv, slurm_env(), work / f"{tag}.log")]


def srun_torchrun(work: Path, tag: str, where: Path, first_node: str) -> list[Cmd]:
    argv = ["srun", f"-N{SLURM_NODES}", "--ntasks-per-node=1", "--immediate=60", "-J", tag]
    argv += [c.PY, "-m", "torch.distributed.run", "--nnodes", str(SLURM_NODES)]
    argv += ["--nproc-per-node", str(NPROC), "--rdzv-backend", "c10d"]
    argv += ["--rdzv-endpoint", f"{first_node}:{c.free_port()}", "--rdzv-id", f"bench{tag}"]
    argv += ["--max-restarts", "0", *prog(where)]
    return [(argv, slurm_env(), work / f"{tag}.log")]


def salloc_session(config_path: str) -> int:
    """Inside `salloc -N2`: `srun agent serve &`, await 2 ready and warm, one warm-up run, timed
    runs while the deadline allows (at least one), `agent down`; results to config["out"]."""
    cfg = json.loads(Path(config_path).read_text())
    work, nodes, deadline = Path(cfg["work"]), int(cfg["nodes"]), time.time() + cfg["seconds"]
    env = dict(os.environ)  # the salloc shell: SLURM_JOB_ID, secret, state dir, bench marker
    result: dict[str, Any] = {"runs": [], "ok": False}
    serve_out = work / "relaunch-salloc-serve.log"
    with open(serve_out, "wb") as sink:
        serve = subprocess.Popen(
            ["srun", "--ntasks-per-node=1", c.PY, "-m", "agent", "serve"],
            env=env,
            cwd=work,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def status() -> str:
        return subprocess.run(
            [c.PY, "-m", "agent", "status"], env=env, capture_output=True, text=True, timeout=30
        ).stdout

    def run_cmd(tag: str, where: Path) -> list[Cmd]:
        argv = [c.PY, "-m", "agent", "run", "--nproc-per-node", str(NPROC)]
        argv += ["--log-dir", str(work / f"{tag}-logs"), *prog(where)]
        return [(argv, env, work / f"{tag}-client.log")]

    try:
        t0 = time.monotonic()
        ready, warm, text = await_agents(status, nodes, READY_TIMEOUT, lambda: serve.poll() is None)
        result.update(serve_ready_s=time.monotonic() - t0, ready=ready, warm_at_start=warm)
        if not ready:
            result["error"] = f"agents not ready: {text[-500:]} {c.tail(serve_out)}"
            return 0
        rep = -1  # the warm-up run
        while rep < min(SLURM_WARM_MIN, cfg["runs"]) or time.time() + 3.0 < deadline:
            tag = f"relaunch-slurm-warm-{rep}"
            where = work / tag
            where.mkdir()
            logs = work / f"{tag}-logs"
            one = timed(run_cmd(tag, where), where, nodes * NPROC, work, log_dir=logs)
            one["rep"] = rep
            result["runs"].append(one)
            if not one["ok"] and rep >= 0:
                break
            rep += 1
            if rep >= cfg["runs"]:
                break
        result["ok"] = any(r["ok"] for r in result["runs"] if r["rep"] >= 0)
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            result["down_rc"] = subprocess.run(
                [c.PY, "-m", "agent", "down"], env=env, capture_output=True, timeout=30
            ).returncode
        try:
            result["serve_rc"] = serve.wait(30)
        except subprocess.TimeoutExpired:
            c.kill_group([serve])
            result["serve_rc"] = "killed"
        Path(cfg["out"]).write_text(json.dumps(result))
    return 0


def slurm_warm(work: Path, runs: int, seconds: float) -> dict[str, Any]:
    out = work / "relaunch-salloc.json"
    cfg = {
        "work": str(work),
        "nodes": SLURM_NODES,
        "runs": runs,
        "seconds": seconds,
        "out": str(out),
    }
    (work / "relaunch-salloc-cfg.json").write_text(json.dumps(cfg))
    env = slurm_env()
    env["AGENT_STATE_DIR"] = str(work / "relaunch-salloc-state")
    code = (
        f"import sys; sys.path.insert(0, {str(c.HERE.parent)!r}); "
        "from bench.relaunch import salloc_session; sys.exit(salloc_session(sys.argv[1]))"
    )
    argv = ["salloc", f"-N{SLURM_NODES}", "--immediate=60", "-J", "relaunch-salloc"]
    argv += [c.PY, "-c", code, str(work / "relaunch-salloc-cfg.json")]
    run = c.start([(argv, env, work / "relaunch-salloc.log")], work)
    try:
        run.wait(seconds + READY_TIMEOUT + 60)
    finally:
        run.kill()
    try:
        return json.loads(out.read_text())
    except (OSError, ValueError):
        return {"ok": False, "runs": [], "error": c.tail(work / "relaunch-salloc.log")}


# -- restart ----------------------------------------------------------------------------------
def restart_run(kind: str, work: Path, rep: int) -> dict[str, Any]:
    """One-shot agent, --max-restarts 1: rank FAIL_RANK exits 1 at attempt 0, FAIL_AFTER s after
    its first line. Latency: its exit → every rank of attempt 1 at its first line."""
    tag = f"relaunch-restart-{kind}-{rep}"
    where = work / tag
    where.mkdir()
    extra = ["--max-restarts", "1", *(["--cold"] if kind == "cold" else [])]
    p = prog(where, str(FAIL_RANK), str(FAIL_AFTER))
    cmds = launchers.ours(RESTART_NODES, NPROC, p, work, tag, extra)
    world = RESTART_NODES * NPROC
    run = timed(cmds, where, world, work, RUN_TIMEOUT + FAIL_AFTER)
    result: dict[str, Any] = {"kind": kind, "rep": rep, "codes": run["codes"], "ok": False}
    second = _rank_records(where, world, 1)
    try:
        died = json.loads((where / "died-a0.json").read_text())["died"]
    except (OSError, ValueError, KeyError):
        died = None
    if died is None or len(second) < world or not all(r.get("ok") for r in second):
        result["error"] = run.get("error") or f"attempt 1: {len(second)} of {world} ranks"
        return result
    result.update(
        ok=all(code == 0 for code in run["codes"]),
        first_line=max(r["first_line"] for r in second) - died,
        all_reduce=max(r["all_reduce"] for r in second) - died,
        preloaded=sum(1 for r in second if r.get("preloaded")),
    )
    return result


# -- the section ------------------------------------------------------------------------------
def run(
    rounds: int, warm_per_round: int, slurm_warm_runs: int, budget: c.Budget, work: Path, log
) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    data: dict[str, Any] = {
        "nodes": NODES,
        "nproc_per_node": NPROC,
        "slurm_nodes": SLURM_NODES,
        "restart_nodes": RESTART_NODES,
        "fail_after": FAIL_AFTER,
        "runs": runs,
    }

    def record(cell: str, rep: int, result: dict[str, Any]) -> None:
        result.update(cell=cell, rep=rep)
        runs.append(result)
        if result["ok"]:
            log(
                f"relaunch: {cell:14s} rep {rep}: first line {secs(result['first_line'])}, "
                f"all_reduce {secs(result['all_reduce'])}, exit {secs(result.get('exit'))}"
                + (f", {result['preloaded']} preloaded" if "preloaded" in result else "")
            )
        else:
            log(f"relaunch: {cell} rep {rep}: FAILED {result['codes']} {result.get('error', '')}")

    def one(cell: str, rep: int, cmds_for: Callable[[str, Path], list[Cmd]], world: int) -> None:
        tag = f"relaunch-{cell}-{rep}"
        where = work / tag
        where.mkdir()
        logs = work / f"{tag}-logs"  # the resident runs' (Loopback.run_cmd)
        record(cell, rep, timed(cmds_for(tag, where), where, world, work, log_dir=logs))

    world = NODES * NPROC
    agents = Loopback(work, NODES)
    started = time.monotonic()
    agents.start()
    try:
        ready, warm, text = await_agents(agents.status, NODES, READY_TIMEOUT, agents.alive)
        data["serve_ready_s"] = time.monotonic() - started
        data["warm_at_start"] = warm
        log(
            f"relaunch: {NODES} resident agents ready in {data['serve_ready_s']:.1f} s (warm: {warm})"
        )
        if not ready:
            data["serve_error"] = (text + "\n" + agents.dump())[-1500:]
            log(f"relaunch: resident agents not ready: {data['serve_error']}")
        elif not warm:
            log(f"relaunch: not every zygote ready after {WARM_WAIT:.0f} s: {text}")
        else:
            one("warm-up", 0, lambda tag, where: agents.run_cmd(tag, where), world)
        slurm_reserve = SLURM_RESERVE if shutil.which("srun") else 0.0
        for rnd in range(rounds):
            cost = warm_per_round * COST["warm"] + sum(
                COST[k] for k in ("cold", "oneshot", "torchrun")
            )
            if rnd > 0 and budget.left() < cost + slurm_reserve:
                log(f"relaunch: budget spent after {rnd} round(s)")
                break
            if ready:
                for i in range(warm_per_round):
                    one("warm", rnd * warm_per_round + i, agents.run_cmd, world)
                one("cold", rnd, lambda t, w: agents.run_cmd(t, w, ["--cold"]), world)
            one("oneshot", rnd, lambda t, w: launchers.ours(NODES, NPROC, prog(w), work, t), world)
            one(
                "torchrun",
                rnd,
                lambda t, w: launchers.torchrun(NODES, NPROC, prog(w), work, t),
                world,
            )
            if rnd == 0:  # restart latency once per kind (each costs FAIL_AFTER + a start)
                for kind in ("warm", "cold"):
                    result = restart_run(kind, work, rnd)
                    result["cell"] = f"restart-{kind}"
                    runs.append(result)
                    log(
                        f"relaunch: restart {kind}: "
                        + (
                            f"failure → attempt 1 first line {secs(result['first_line'])}, "
                            f"all_reduce {secs(result['all_reduce'])}, "
                            f"{result['preloaded']} preloaded"
                            if "first_line" in result
                            else f"FAILED {result['codes']} {result.get('error', '')}"
                        )
                    )
    finally:
        data["loopback_down"] = agents.down()
    single = Loopback(work, 1)  # the breakdown's smallest shape: one node × NPROC warm ranks
    single.start()
    try:
        ready, warm, _ = await_agents(single.status, 1, READY_TIMEOUT, single.alive)
        if ready and warm:
            one("warm-1-up", 0, single.run_cmd, NPROC)
            for i in range(warm_per_round):
                one("warm-1", i, single.run_cmd, NPROC)
    finally:
        data["single_down"] = single.down()
    data["client_alone"] = client_alone(warm_per_round)
    data["slurm"] = info = ensure_slurm(log)
    if not info["available"]:
        log(f"relaunch: Slurm skipped: {info['why']}")
        return data
    try:
        first = info["nodes"][0]
        w = SLURM_NODES * NPROC
        one("slurm-oneshot", 0, lambda t, where: srun_oneshot(work, t, where), w)
        one("slurm-torchrun", 0, lambda t, where: srun_torchrun(work, t, where, first), w)
        seconds = max(5.0, min(30.0, budget.left() - 10.0))
        session = slurm_warm(work, slurm_warm_runs, seconds)
        info["session"] = {k: v for k, v in session.items() if k != "runs"}
        for result in session["runs"]:
            record("slurm-warm" if result["rep"] >= 0 else "slurm-warm-up", result["rep"], result)
        if not session["runs"]:
            log(f"relaunch: salloc session failed: {session.get('error', '')}")
    finally:
        release_slurm(info, log)
    return data


def client_alone(reps: int) -> dict[str, float | None]:
    """The client's own floor, measured alone in this run (median wall of `reps` each): a bare
    interpreter, and one that imports what `agent run` imports before it connects."""

    def wall(code: str) -> float | None:
        times = []
        for _ in range(reps):
            started = time.perf_counter()
            subprocess.run([c.PY, "-c", code], env=c.base_env(), check=True, timeout=60)
            times.append(time.perf_counter() - started)
        return median(times)

    return {"interpreter": wall("pass"), "client": wall("import agent.serve.commands")}


# -- report -----------------------------------------------------------------------------------
def _values(data: dict[str, Any], cell: str, key: str) -> list[float]:
    return [r[key] for r in data["runs"] if r.get("cell") == cell and r["ok"] and key in r]


def summarize(data: dict[str, Any]) -> tuple[list[Table], list[Target], dict[str, Any]]:
    n, p, sn = data["nodes"], data["nproc_per_node"], data["slurm_nodes"]
    table = Table(
        "7. Relaunch latency (Enter → every rank at its first line / first all_reduce done on "
        "every rank / command exited; median, min–max in brackets)",
        [
            "launcher",
            "nodes × ranks",
            "runs",
            "(a) first line",
            "(b) all_reduce done",
            "(c) exit",
            "(b) ÷ warm (b)",
            "ranks forked warm",
        ],
    )
    med: dict[str, dict[str, float | None]] = {}
    for cell, (label, platform) in CELLS.items():
        shape = f"{sn} × {p} (Slurm)" if platform == "slurm" else f"{n} × {p} (loopback)"
        vals = {k: _values(data, cell, k) for k in ("first_line", "all_reduce", "exit")}
        med[cell] = {k: median(v) for k, v in vals.items()}
        failed = sum(1 for r in data["runs"] if r.get("cell") == cell and not r["ok"])
        if not vals["all_reduce"] and not failed:
            if platform == "slurm":
                table.add(label, shape, "skipped", *["-"] * 5)
            continue
        base = "slurm-warm" if platform == "slurm" else "warm"
        pre = [r.get("preloaded", 0) for r in data["runs"] if r.get("cell") == cell and r["ok"]]
        table.add(
            label,
            shape,
            f"{len(vals['all_reduce'])}" + (f" (+{failed} failed)" if failed else ""),
            *(f"{secs(med[cell][k])} ({spread(vals[k])})" for k in vals),
            times(ratio(med[cell]["all_reduce"], med[base]["all_reduce"])),
            _forked(pre, sn * p if platform == "slurm" else n * p),
        )
    warm_b = med["warm"]["all_reduce"]
    slurm_tr = med["slurm-torchrun"]["all_reduce"]
    if med["slurm-warm"]["all_reduce"] is not None and slurm_tr is not None:
        speed, vs = ratio(slurm_tr, med["slurm-warm"]["all_reduce"]), "srun + torchrun (Slurm)"
        warm_name = "warm `agent run` on Slurm (2 × 2)"
    elif slurm_tr is not None:
        speed, vs = ratio(slurm_tr, warm_b), "srun + torchrun (Slurm 2 × 2)"
        warm_name = f"warm `agent run` ({n} × {p} loopback)"
    else:
        speed, vs = ratio(med["torchrun"]["all_reduce"], warm_b), "loopback torchrun (no Slurm)"
        warm_name = f"warm `agent run` ({n} × {p} loopback)"
    targets = [
        Target(
            f"relaunch, warm `agent run` {n} × {p} loopback: (b) all_reduce done",
            "≤ 0.3 s",
            secs(warm_b),
            None if warm_b is None else warm_b <= 0.3,
        ),
        Target(
            f"relaunch: {warm_name} vs {vs}, (b)",
            "≥ 10× faster",
            times(speed),
            None if speed is None else speed >= 10.0,
        ),
    ]
    warm_loop_vs_srun = ratio(slurm_tr, warm_b)
    table.notes += [
        f"Every timed run starts {THINK:g} s after the previous one ended (a user's loop is "
        "seconds apart; resident agents fork the next run's ranks in that time). "
        "press = time.time() just before the launching command's Popen (for the loopback one-shot "
        "agent and torchrun: before the first of the 4 per-node processes, started at once); (a) = "
        "max over ranks of the rank's first-line time.time(); (b) = max over ranks of the time its "
        "first gloo all_reduce returned; (c) = the last launching process exited.",
        "warm: resident `agent serve` agents started once (a zygote per node that preloaded torch), "
        "one untimed warm-up run, then the timed runs; the client `python -m agent run` is a fresh "
        "interpreter each time. --cold: the same agents, ranks started as fresh interpreters. "
        "'ranks forked warm': ranks that found torch already imported at their first line.",
        f"resident agents ready (and warm) {secs(data.get('serve_ready_s'))} after `serve` started "
        f"(warm at start: {data.get('warm_at_start')}); not part of any run's latency.",
        f"Slurm: the local cluster (scripts/slurm/start-cluster.sh, {sn} slurmd on this host); "
        "srun -N2 --ntasks-per-node=1 from outside an allocation (allocation included, as typed); "
        "torchrun with --rdzv-backend c10d --rdzv-endpoint n1:PORT; warm: `srun agent serve &` "
        "inside `salloc -N2`, runs timed from inside the allocation. "
        + _slurm_note(data)
        + (
            f" Loopback warm 4 × 2 vs srun + torchrun (b): {times(warm_loop_vs_srun)} faster."
            if warm_loop_vs_srun is not None
            else ""
        ),
    ]
    restart = Table(
        f"7b. Restart latency (one-shot agent, {data['restart_nodes']} loopback node × {p} "
        f"ranks, --max-restarts 1; rank {FAIL_RANK} exits 1 {data['fail_after']:.0f} s after its "
        "first line at attempt 0; its exit → every rank of attempt 1 at its first line / "
        "all_reduce done)",
        [
            "restart",
            "runs",
            "first line",
            "all_reduce done",
            "ranks forked warm",
            "first line ÷ warm",
            "all_reduce ÷ warm",
        ],
    )
    rmed: dict[str, float | None] = {}
    rmed_b: dict[str, float | None] = {}
    for kind in ("warm", "cold"):
        cell = f"restart-{kind}"
        rs = [r for r in data["runs"] if r.get("cell") == cell and "first_line" in r]
        if not rs and not any(r.get("cell") == cell for r in data["runs"]):
            continue
        rmed[kind] = median([r["first_line"] for r in rs])
        rmed_b[kind] = median([r["all_reduce"] for r in rs])
        failed = sum(1 for r in data["runs"] if r.get("cell") == cell and "first_line" not in r)
        restart.add(
            "warm (zygote prepared during attempt 0)" if kind == "warm" else "--cold",
            f"{len(rs)}" + (f" (+{failed} failed)" if failed else ""),
            f"{secs(rmed[kind])} ({spread([r['first_line'] for r in rs])})",
            f"{secs(rmed_b[kind])} ({spread([r['all_reduce'] for r in rs])})",
            _forked([r["preloaded"] for r in rs], data["restart_nodes"] * p),
            times(ratio(rmed[kind], rmed.get("warm"))),
            times(ratio(rmed_b[kind], rmed_b.get("warm"))),
        )
    restart.notes += [
        f"The failing rank fails {data['fail_after']:.0f} s after its first line, so the zygote the "
        "one-shot agent prepares while attempt 0 runs (torch import) is ready by then; a failure "
        "before it is ready restarts cold. The time is taken just before os._exit(1).",
    ]
    where_tables = [_breakdown_table(data, n, p, sn)]
    summary = {
        "median": med,
        "restart": {"first_line": rmed, "all_reduce": rmed_b},
        "warm_vs_torchrun": speed,
    }
    return [table, restart, *where_tables], targets, summary


def _breakdown_table(data: dict[str, Any], n: int, p: int, sn: int) -> Table:
    """7c: the median of each phase (breakdown.PHASES) over the warm runs of each shape."""
    shapes = (("warm-1", f"1 × {p} (loopback)"), ("warm", f"{n} × {p} (loopback)"),
              ("slurm-warm", f"{sn} × {p} (Slurm)"))  # fmt: skip
    table = Table(
        "7c. Where a warm `agent run` spends Enter → prompt (median seconds per phase)",
        ["phase", *(label for _, label in shapes)],
    )
    runs = {cell: [r["phases"] for r in data["runs"] if r.get("cell") == cell and r.get("phases")]
            for cell, _ in shapes}  # fmt: skip
    for name, what in breakdown.PHASES:
        table.add(what, *(secs(median([r[name] for r in runs[cell]])) for cell, _ in shapes))
    table.add("Enter → prompt (the sum)",
              *(secs(median([sum(r.values()) for r in runs[cell]])) for cell, _ in shapes))  # fmt: skip
    cpu = {cell: [r["cpu"] for r in data["runs"] if r.get("cell") == cell and r.get("cpu")]
           for cell, _ in shapes}  # fmt: skip
    cores = len(os.sched_getaffinity(0))
    for key, what in CPU_ROWS:
        table.add(what, *("-" if cell in UNDER_SLURMD and key in PER_AGENT else
                          _core_s(median([r[key] for r in cpu[cell]])) for cell, _ in shapes))  # fmt: skip
    table.add(f"the floor on {cores} cores: the machine's CPU ÷ {cores}",
              *(secs(median([r["total"] / cores for r in cpu[cell]])) for cell, _ in shapes))  # fmt: skip
    table.add(f"… this work's floor: the client's CPU (it runs first, alone) + the rest ÷ {cores}",
              *(secs(median([r["client"] + (r["total"] - r["client"]) / cores for r in cpu[cell]]))
                for cell, _ in shapes))  # fmt: skip
    table.add(f"the user's own floor: the ranks' CPU ÷ {cores}",
              *("-" if cell in UNDER_SLURMD else secs(median([r["ranks"] / cores for r in cpu[cell]]))
                for cell, _ in shapes))  # fmt: skip
    alone = data.get("client_alone") or {}
    table.notes += [
        "CPU: core-seconds from Enter to the prompt (cpu_split.py): the machine's from /proc/stat; "
        "the client's as this process reaped it; each resident agent's own and what it reaped "
        "(its ranks, adopted); each zygote's own and what it reaped (the middle process of "
        "each fork); 'other': the bench and the rest of the machine. Slurm's agents run under "
        "slurmd, not the bench: theirs and their ranks' CPU is in 'other' there ('-').",
        f"The client alone, same run (median wall): a bare interpreter {secs(alone.get('interpreter'))}, "
        f"one that imports what `agent run` imports before it connects {secs(alone.get('client'))}.",
        "From the run's own files: node 0's agent log (ms timestamps), each rank's record "
        "(relaunch_rank.py), summary.json (each rank's exit as its agent saw it; the file's "
        "time), and the bench's clock at Enter and at the client's exit ('-': no such run). "
        "The user's work is the all_reduce row; "
        "the client's interpreter start (~0.06-0.1 s, `python -m agent --help`) is in the first.",
    ]
    return table


UNDER_SLURMD = ("slurm-warm",)  # its agents and ranks are not the bench's descendants
PER_AGENT = ("ranks", "agents", "zygotes")
CPU_ROWS = (
    ("total", "CPU, Enter → prompt: the machine (core-seconds)"),
    ("ranks", "… the ranks (the user's script, start to exit)"),
    ("client", "… the client (`python -m agent run`)"),
    ("agents", "… the agents"),
    ("zygotes", "… the zygotes (the forks)"),
    ("other", "… other (the bench, the machine)"),
)


def _core_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _forked(counts: list[int], world: int) -> str:
    if not counts:
        return "-"
    low, high = min(counts), max(counts)
    return f"{low} of {world}" if low == high else f"{low}–{high} of {world}"


def _slurm_note(data: dict[str, Any]) -> str:
    info = data.get("slurm") or {}
    if not info.get("available"):
        return f"Skipped: {info.get('why', 'not run')}."
    note = "Started by the bench." if info.get("started_by_bench") else "Already running."
    if info.get("stopped"):
        note += " Stopped again at the end."
    elif info.get("left_running"):
        note += f" Left running ({info['left_running']})."
    session = info.get("session") or {}
    if session.get("error"):
        note += f" salloc session: {session['error'][:300]}"
    if "serve_ready_s" in session:
        note += f" Resident agents in the salloc ready in {secs(session['serve_ready_s'])}."
    return note
