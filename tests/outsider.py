"""An outsider on the cluster network, for the tampering fuzzer: torch's own TCPStore client on a
job's store port. It lists the keys as anyone can, and at a seeded random schedule applies what
torch lets anyone do: set garbage, set an older value of the same key (captured earlier), add ±N
on a counter, delete a key, compare_set. It keeps what it did per key family for reports, and a
job's outcome (exit codes, root cause kind and rank, attempts) to compare with the untampered
shape's. Shapes, outcomes and the runner are shared by tests/test_e2e_fuzz.py and
scripts/soak_tampering.py."""

from __future__ import annotations

import contextlib
import random
import re
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from cluster import FIXTURE, Cluster

from agent.world import derive_port

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
        """torch's client, or None once no server answers (the job ended)."""
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
                store = self._connect()
                if store is None:
                    return
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
    name: str
    args: tuple[str, ...]
    expected: tuple  # the untampered outcome (see outcome())


def _shape(name: str, agent: str, rank: str, expected: tuple) -> Shape:
    return Shape(name, (*agent.split(), FIXTURE, *rank.split()), expected)


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
    )
}


def outcome(cluster: Cluster, codes: list[int]) -> tuple:
    """(exit codes, root cause kind, its rank, attempts): what tampering must not change."""
    try:
        summary = cluster.summary()
    except (OSError, ValueError):
        return (tuple(codes), "no summary", None, None)
    cause = summary.get("root_cause") or {}
    return (
        tuple(codes),
        cause.get("kind"),
        cause.get("rank"),
        len(summary.get("attempts") or ()),
    )


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


def run_job(tmp: Path, shape: Shape, seed: int | None, limit: float = 90.0) -> Result:
    """One 2-node loopback job of `shape`, tampered with at `seed`'s schedule (None: untampered)."""
    tmp.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(tmp, 2)
    outsider = None
    try:
        start = time.monotonic()
        cluster.start(list(shape.args))
        if seed is not None:
            outsider = Outsider(derive_port(cluster.job, cluster.step), seed).start()
        try:
            codes = cluster.wait(limit)
        except AssertionError as exc:  # a hang: the job outlived the bound
            return Result(shape.name, seed or 0, ("hung",), shape.expected,
                          time.monotonic() - start, outsider, str(exc))  # fmt: skip
        took = time.monotonic() - start
        return Result(shape.name, seed or 0, outcome(cluster, codes), shape.expected, took,
                      outsider, cluster.dump())  # fmt: skip
    finally:
        if outsider is not None:
            outsider.stop()
        cluster.kill()


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
