"""Node 0's store traffic at scale: heartbeats cost O(1) queries per tick whatever N, a peer names
only its own counter, a peer that never ticks cannot block node 0, and the client's one-round-trip
paths (no wait for keys known to exist, pipelined adds, a connection opened at its first query)
speak torch's real server."""

from __future__ import annotations

import collections
import threading
from datetime import timedelta

import pytest
from cluster import wait_for
from torch.distributed import TCPStore

from agent.node.failure import Failure, Kind
from agent.node.membership import TICKS_PER_SECOND, Membership, Silence, pace
from agent.node.scope import Scope
from agent.node.store import Endpoint, Store
from agent.node.store_client import PIPELINE, StoreClient
from agent.node.trust import JobKeys

KEYS = JobKeys.derive(b"scale-test", "job", "0")


# -- Silence: which counters stopped (pure) --------------------------------------------------
@pytest.mark.parametrize(
    ("ticks", "silent"),
    [
        ([(0.0, [1, 1, 1]), (5.0, [2, 2, 2])], [[], []]),  # everyone moves
        ([(0.0, [1, 1, 1]), (5.0, [2, 1, 2]), (7.0, [3, 1, 3])], [[], [], [1]]),
        ([(0.0, [1, 1, 1]), (7.0, [1, 1, 1])], [[], [1, 2]]),  # own counter (0) never named
        ([(0.0, [1, 5]), (7.0, [1, 5]), (9.0, [1, 5])], [[], [1], []]),  # named once
        ([(0.0, [1, 0]), (3.0, [2, 0]), (7.0, [3, 1]), (13.5, [4, 1])], [[], [], [], [1]]),
        ([(0.0, [1, 9]), (6.0, [2, 9])], [[], []]),  # exactly lost_after: not yet
    ],
)
def test_silence_names_each_peer_once_after_lost_after(ticks, silent) -> None:
    watch = Silence(own=0, lost_after=6.0)
    assert [watch.silent(counts, now) for now, counts in ticks] == silent


@pytest.mark.parametrize(
    ("ticks", "silent"),
    [
        ([(0.0, [1, 0]), (7.0, [2, 0]), (29.0, [3, 0]), (31.0, [4, 0])], [[], [], [], [1]]),
        ([(0.0, [1, 0]), (20.0, [2, 5]), (27.0, [3, 5])], [[], [], [1]]),  # then lost_after
    ],
)
def test_a_peer_without_a_sealed_beat_yet_has_the_first_beats_bound(ticks, silent) -> None:
    """Issue 35: an outsider's value where a peer's first beat goes, then deleted, made node 0
    count a still-connecting peer lost after lost_after; only a sealed beat starts that clock."""
    watch = Silence(own=0, lost_after=6.0, first_after=30.0)
    assert [watch.silent(counts, now) for now, counts in ticks] == silent


# -- heartbeats against a counting fake store ---------------------------------------------
class FakeStore:
    """The Store calls heartbeats make, in memory, each query counted (`ops`: name, keys)."""

    def __init__(self, shared: dict[str, bytes] | None = None, answers_wait: bool = True) -> None:
        self.values = {} if shared is None else shared
        self.ops: list[tuple[str, int]] = []
        self.lock = threading.Lock()
        self.answers_wait = answers_wait
        self.endpoint = Endpoint("127.0.0.1", 1)
        self.ns = "ns/"
        self.reads = threading.Semaphore(0)  # released at each read of every counter
        self.writes = threading.Semaphore(0)  # released at each tick of a counter

    def key(self, *parts: object) -> str:
        return self.ns + "/".join(str(p) for p in parts)

    def another_client(self, op_timeout: float | None = None) -> FakeStore:
        other = FakeStore(self.values, self.answers_wait)
        other.ops, other.lock, other.reads, other.writes = (
            self.ops,
            self.lock,
            self.reads,
            self.writes,
        )
        return other

    def _op(self, name: str, keys: int) -> None:
        with self.lock:
            self.ops.append((name, keys))

    def set_bytes(self, key: str, value: bytes) -> None:
        self._op("set", 1)
        self.values[key] = value
        self.writes.release()

    def exists(self, key: str) -> bool:
        self._op("check", 1)
        return key in self.values

    def wait(self, keys, timeout) -> bool:
        self._op("wait", len(keys))
        return self.answers_wait and all(k in self.values for k in keys)

    def multi_get(self, keys, present: bool = False) -> list[bytes]:
        self._op("multi_get" if present else "multi_get+wait", len(keys))
        found = [self.values.get(k, b"") for k in keys]  # torch's server: b"" for a missing key
        self.reads.release()
        return found


