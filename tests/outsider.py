"""An outsider on the cluster network, for the tampering fuzzer: torch's own TCPStore client on a
job's store port. It lists the keys as anyone can, and at a seeded random schedule applies what
torch lets anyone do: set garbage, set an older value of the same key (captured earlier), add ±N
on a counter, delete a key, compare_set. It keeps what it did per key family for reports, and a
job's outcome (exit codes, root cause kind and rank, attempts) to compare with the untampered
shape's. Shapes, outcomes and the runner are shared by tests/test_e2e_fuzz.py and
scripts/soak_tampering.py."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path

from cluster import FIXTURE, REPO, Cluster, base_env, kill_job_processes, slurm_env, wait_for
from serving import Serving

from agent.world import PORT_HIGH, PORT_LOW, derive_port

OPS = ("garbage", "replay", "add", "delete", "compare_set")
NAMESPACE = re.compile(r"^la/[0-9a-f]{32}/")
NUMBER = re.compile(r"^-?\d+$")
TOKEN = re.compile(r"^[0-9a-f]{8,}$")


def family(key: str) -> str:
    """The key's path with the namespace and numbers folded: `la/<ns>/r0/a0/standing/1` →
    `r0/a0/standing/*` (run and attempt kept: r0/a0 and r0/a1 are told apart)."""
    inside = NAMESPACE.match(key)
    path = key[inside.end() :] if inside else "(outside)/" + key
    return "/".join("*" if NUMBER.match(p) or TOKEN.match(p) else p for p in path.split("/"))


def _counter(value: bytes) -> bool:
    return bool(NUMBER.match(value.decode("ascii", "replace"))) if len(value) < 24 else False


@dataclass
class Outsider:
    """A thread that tampers with the store at `port` from its first key until stop()."""

    port: int
    seed: int
    mean_gap: float = 0.03  # seconds between operations, exponentially distributed
    tried: Counter = field(default_factory=Counter)  # (family, op) → operations that reached it
    history: dict[str, list[bytes]] = field(default_factory=lambda: defaultdict(list))
    log: list[str] = field(default_factory=list)  # the first operations, for a failure message
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Outsider:
        self._thread = threading.Thread(target=self._run, name="outsider", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _connect(self):
        """torch's client, or None where no server answered within 2 s."""
        from torch.distributed import TCPStore

        try:
            return TCPStore(
                "127.0.0.1", self.port, is_master=False, wait_for_workers=False,
                timeout=timedelta(seconds=2),
            )  # fmt: skip
        except (RuntimeError, ValueError):
            return None  # torch's client tried for 2 s

    def _run(self) -> None:
        rng = random.Random(self.seed)
        store = None
        while store is None and not self._stop.is_set():
            store = self._connect()  # node 0's store may not be up yet
        while not self._stop.wait(rng.expovariate(1 / self.mean_gap)):
            try:
                keys = sorted(store.list_keys())
            except (RuntimeError, ValueError):  # our own add met a non-number, or the job ended
                store = None  # a busy server may leave a connect unanswered: try until stop()
                while store is None and not self._stop.is_set():
                    store = self._connect()
                continue
            if not keys:
                continue
            key = rng.choice(keys)
            op = rng.choice(OPS)
            try:
                self._apply(store, rng, key, op)
            except (RuntimeError, ValueError):
                continue  # the key went away between the listing and the operation

    def _current(self, store, key: str) -> bytes | None:
        if not store.check([key]):
            return None
        value = bytes(store.get(key))
        seen = self.history[key]
        if not seen or seen[-1] != value:
            seen.append(value)
        return value

    def _apply(self, store, rng: random.Random, key: str, op: str) -> None:
        value = self._current(store, key)  # captured for later replays, whatever the op
        if value is None:
            return
        older = [v for v in self.history[key] if v != value]
        if op == "replay" and not older:
            op = "garbage"
        if op == "add" and not _counter(value):
            op = "delete" if rng.random() < 0.3 else "garbage"
        if op == "garbage":
            store.set(key, rng.choice([b"", b"garbage", b"7", b"{}", rng.randbytes(48)]))
        elif op == "replay":
            store.set(key, rng.choice(older))
        elif op == "add":
            store.add(key, rng.choice([1, -1, 1000, -1000, rng.randint(-5, 5)]))
        elif op == "delete":
            store.delete_key(key)
        else:  # compare_set: the current value for an older one or garbage
            store.compare_set(key, value, rng.choice(older) if older else b"garbage")
        self.tried[(family(key), op)] += 1
        if len(self.log) < 400:
            self.log.append(f"{op} {family(key)}")


