"""One process of the scale harness: node 0's agent, or a slice of the other agents as threads.

    scale_agents.py leader    N PORT LOG_DIR SCRIPT CONFIG
    scale_agents.py followers N PORT LOG_DIR LO HI

Every agent is a real `agent.node.agent.NodeAgent` on the real store (node 0's agent hosts it in
the leader process) and runs the real protocol: connect (secret check, claim), meet (join
barrier, heartbeats), execute (plan received, prepared, barrier, attempt: abort watcher, stacks
desk, supervisor, result, node 0's verdict and summary.json), leave. Only the ranks are fake
(`fake_spawn`): 8 per node, never started, each a `Worker` whose exit is an event on the agent's
queue: a rank "fails" when the driver says so, and every rank "dies" as soon as its supervisor
tears it down (marks it terminated), which is when that agent has seen the abort.

The driver (scale_e2e.py) talks to each process over stdin/stdout, one JSON object a line:
it reads {"ready"}, writes "go"; reads {"spawned"} (every local agent started its fake ranks);
writes "abort K" (agent K's rank fails; every process gets the line); reads {"seen"} and
{"done"}. Times are time.monotonic(), which is one clock for every process of the machine.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import resource
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

# Thousands of agent threads per process: small stacks (the agent's threads recurse little).
threading.stack_size(512 << 10)
# Each real agent has its interpreter to itself. Here ~100 share one: threads waiting for the
# interpreter lock each wake every switch interval (5 ms) to ask for it, which with thousands of
# threads on 2 cores is most of the machine's time; the agent's threads mostly block in I/O,
# which hands the lock over at once, so a longer interval costs them little. 0.5 s against
# 0.05 s (one run each, 2 cores): 1,024 agents' ranks started 19.6 → 15.4 s at 36.9 → 28.8 ms
# of CPU an agent, 2,048's 51.8 → 34.3 s at 49.2 → 32.7 ms, and 4,096 joined (130 s → 56 s).
sys.setswitchinterval(float(os.environ.get("LA_SCALE_SWITCH", "0.5")))

from agent.errors import AgentError, PeerFailed  # noqa: E402
from agent.node.agent import NodeAgent, NodeSettings  # noqa: E402
from agent.node.failure import Kind  # noqa: E402
from agent.node.joined import JoinedNode  # noqa: E402
from agent.plan.run_plan import Request, decide  # noqa: E402
from agent.plan.topology import read_topology  # noqa: E402
from agent.run import outputs  # noqa: E402
from agent.run.node_run import Session  # noqa: E402
from agent.run.tools import RunTools  # noqa: E402
from agent.run.workers import RankExited, Worker  # noqa: E402
from agent.world import World  # noqa: E402

SECRET = b"scale-bench-secret-0123456789abcdef"
NPROC = 8
# Above any pid_max (at most 2^22): killpg() and psutil on a fake rank find nothing there.
PID_BASE = 1 << 30
WAIT = 300.0  # seconds any phase may take before the process reports what it has
SETTINGS = NodeSettings(
    rdzv_timeout=240.0, heartbeat_timeout=float(os.environ.get("LA_SCALE_HEARTBEAT_TIMEOUT", "6"))
)
SHARED_REPORTS = os.environ.get("LA_SCALE_SHARED_REPORTS") == "1"


def preload() -> float:
    """Import now what the agent imports lazily on its way (a real agent pays this once per node,
    in parallel with every other node; N agent threads here would queue on the import lock)."""
    import importlib
    import pkgutil

    import agent

    t = time.monotonic()
    for package in ("node", "run", "hang", "console", "plan", "logs"):
        mod = importlib.import_module(f"agent.{package}")
        for info in pkgutil.iter_modules(mod.__path__):
            if info.name not in ("child", "numa_apply"):  # exec-wrapper side only
                importlib.import_module(f"agent.{package}.{info.name}")
    import psutil  # noqa: F401  (the supervisor's process scans)

    del agent
    return time.monotonic() - t


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


class ScaleAgent(NodeAgent):
    """The real agent; only `names` is built once per process instead of once per agent.

    `NodeAgent.names` is N strings, built once per agent: nothing for one real node, but O(N^2)
    for N agents sharing this machine (16 M strings at 4,096). Every agent here has the same
    hosts, so they share one list."""

    _shared: dict[tuple[str, ...], list[str]] = {}
    _lock = threading.Lock()

    def connect(self) -> JoinedNode:
        joined = super().connect()
        if SHARED_REPORTS and not self.leader:
            # Node 0 serves 5 connections per agent; 4,096 agents need more than this machine's
            # 20,000 file descriptors. Here a peer's failure reports share its main connection
            # (idle while its supervisor runs): 4 per agent, as proposal P1 would make it.
            side, joined.reporter._side = joined.reporter._side, None
            side._client.close()
        return joined

    @property
    def names(self) -> list[str]:
        key = self.world.hosts
        with self._lock:
            found = self._shared.get(key)
            if found is None:
                found = self._shared[key] = NodeAgent.names.func(self)  # type: ignore[attr-defined]
        return found


def _retried(prepare_log_dir: Any) -> Any:
    """outputs.prepare_log_dir proves the log dir writable with a probe file named after the pid:
    agents that share a process (threads here) can unlink each other's probe, which it reports as
    an unwritable log dir. The real function runs; an agent that lost that race tries again (a
    lock instead would queue hundreds of threads behind each other's file system calls)."""

    def retried(path: str) -> str:
        slot = BY_THREAD.get(threading.get_ident())
        if slot is not None and slot.received is None:  # prepare() has the plan, opened
            slot.received = time.monotonic()
            slot.cpu["received"] = time.thread_time()
        for _ in range(50):
            try:
                return prepare_log_dir(path)
            except AgentError as exc:
                if "No such file" not in exc.message:
                    raise
        return prepare_log_dir(path)

    return retried


outputs.prepare_log_dir = _retried(outputs.prepare_log_dir)


# -- fake ranks -----------------------------------------------------------------------------
class FakeStream:
    """What the supervisor reads of a rank's pipe: drained, with a last stderr line."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.done.set()
        self.tail = collections.deque([b"fake rank: simulated failure\n"])
        self.last_output = self.last_progress = time.monotonic()


class FakeProc:
    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        return self.returncode


class FakeWorker(Worker):
    """A Worker that tells its node when the supervisor marks it terminated (the teardown)."""

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name == "terminated" and value and "node" in self.__dict__:
            self.node.torn_down(self)


class FakeNode:
    """One agent's fake ranks for the current attempt."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: queue.SimpleQueue | None = None
        self.workers: list[FakeWorker] = []
        self.exited: set[int] = set()
        self.doomed: list[int] = []
        self.spawned_at: float | None = None
        self.seen_at: float | None = None

    def spawn(self, specs, base_env, router, prefix_for, console, events, cwd=None, warm=None):
        stream = FakeStream()
        now = time.time()
        workers = []
        for spec in specs:
            worker = FakeWorker(spec, FakeProc(PID_BASE + spec.rank), now, stream, stream)
            worker.node = self
            workers.append(worker)
        with self.lock:
            self.events, self.workers, self.exited = events, workers, set()
            self.spawned_at = time.monotonic()
            self.cpu_at_spawn = time.thread_time()
        slot = BY_THREAD.get(threading.get_ident())
        if slot is not None and slot.profile is not None:
            slot.profile.disable()  # LA_SCALE_PROFILE covers the start only: release → spawned
        MARKS.note()
        return workers

    def fail(self) -> float:
        """Local rank 0 exits with code 1 (the job's first failure)."""
        at = time.monotonic()
        self._exit(0, 1)
        return at

    def torn_down(self, worker: FakeWorker) -> None:
        """The supervisor tore this rank down: this agent has seen the abort. The rank dies when
        the driver releases every node (so the node's own teardown work does not compete with
        the agents still being woken: here they share 2 cores, on a cluster each has its own)."""
        index = self.workers.index(worker)
        with self.lock:
            if self.seen_at is None:
                self.seen_at = time.monotonic()
            self.doomed.append(index)
            released = RELEASED.is_set()
        MARKS.note()
        if released:
            self.release()

    def release(self) -> None:
        with self.lock:
            doomed, self.doomed = self.doomed, []
        for index in doomed:
            self._exit(index, -15)

    def _exit(self, index: int, code: int) -> None:
        with self.lock:
            if index in self.exited or self.events is None:
                return
            self.exited.add(index)
            events = self.events
        events.put(RankExited(index, code, time.time()))


class Marks:
    """Wakes the main thread whenever an agent reaches a milestone."""

    def __init__(self) -> None:
        self.changed = threading.Condition()

    def note(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def wait_until(self, predicate, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 1.0))
        return True


MARKS = Marks()
RELEASED = threading.Event()


# -- one agent ----------------------------------------------------------------------------
class Slot:
    """One simulated node: its agent, fake ranks and milestones."""

    def __init__(self, world: World) -> None:
        self.index = world.agent_index
        self.agent = ScaleAgent(
            world=world, settings=SETTINGS, secret=SECRET, environ={"PATH": os.defpath}
        )
        self.seat: JoinedNode | None = None  # once joined
        self.session: Session | None = None
        self.node = FakeNode()
        self.profile: Any = None  # LA_SCALE_PROFILE: this agent's cProfile, until its ranks start
        self.joined: float | None = None
        self.received: float | None = None  # the plan received, opened, parsed, checked
        self.planned: float | None = None  # and the log dir and resolved config written
        self.cpu: dict[str, float] = {}  # this agent's main thread: CPU seconds at milestones
        self.finished: float | None = None
        self.left: float | None = None
        self.code: int | None = None
        self.error: str | None = None

    def join(self) -> Session:
        self.seat = self.agent.connect()
        self.session = Session(self.seat)
        return self.session

    def topology(self, _root: str) -> Any:
        """prepare() reads the topology right after the plan arrived: the payload is here."""
        if self.planned is None:
            self.planned = time.monotonic()
            self.cpu["planned"] = time.thread_time()
        return TOPOLOGY

    def run(self, go: threading.Event, plan: Any = None) -> None:
        agent = self.agent
        profile = None
        try:
            go.wait()
            if PROFILE_DIR:  # LA_SCALE_PROFILE=DIR: each agent's main thread, cProfile
                import cProfile

                profile = self.profile = cProfile.Profile(time.thread_time)  # CPU, not wall
                profile.enable()
            BY_THREAD[threading.get_ident()] = self
            self.cpu["start"] = time.thread_time()
            session = self.session or self.join()  # node 0 joined already: it hosts the store
            assert self.seat is not None
            self.seat.meet()
            self.joined = time.monotonic()
            self.cpu["reference"] = reference_work(self.seat)
            self.cpu["joined"] = time.thread_time()  # the phases leave the reference out
            self.code = session.execute(0, plan, RunTools(self.topology, spawn=self.node.spawn))
            self.finished = time.monotonic()
            self.seat.leave()
            self.left = time.monotonic()
        except BaseException as exc:  # reported to the driver, never hidden
            self.error = f"{type(exc).__name__}: {exc}"[:400]
            if os.environ.get("LA_SCALE_TRACE"):
                traceback.print_exc()
            if isinstance(exc, AgentError):  # as launch.oneshot: told, unless a peer's failure
                own = not isinstance(exc, PeerFailed)
                record = agent.failed(Kind.SETUP, exc.message, exc) if own else None
                agent.farewell(record, exc.message, everyone=own)
        finally:
            if profile is not None:
                profile.disable()
                PROFILES.append(profile)
            agent.close()
            MARKS.note()


def reference_work(seat: Any) -> float:
    """CPU seconds this thread spends on a fixed piece of an agent's kind of work (records
    sealed and opened, store queries answered), done by every agent once, right after it
    joined, under the start's own load. The same work at every size: its CPU at N agents
    against its CPU at 1,024 is what N agents sharing 2 cores (threads, processes, caches)
    add to each operation, not what an agent does more of."""
    record = {"host": "node0001", "ranks": list(range(8)), "seq": 7, "padding": "x" * 200}
    key = seat.store.key("reference")
    start = time.thread_time()
    for _ in range(REFERENCE_ROUNDS):
        seat.keys.unseal(seat.keys.seal(record, key), key, "reference")
        seat.store.exists(key)
    return time.thread_time() - start


REFERENCE_ROUNDS = 8
TOPOLOGY: Any = None
BY_THREAD: dict[int, Slot] = {}  # agent thread → its slot
PROFILE_DIR = os.environ.get("LA_SCALE_PROFILE")
# LA_SCALE_OPS=1: count the store queries each kind of thread sends (node 0's process and one
# process of others), from the release to the ranks started (per agent: does an agent's start
# ask more of the store at 4,096 than at 1,024?) and from the driver's idle window to the abort
# (a second: who keeps node 0's store busy). Connects and handshakes that went unanswered count
# as "connect" and "silent handshake".
OPS: collections.Counter[tuple[str, str]] | None = (
    collections.Counter() if os.environ.get("LA_SCALE_OPS") else None
)
OP_NAMES = {1: "set", 3: "get", 4: "add", 5: "check", 6: "wait", 10: "multi_get", 12: "cancel"}


def _count_ops() -> None:
    from agent.node.store_client import ProtocolMismatch, StoreClient

    send, handshake = StoreClient._send, StoreClient._handshake

    def count(op: str) -> None:
        assert OPS is not None
        kind = "".join(
            ch for ch in threading.current_thread().name.split(" (")[0] if not ch.isdigit()
        )
        OPS[(kind.rstrip("-"), op)] += 1

    def counting(self: StoreClient, data: bytes) -> None:
        count(OP_NAMES.get(data[0], str(data[0])))
        send(self, data)

    def shaking(self: StoreClient, timeout: float) -> None:
        count("connect")
        try:
            handshake(self, timeout)
        except ProtocolMismatch:  # here: no answer in time (a mismatch is never retried)
            count("silent handshake")
            raise

    StoreClient._send = counting  # type: ignore[method-assign]
    StoreClient._handshake = shaking  # type: ignore[method-assign]


if OPS is not None:
    _count_ops()
PROFILES: list[Any] = []


def world_of(n: int, index: int, port: int, hosts: tuple[str, ...]) -> World:
    return World(
        source="slurm",
        job_id="scale",
        step_id="0",
        nnodes=n,
        node_rank=index,
        hosts=hosts,
        host=hosts[index],
        master_addr="127.0.0.1",
        master_port=port,
    )


def _phase_cpu(slots: list[Slot]) -> dict[str, list[float]]:
    """Each agent's main-thread CPU per phase (thread_time: no time spent waiting for the GIL)."""
    out: dict[str, list[float]] = {"join": [], "payload": [], "plan": [], "start": []}
    for s in slots:
        cpu, spawned = s.cpu, getattr(s.node, "cpu_at_spawn", None)
        if "joined" in cpu:
            out["join"].append(cpu["joined"] - cpu["start"])
        if "received" in cpu and "joined" in cpu:
            out["payload"].append(cpu["received"] - cpu["joined"])
        if "planned" in cpu and "received" in cpu:
            out["plan"].append(cpu["planned"] - cpu["received"])
        if spawned is not None and "planned" in cpu:
            out["start"].append(spawned - cpu["planned"])
    return out


def thread_cpu() -> dict[int, tuple[str, float]]:
    """Each live thread's CPU seconds (the scheduler's own count), with its Python name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    found = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                found[int(tid)] = (names.get(int(tid), "native"), int(f.read().split()[0]) / 1e9)
        except (OSError, ValueError, IndexError):
            continue
    return found


def cpu_by_kind(before: dict[int, tuple[str, float]], process_before: float) -> dict[str, float]:
    """CPU seconds since `before` per kind of thread (its name without numbers); threads that
    ended meanwhile are the rest of the process's CPU."""
    kinds: dict[str, float] = {}
    for tid, (name, cpu) in thread_cpu().items():
        kind = "".join(ch for ch in name.split(" (")[0] if not ch.isdigit()).rstrip("-")
        kinds[kind] = kinds.get(kind, 0.0) + cpu - before.get(tid, ("", 0.0))[1]
    kinds["threads that ended"] = time.process_time() - process_before - sum(kinds.values())
    return {k: round(v, 3) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])}