def sealed_beat(store: FakeStore, index: int, seq: int) -> bytes:
    return KEYS.seal({"i": index, "seq": seq}, store.key("hb", index))


def _beat(
    store: FakeStore, agents: int, index: int, ticks: int, on_silent=None, lost_after=60.0
) -> None:
    """Run one agent's heartbeat until node 0 read `ticks` times (or a follower ticked)."""
    stop = threading.Event()
    member = Membership(store, agents, index, [f"n{i}" for i in range(agents)], KEYS)
    lost: list[str] = []
    thread = member.heartbeat(stop, 0.001, lost_after, lost.append, on_silent)
    wanted = store.reads if on_silent is not None else store.writes
    for _ in range(ticks if on_silent is not None else ticks + 1):
        assert wanted.acquire(timeout=30)
    stop.set()
    thread.join(30)
    assert not lost


@pytest.mark.parametrize("agents", [8, 4096])
def test_node_0_reads_every_counter_in_one_query_per_tick(agents) -> None:
    store = FakeStore()
    for i in range(1, agents):
        store.values[store.key("hb", i)] = sealed_beat(store, i, 1)  # every peer beat once
    _beat(store, agents, 0, ticks=6, on_silent=lambda i: None)
    first, answered, *rest = store.ops
    assert (first, answered) == (("set", 1), ("check", 1))  # node 0's own beat, before the thread
    assert rest[0] == ("wait", agents)  # every beat exists
    reads = [op for op in rest if op[0].startswith("multi_get")]
    assert reads[:6] == [("multi_get", agents)] * 6  # one query of N keys a tick, no wait
    per_tick = collections.Counter(name for name, _ in rest[1:13])
    assert per_tick["multi_get"] == 6 and per_tick["set"] == 6


@pytest.mark.parametrize(("agents", "lost_after"), [(8, 0.0061), (4096, 0.0061), (8, 0.0031)])
def test_a_peer_names_only_its_own_counter_and_asks_for_answers_at_its_pace(
    agents, lost_after
) -> None:
    store = FakeStore()
    _, answered = pace(agents, 0.001, lost_after, leader=False)
    _beat(store, agents, 5, ticks=3 * answered, lost_after=lost_after)
    assert all(size == 1 for _, size in store.ops)
    assert set(store.values) == {store.key("hb", 5)}
    names = [name for name, _ in store.ops[2 : 2 + 3 * (answered + 1)]]
    assert names == (["set"] * answered + ["check"]) * 3  # one beat in `answered` is answered
    key = store.key("hb", 5)
    last = KEYS.unseal(store.values[key], key, "beat")
    assert last["i"] == 5 and isinstance(last["seq"], int)


@pytest.mark.parametrize(
    ("agents", "interval", "lost_after", "leader", "expected"),
    [
        (2, 1.0, 6.0, False, (1.0, 3)),  # small jobs tick every interval, answered every 3 s
        (2, 1.0, 2.0, False, (1.0, 1)),  # a short timeout: every tick answered
        (TICKS_PER_SECOND, 1.0, 6.0, False, (1.0, 3)),
        (2 * TICKS_PER_SECOND, 1.0, 6.0, False, (2.0, 1)),  # node 0 gets TICKS_PER_SECOND a second
        (2 * TICKS_PER_SECOND, 1.0, 6.0, True, (1.0, 3)),  # node 0 reads every interval
        (8 * TICKS_PER_SECOND, 1.0, 6.0, False, (2.0, 1)),  # never < 3 ticks per timeout
        (8 * TICKS_PER_SECOND, 1.0, 30.0, False, (8.0, 1)),
        (4 * TICKS_PER_SECOND, 1.0, 30.0, False, (4.0, 3)),
        (8 * TICKS_PER_SECOND, 1.0, 30.0, True, (4.0, 3)),  # node 0 reads twice per peer tick
        (8 * TICKS_PER_SECOND, 1.0, 6.0, True, (1.0, 3)),
    ],
)
def test_pace(agents, interval, lost_after, leader, expected) -> None:
    assert pace(agents, interval, lost_after, leader) == expected