@dataclass(frozen=True)
class Shape:
    """A job the fuzzer tampers with: `kind` picks the driver (one-shot agents, a rank paused and
    continued by `agent debug`, `agent exec`, resident agents serving one run), `args` its
    command line, `expected` the untampered outcome (see the drivers)."""

    name: str
    kind: str
    args: tuple[str, ...]
    expected: tuple
    typical: float = 15.0  # seconds untampered, generously (~5-10 s here; resident agents ~12)


def _shape(name: str, agent: str, rank: str, expected: tuple) -> Shape:
    return Shape(name, "one-shot", (*agent.split(), FIXTURE, *rank.split()), expected)


PAUSE_JOB = str(REPO / "tests" / "fixtures" / "pause_job.py")
RULE = "-" * 16
SHAPES = {
    s.name: s
    for s in (
        _shape(
            "clean", "--nproc-per-node 1", "--steps 25 --step-time 0.1", ((0, 0), None, None, 1)
        ),
        _shape(
            "restart",
            "--nproc-per-node 1 --max-restarts 1",
            "--on 1 --exit 3 --fail-attempts 1 --linger-attempts 1 --after 1.5",
            ((0, 0), None, None, 2),
        ),
        _shape(
            "failure",
            "--nproc-per-node 1",
            "--on 1 --exit 3 --after 2 --others-wait",
            ((1, 1), "rank", 1, 1),
        ),
        _shape(
            "hang",
            "--nproc-per-node 1 --hang-timeout 3 --max-infra-restarts 0",
            "--on 99 --others-wait",
            ((1, 1), "hang", None, 1),
        ),
        # rank 1 pauses in breakpoint(), rank 0 waits for it silently past --hang-timeout;
        # `agent debug --rank 1 -c c` continues it: both exit 0, the client too
        Shape("debug", "debug", ("--hang-timeout", "3", PAUSE_JOB), ((0, 0), None, None, 1, 0)),
        # node 1's command fails: node 0 collates both results and names node 1
        Shape(
            "exec",
            "exec",
            ("--", "sh", "-c", 'sleep 5; echo "exit $CODE"; exit "$CODE"'),
            (
                (1, 3),
                f"{RULE}\n127.0.0.1 (exit 0)\n{RULE}\nexit 0\n"
                f"{RULE}\n127.0.0.2 (exit 3)\n{RULE}\nexit 3\n",
            ),
        ),  # fmt: skip
        # resident agents come up, serve one run whose rank 1 fails, and go down on request
        replace(
            _shape(
                "resident",
                "--nproc-per-node 1",
                "--on 1 --exit 3 --after 1 --others-wait",
                (1, "rank", 1, 1, 0, (0, 0)),
            ),
            kind="resident",
            typical=25.0,
        ),  # fmt: skip
    )
}


def outcome(cluster: Cluster, codes: list[int]) -> tuple:
    """(exit codes, root cause kind, its rank, attempts): what tampering must not change."""
    try:
        summary = cluster.summary()
    except (OSError, ValueError):
        return (tuple(codes), "no summary", None, None)
    return (tuple(codes), *_cause(summary))


def _cause(summary: dict) -> tuple:
    cause = summary.get("root_cause") or {}
    return (cause.get("kind"), cause.get("rank"), len(summary.get("attempts") or ()))


@dataclass
class Result:
    shape: str
    seed: int
    outcome: tuple
    expected: tuple
    took: float
    outsider: Outsider | None
    dump: str = ""

    @property
    def changed(self) -> bool:
        return self.outcome != self.expected

    def describe(self) -> str:
        ops = ", ".join(self.outsider.log[:12]) if self.outsider else "none"
        return (
            f"shape {self.shape} seed {self.seed}: expected {self.expected}, got {self.outcome} "
            f"in {self.took:.1f}s; first operations: {ops}"
        )


@dataclass
class Tampering:
    """What a driver is handed: the job's time left, and the outsider to start on a store port."""

    seed: int | None
    deadline: float
    outsider: Outsider | None = None

    def left(self) -> float:
        return max(0.1, self.deadline - time.monotonic())

    def on(self, port: int) -> None:
        if self.seed is not None:
            self.outsider = Outsider(port, self.seed).start()


def run_job(tmp: Path, shape: Shape, seed: int | None, limit: float = 90.0) -> Result:
    """One 2-node loopback job of `shape`, tampered with at `seed`'s schedule (None: untampered)."""
    tmp.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    tampering = Tampering(seed, start + limit)
    dump = [""]  # the driver's console so far, for a failure message
    try:
        got = DRIVERS[shape.kind](tmp, shape, tampering, dump)
    except AssertionError as exc:  # a hang: the job outlived the bound
        got = ("hung",)
        dump[0] = f"{exc}\n{dump[0]}"
    finally:
        if tampering.outsider is not None:
            tampering.outsider.stop()
    took = time.monotonic() - start
    return Result(shape.name, seed or 0, got, shape.expected, took, tampering.outsider, dump[0])