def emit(**record: Any) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def fd_kinds() -> dict[str, int]:
    kinds: collections.Counter[str] = collections.Counter()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        kinds[target.split(":", 1)[0] if ":" in target else "file"] += 1
    return dict(kinds)


def observe(n: int, port: int) -> int:
    """The driver's eyes on the store (a client of its own, like `agent status` would be): when
    the abort record, every node's result, and node 0's verdict appeared."""
    from agent.node.store import Endpoint, Store
    from agent.node.trust import JobKeys

    ns = JobKeys.derive(SECRET, "scale", "0").namespace
    store = Store.connect(Endpoint("127.0.0.1", port), ns, 30.0, "node 0's agent")
    emit(ready=os.getpid())
    sys.stdin.readline()
    for name, keys in (
        ("abort_at", ["abort"]),
        ("results_at", [f"result/{i}" for i in range(n)]),
        ("verdict_at", ["verdict"]),
    ):
        ok = store.wait([store.key("r0/a0", k) for k in keys], WAIT)
        emit(**{name: time.monotonic() if ok else None})
    os._exit(0)


def main(argv: list[str]) -> int:
    global TOPOLOGY
    role, n, port = argv[0], int(argv[1]), int(argv[2])
    if role == "observer":
        return observe(n, port)
    log_dir = argv[3]
    limit = raise_fd_limit()
    imports = preload()
    if os.environ.get("LA_SCALE_TRACE"):
        import logging

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(threadName)s %(message)s")
    TOPOLOGY = read_topology(Path("/"))
    hosts = tuple(f"node{i:04d}" for i in range(n))
    go = threading.Event()
    ops_since = time.monotonic()
    if role == "leader":
        script, config = argv[4], argv[5]
        slot = Slot(world_of(n, 0, port, hosts))
        session = slot.join()  # hosts the store
        given = {
            "nproc_per_node": str(NPROC),
            "numa_binding": "off",
            "console_ranks": "none",
            "live": False,
            "log_dir": log_dir,
        }
        request = Request(script, (config,), (), (), given)
        plan = decide(request, slot.agent.world, slot.topology)
        slot.planned = None
        session.offer(0, plan)
        slots = [slot]
        threads = [threading.Thread(target=slot.run, args=(go, plan), daemon=True)]
    else:
        lo, hi = int(argv[4]), int(argv[5])
        slots = [Slot(world_of(n, i, port, hosts)) for i in range(lo, hi)]
        threads = [threading.Thread(target=s.run, args=(go,), daemon=True) for s in slots]
    # node 0's process and the first of the others report by thread kind (names, CPU, queries)
    sampled = role == "leader" or lo == 1
    for thread in threads:
        thread.start()
    emit(ready=os.getpid(), agents=len(slots), fd_limit=limit, imports_s=imports)
    by_index = {s.index: s for s in slots}

    def settled(attr: str) -> bool:
        return all(getattr(s.node, attr) is not None or s.error or s.left for s in slots)

    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "go":
            threads_at_go, cpu_at_go = thread_cpu(), time.process_time()
            if OPS is not None:
                OPS.clear()
            go.set()
            ok = MARKS.wait_until(lambda: settled("spawned_at"), WAIT)
            start_ops = {}
            if OPS is not None and sampled:  # per agent of this process
                start_ops = {f"{k} {o}": round(c / len(slots), 2) for (k, o), c in OPS.items()}
            emit(
                spawned=ok,
                joined=[s.joined for s in slots],
                received=[s.received for s in slots],
                planned=[s.planned for s in slots],
                started=[s.node.spawned_at for s in slots],
                errors=[s.error for s in slots if s.error][:5],
                fds=fd_kinds(),
                threads=threading.active_count(),
                names={t.native_id: t.name for t in threading.enumerate()} if sampled else {},
                cpu=_phase_cpu(slots),
                reference=[s.cpu.get("reference") for s in slots],
                by_thread=cpu_by_kind(threads_at_go, cpu_at_go) if sampled else {},
                ops=start_ops,
            )
        elif words[0] == "count" and OPS is not None:  # the driver's idle window begins
            OPS.clear()
            ops_since = time.monotonic()
        elif words[0] == "abort":
            ops = {}
            if OPS is not None and sampled:  # the idle window's queries, a second
                span = time.monotonic() - ops_since
                ops = {f"{k} {o}": round(n / span, 1) for (k, o), n in OPS.most_common(12)}
                OPS.clear()
            threads_at_abort, cpu_at_abort = thread_cpu(), time.process_time()
            target = by_index.get(int(words[1]))
            failed_at = target.node.fail() if target is not None else None
            ok = MARKS.wait_until(lambda: settled("seen_at"), WAIT)
            abort_ops = {}
            if OPS is not None and sampled:  # per agent of this process, abort → seen
                abort_ops = {f"{k} {o}": round(c / len(slots), 2) for (k, o), c in OPS.items()}
            emit(
                seen=ok,
                failed_at=failed_at,
                at=[s.node.seen_at for s in slots],
                ops=ops,
                abort_ops=abort_ops,
                by_thread=cpu_by_kind(threads_at_abort, cpu_at_abort) if sampled else {},
            )
        elif words[0] == "release":
            threads_at_release, cpu_at_release = thread_cpu(), time.process_time()
            RELEASED.set()
            for s in slots:
                s.node.release()
            for thread in threads:
                thread.join(max(0.0, WAIT))
            if PROFILES:
                import pstats

                pstats.Stats(*PROFILES).dump_stats(f"{PROFILE_DIR}/{role}-{os.getpid()}.prof")
            emit(
                done=all(not t.is_alive() for t in threads),
                finished=[s.finished for s in slots],
                left=[s.left for s in slots],
                codes=collections.Counter(str(s.code) for s in slots),
                errors=[s.error for s in slots if s.error][:5],
                by_thread=cpu_by_kind(threads_at_release, cpu_at_release) if sampled else {},
            )
            break
    sys.stdout.flush()
    os._exit(0)  # agent threads are daemons; do not wait on anything at exit


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
