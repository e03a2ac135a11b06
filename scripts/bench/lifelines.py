"""13. Lifelines at scale: what node 0 pays to hold 4,096 agents' lifelines, and how fast it
notices one that drops.

Node 0 runs in a process of its own (`python scripts/bench/lifelines.py node0 MODE AGENTS`): the
real Endpoint (HMAC handshake, AES-GCM frames) on loopback. MODE `selector`: the lifelines as
the agents hold them (agent.control.lifeline: one thread watches them all); MODE `threads`, the
baseline in the same run: a thread per connection blocked in its read, as the endpoint serves
every other client (and the resident agents' console feeds). The bench process opens AGENTS - 1
lifelines (handshakes over a few threads, so no address exceeds the endpoint's per-address cap),
and one more from each of a few child processes, which it SIGKILLs one at a time: kill → node 0
calls the loss (node 0 prints the time). Measured on node 0: connections held, RSS and threads
before and after, CPU over an idle stretch (/proc), the time to notice each drop.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.stats import Table, Target, median, secs, spread

SIZES = (4096,)
CONNECTORS = 8  # client threads doing handshakes at once (the endpoint allows 16 per address)
KILLS = 5
NOTICE_TARGET = 0.05  # seconds from SIGKILL to node 0 calling the loss
SECRET = b"lifelines-bench"
REPO = Path(__file__).resolve().parents[2]


def _key() -> bytes:
    from agent.node.trust import JobKeys

    return JobKeys.derive(SECRET, "bench", "0").client_key


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _node0(mode: str, agents: int) -> None:
    """The node-0 process: serve lifelines until stdin closes; answer `stats` on stdin."""
    from agent.control import wire
    from agent.control.endpoint import Endpoint
    from agent.control.lifeline import Lifelines

    _raise_nofile()
    out_lock = threading.Lock()
    held = [0]

    def say(line: str) -> None:
        with out_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def lost(node: int, _reason: str) -> None:
        say(f"lost {node} {time.time():.6f}")

    class Threads:  # the baseline: a thread per connection, blocked in its read
        def handle(self, channel: wire.Channel, first: dict[str, Any]) -> None:
            node = first.get("node")
            with out_lock:
                held[0] += 1
            try:
                message = channel.recv(None)
            except Exception:
                message = None
            with out_lock:
                held[0] -= 1
            if message is None or not message.get("bye"):
                lost(int(node) if isinstance(node, int) else -1, "")

    lines = Lifelines(agents, lost).start() if mode == "selector" else None
    endpoint = Endpoint(_key(), Threads(), lines)
    endpoint.start()
    say(f"port {endpoint.port}")
    for command in sys.stdin:
        if command.strip() == "stats":
            count = lines.held if lines is not None else held[0]
            say(f"stats {count} {_rss()} {threading.active_count()} {_cpu():.6f}")
    endpoint.close()


def _rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


CHILD = """
import sys, time
from agent.control.lifeline import Lifeline
line = Lifeline("127.0.0.1", int(sys.argv[1]), bytes.fromhex(sys.argv[2]), int(sys.argv[3]))
line.connected.wait(60)
print("held", flush=True)
time.sleep(3600)
"""


class Node0:
    def __init__(self, mode: str, agents: int) -> None:
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'scripts'}"}
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "node0", mode, str(agents)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        self.lost: dict[int, float] = {}
        self._stats: list[str] = []
        self._cond = threading.Condition()
        self.port = int(self._line().split()[1])
        threading.Thread(target=self._read, daemon=True).start()

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def _read(self) -> None:
        while True:
            line = self._line()
            if not line:
                return
            kind, *rest = line.split()
            with self._cond:
                if kind == "lost":
                    self.lost[int(rest[0])] = float(rest[1])
                else:
                    self._stats.append(line)
                self._cond.notify_all()

    def stats(self) -> dict[str, float]:
        assert self.proc.stdin is not None
        with self._cond:
            before = len(self._stats)
            self.proc.stdin.write("stats\n")
            self.proc.stdin.flush()
            self._cond.wait_for(lambda: len(self._stats) > before, 30)
            _, held, rss, threads, cpu = self._stats[-1].split()
        return {"held": int(held), "rss": int(rss), "threads": int(threads), "cpu": float(cpu)}

    def await_lost(self, node: int, timeout: float) -> float | None:
        with self._cond:
            self._cond.wait_for(lambda: node in self.lost, timeout)
            return self.lost.get(node)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _open(port: int, key: bytes, nodes: range) -> list[Any]:
    from agent.control import wire

    def one(node: int) -> Any:
        channel = wire.connect_retrying("127.0.0.1", port, key, 10.0, 60.0)
        channel.send({"op": "lifeline", "node": node})
        return channel

    with ThreadPoolExecutor(CONNECTORS) as pool:
        return list(pool.map(one, nodes))


def one(mode: str, agents: int, idle_s: float, log) -> dict[str, Any]:
    _raise_nofile()
    key = _key()
    node0 = Node0(mode, agents)
    result: dict[str, Any] = {"mode": mode, "agents": agents, "ok": False}
    channels: list[Any] = []
    children: list[subprocess.Popen] = []
    try:
        empty = node0.stats()
        started = time.monotonic()
        channels = _open(node0.port, key, range(1, agents - KILLS))
        opened = time.monotonic() - started  # the handshakes (the children start below)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        for node in range(agents - KILLS, agents):
            child = subprocess.Popen(
                [sys.executable, "-c", CHILD, str(node0.port), key.hex(), str(node)],
                stdout=subprocess.PIPE,
                env=env,
                text=True,
            )
            children.append(child)
        for child in children:
            assert child.stdout is not None and child.stdout.readline().strip() == "held"
        deadline = time.monotonic() + 30
        full = node0.stats()
        while full["held"] < agents - 1 and time.monotonic() < deadline:
            full = node0.stats()
        idle_from = node0.stats()
        time.sleep(idle_s)  # measuring an idle stretch, not waiting for anything
        idle_to = node0.stats()
        notices = []
        for node, child in zip(range(agents - KILLS, agents), children, strict=True):
            killed = time.time()
            os.kill(child.pid, signal.SIGKILL)
            seen = node0.await_lost(node, 30)
            child.wait()
            if seen is not None:
                notices.append(seen - killed)
        result.update(
            ok=full["held"] == agents - 1 and len(notices) == KILLS,
            held=full["held"],
            open_s=opened,
            rss_empty=empty["rss"],
            rss_full=full["rss"],
            threads_empty=empty["threads"],
            threads_full=full["threads"],
            idle_cpu_per_s=(idle_to["cpu"] - idle_from["cpu"]) / idle_s,
            notices=notices,
            false_losses=len([n for n in node0.lost if n < agents - KILLS]),
        )
        log(f"lifelines {mode} × {agents}: {result}")
        return result
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        for channel in channels:
            channel.close()
        node0.close()


def run(sizes: tuple[int, ...], idle_s: float, work: Path, log) -> dict[str, Any]:
    del work
    jobs = [one(mode, agents, idle_s, log) for agents in sizes for mode in ("selector", "threads")]
    return {"jobs": jobs, "idle_s": idle_s, "connectors": CONNECTORS}


def summarize(data: dict[str, Any]) -> tuple[Table, list[Target], dict[str, Any]]:
    table = Table(
        f"13. Lifelines: node 0 holding every agent's connection (real endpoint on loopback; "
        f"{data['connectors']} client threads handshaking at once; idle CPU over "
        f"{data['idle_s']:g} s; SIGKILL of a child holding one → node 0 calls the loss, "
        f"{KILLS} kills, median (min–max))",
        ["agents", "node 0 holds them with", "held", "handshakes, all", "RSS empty → held",
         "per connection", "threads", "idle CPU (of one core)", "kill → loss noticed",
         "false losses"],
    )  # fmt: skip
    summary: dict[str, Any] = {}
    targets: list[Target] = []
    for job in data["jobs"]:
        if not job.get("ok"):
            table.add(str(job["agents"]), job["mode"], "failed", *["-"] * 7)
            continue
        grown = job["rss_full"] - job["rss_empty"]
        notice = median(job["notices"])
        table.add(
            f"{job['agents']:,}",
            "one selector thread" if job["mode"] == "selector" else "a thread each (baseline)",
            f"{job['held']:,}",
            secs(job["open_s"]),
            f"{job['rss_empty'] / 2**20:.1f} → {job['rss_full'] / 2**20:.1f} MiB",
            f"{grown / job['held'] / 1024:.1f} KiB",
            f"{job['threads_empty']} → {job['threads_full']}",
            f"{100 * job['idle_cpu_per_s']:.2f} %",
            f"{1000 * notice:.1f} ms ({spread([1000 * n for n in job['notices']])} ms)",
            str(job["false_losses"]),
        )
        summary[f"{job['agents']}-{job['mode']}"] = {
            "rss_per_connection": grown / job["held"],
            "idle_cpu_per_s": job["idle_cpu_per_s"],
            "notice": notice,
        }
        if job["mode"] == "selector":
            targets.append(
                Target(
                    f"lifelines: a drop noticed among {job['agents']:,}",
                    f"≤ {1000 * NOTICE_TARGET:g} ms",
                    secs(notice, 3),
                    notice is not None and notice <= NOTICE_TARGET,
                )
            )
    return table, targets, summary


if __name__ == "__main__" and sys.argv[1:2] == ["node0"]:
    _node0(sys.argv[2], int(sys.argv[3]))