def test_a_peer_that_never_ticks_is_declared_lost_not_waited_for() -> None:
    store = FakeStore(answers_wait=False)  # node 0's wait for every first tick times out
    found = threading.Event()
    lost: list[int] = []
    stop = threading.Event()
    member = Membership(store, 3, 0, ["n0", "n1", "n2"], KEYS)
    store.values[store.key("hb", 1)] = sealed_beat(store, 1, 1)

    def silent(index: int) -> None:
        lost.append(index)
        found.set()

    member.heartbeat(stop, 0.001, 0.05, lambda why: None, silent)
    assert found.wait(30)
    stop.set()
    assert lost[0] in (1, 2)
    assert store.key("hb", 2) not in store.values  # node 0 writes no beat but its own


# -- the client against torch's server ----------------------------------------------------
class CountingClient(StoreClient):
    """Our client, counting the queries it sends (by type byte)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sent: collections.Counter[int] = collections.Counter()

    def _send(self, data: bytes) -> None:
        self.sent[data[0]] += 1
        super()._send(data)


@pytest.fixture()
def server():
    return TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )


def test_known_keys_are_read_in_one_round_trip(server) -> None:
    client = CountingClient.connect("127.0.0.1", server.port, 10)
    client.set("a", b"1")
    client.set("b", b"22")
    client.sent.clear()
    assert client.get("a", wait=False) == b"1" and client.multi_get(("a", "b"), wait=False) == [
        b"1",
        b"22",
    ]
    assert sum(client.sent.values()) == 2  # no WAIT before either
    assert client.get("a") == b"1" and sum(client.sent.values()) == 4  # the default still waits


def test_a_counter_set_as_text_is_added_to_by_torchs_server(server) -> None:
    client = StoreClient.connect("127.0.0.1", server.port, 10)
    client.set("hb/1", b"41")
    assert client.add("hb/1", 1) == 42 and server.add("hb/1", 0) == 42


def test_add_all_pipelines_the_queries(server) -> None:
    client = CountingClient.connect("127.0.0.1", server.port, 10)
    keys = [f"k/{i}" for i in range(PIPELINE * 2 + 5)]
    client.add("k/7", 5)
    client.sent.clear()
    assert client.add_all(keys, 0)[:8] == [0] * 7 + [5]
    assert client.add_all(keys, 2)[7] == 7 and client.multi_get(keys)[0] == b"2"
    assert client.sent[4] == 2 * 3  # 2,053 ADDs a call, sent in 3 batches (3 round trips)


def test_a_lazy_connection_opens_at_its_first_query(server) -> None:
    main = Store(
        StoreClient.connect("127.0.0.1", server.port, 10), Endpoint("127.0.0.1", server.port), "n/"
    )
    before = server.num_keys()
    lazy = main.another_client(lazy=True)
    assert lazy._client._sock is None  # nothing connected yet
    lazy.set_bytes(lazy.key("x"), b"1")
    assert main.get_bytes(main.key("x")) == b"1" and server.num_keys() == before + 1


def test_the_abort_watcher_reads_the_record_it_woke_for_in_one_query(server) -> None:
    sent: list[CountingClient] = []

    class Counted(Store):
        def another_client(self, op_timeout=None, lazy=False) -> Store:
            client = CountingClient.connect("127.0.0.1", server.port, 10)
            sent.append(client)
            return Store(client, self.endpoint, self.ns)

    store = Counted(
        StoreClient.connect("127.0.0.1", server.port, 10), Endpoint("127.0.0.1", server.port), "w/"
    )
    scope = Scope(store, "r0/a0", 1, KEYS)
    seen = threading.Event()
    scope.watch(threading.Event(), lambda record: seen.set(), lambda why: None)
    Scope(store, "r0/a0", 2, KEYS).report(Failure(Kind.RANK, "exit code 1"))
    assert seen.wait(30)
    assert sent[0].sent == {6: 1, 3: 1}  # one WAIT, then one GET


def test_a_peer_whose_heartbeat_stops_is_named_by_node_0_over_the_real_store(server) -> None:
    endpoint = Endpoint("127.0.0.1", server.port)

    def member(index: int) -> Membership:
        store = Store(StoreClient.connect("127.0.0.1", server.port, 10), endpoint, "hb/")
        return Membership(store, 3, index, ["n0", "n1", "n2"], KEYS)

    lost: list[str] = []
    silent: list[int] = []
    named = threading.Event()
    stops = [threading.Event() for _ in range(3)]
    for index in (1, 2):
        member(index).heartbeat(stops[index], 0.02, 0.4, lost.append, None)

    def on_silent(index: int) -> None:
        silent.append(index)
        named.set()

    member(0).heartbeat(stops[0], 0.02, 0.4, lost.append, on_silent)
    stops[2].set()  # node 2's agent stops ticking (its counter was set and added to)
    assert named.wait(30)
    for stop in stops:
        stop.set()
    assert silent == [2] and not lost


def test_a_peer_waited_past_once_is_named_again_after_another_lost_after() -> None:
    """Issue 35: node 0 waits past a tampered beat (deleted, forged) once: `again` restarts
    that peer's clock; a dead node is still named, one --heartbeat-timeout later."""
    watch = Silence(own=0, lost_after=6.0)
    assert watch.silent([1, 1], 0.0) == [] and watch.silent([2, 1], 7.0) == [1]
    watch.again(1, 7.0)
    assert watch.silent([3, 1], 12.0) == [] and watch.silent([4, 1], 13.5) == [1]