@contextlib.contextmanager
def _tampered_cluster(tmp: Path, shape: Shape, tampering: Tampering, dump: list[str]):
    """Two one-shot agents of `shape`, the outsider on their store; their console in `dump`."""
    cluster = Cluster(tmp, 2)
    try:
        cluster.start(list(shape.args))
        tampering.on(derive_port(cluster.job, cluster.step))
        try:
            yield cluster
        finally:
            dump[0] = cluster.dump()
    finally:
        cluster.kill()


def _one_shot(tmp: Path, shape: Shape, tampering: Tampering, dump: list[str]) -> tuple:
    with _tampered_cluster(tmp, shape, tampering, dump) as cluster:
        return outcome(cluster, cluster.wait(tampering.left()))


def _debug(tmp: Path, shape: Shape, tampering: Tampering, dump: list[str]) -> tuple:
    """A paused rank continued by `agent debug` once the console names it."""
    with _tampered_cluster(tmp, shape, tampering, dump) as cluster:
        wait_for(
            lambda: "rank 1 paused at " in "".join(a.stdout() + a.stderr() for a in cluster.agents),
            tampering.left(), "the console to say rank 1 paused", interval=0.1,
        )  # fmt: skip
        client = _client(["debug", str(cluster.log_dir), "--rank", "1", "-c", "c"],
                         base_env(tmp), tampering)  # fmt: skip
        codes = cluster.wait(tampering.left())
    dump[0] += f"\n--- agent debug:\n{client.stdout}{client.stderr}"
    return (*outcome(cluster, codes), client.returncode)


def _exec(tmp: Path, shape: Shape, tampering: Tampering, dump: list[str]) -> tuple:
    """`agent exec` on two nodes: node 0's collated output and both exit codes."""
    job = str(uuid.uuid4().int % 10**9)
    nodes = []
    for node in range(2):
        env = {**base_env(tmp), **slurm_env(job, 2, node), "CODE": str(3 * node)}
        nodes.append(subprocess.Popen(
            [sys.executable, "-m", "agent", "exec", *shape.args], env=env, cwd=tmp,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        ))  # fmt: skip
    span = PORT_HIGH - PORT_LOW + 1  # agent exec's store: the agents' port moved half the range
    tampering.on(PORT_LOW + (derive_port(job, "0") - PORT_LOW + span // 2) % span)
    try:
        results = []
        for proc in nodes:
            try:
                out, err = proc.communicate(timeout=tampering.left())
            except subprocess.TimeoutExpired:
                raise AssertionError("agent exec outlived the bound") from None
            results.append((proc.returncode, out, err))
        dump[0] = "\n".join(f"--- exec {i}:\n{out}{err}" for i, (_, out, err) in enumerate(results))
        return (tuple(code for code, _, _ in results), results[0][1])
    finally:
        for proc in nodes:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()


def _resident(tmp: Path, shape: Shape, tampering: Tampering, dump: list[str]) -> tuple:
    """Resident agents: up, one run (its exit and root cause), `agent down`, the agents' exits."""
    serving = Serving(tmp, 2).start()
    tampering.on(derive_port(serving.job, "0"))
    try:
        serving.ready(tampering.left())
        run = serving.call("run", *shape.args, timeout=tampering.left())
        dump[0] = f"--- agent run:\n{run.stderr}"
        logs = run.stderr.split("logs in ", 1)[-1].split()[0] if "logs in " in run.stderr else ""
        try:
            cause = _cause(json.loads((Path(logs) / "summary.json").read_text()))
        except (OSError, ValueError):
            cause = ("no summary", None, None)
        down = serving.call("down", timeout=tampering.left())
        codes = serving.wait(tampering.left())
        return (run.returncode, *cause, down.returncode, tuple(codes))
    finally:
        dump[0] += "\n" + serving.dump()
        serving.kill()
        kill_job_processes(f"{serving.job}.0")


def _client(args: list[str], env: dict[str, str], tampering: Tampering):
    try:
        return subprocess.run(
            [sys.executable, "-m", "agent", *args], env=env, capture_output=True, text=True,
            timeout=tampering.left(), stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise AssertionError(f"`agent {' '.join(args)}` outlived the bound") from None


DRIVERS = {"one-shot": _one_shot, "debug": _debug, "exec": _exec, "resident": _resident}


@contextlib.contextmanager
def hammering(act, every: float):
    """`act()` every `every` seconds on a thread of its own while the block runs: an outsider
    far faster than any reader polls (1 s apart at most)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            act()
            stop.wait(every)

    attacker = threading.Thread(target=loop, daemon=True)
    attacker.start()
    try:
        yield
    finally:
        stop.set()
        attacker.join(10)