class RecordingClient(StoreClient):
    """Our client, keeping every query it sends (its bytes: the keys it names are in them)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.queries: list[bytes] = []

    def _send(self, data: bytes) -> None:
        self.queries.append(bytes(data))
        super()._send(data)


def test_a_barrier_member_never_reads_the_others_notes_on_the_counts_word(server) -> None:
    """4,096 simulated agents: once the count said all in, every agent whose look came due read
    all N notes until the done record came (~260 full reads). The count only wakes: a member
    other than the first awaited one looks at its own note, never at the others'. Here the count
    is whole before node 0 arrives (an outsider's bump, or the last arrival still reading):
    node 1 looks past it twice, naming no one's note but its own; node 0's arrival ends it."""
    endpoint = Endpoint("127.0.0.1", server.port)
    names = ["n0", "n1", "n2"]

    def member(index: int, client: StoreClient) -> Scope:
        return Scope(Store(client, endpoint, "b/"), "r0", index, KEYS, ("done",))

    recorder = RecordingClient.connect("127.0.0.1", server.port, 10)
    node1 = member(1, recorder)
    node2 = member(2, StoreClient.connect("127.0.0.1", server.port, 10))
    count = node1.key("arrived")
    ended = threading.Event()
    thread = threading.Thread(
        target=lambda: (node1.barrier(3, 60.0, names), ended.set()), daemon=True
    )
    thread.start()
    wait_for(lambda: node2.store.add(count, 0) == 1, 30, "node 1's arrival")
    node2.put("in/2", {})  # node 2 arrived: its note, its count
    node2.store.add(count, 1)
    node2.store.add(count, 1)  # the outsider's bump: 3 of 3, node 0 not there
    own = node1.key("in", 1).encode()  # its put, then each look: a CHECK and a GET
    wait_for(lambda: sum(own in q for q in recorder.queries) >= 5, 30, "node 1's second look")
    assert not ended.is_set()
    member(0, StoreClient.connect("127.0.0.1", server.port, 10)).barrier(3, 60.0, names)
    assert ended.wait(30), "node 1 never saw the done record node 0 wrote"
    others = (node1.key("in", 0).encode(), node1.key("in", 2).encode())
    assert not [q for q in recorder.queries if any(k in q for k in others)]
