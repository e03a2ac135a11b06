"""A verdict or lineup an outsider deletes or overwrites (torch's own client, real server) ends
its readers' wait as "store tampering suspected at KEY" once the job shows it must be there —
never a wait for ever — and a forgery before node 0 has written it is still only waited past."""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from cluster import wait_for
from outsider import hammering
from torch.distributed import TCPStore

from agent.errors import ExitCode, PeerFailed
from agent.node.failure import Failure, Kind
from agent.node.membership import SCOPE as MEMBERSHIP
from agent.node.scope import Scope
from agent.node.sealed import TAMPERING, Tampered
from agent.node.store import Endpoint, Store
from agent.node.store_client import StoreClient
from agent.node.trust import JobKeys
from agent.run.bounded_wait import (
    await_sealed,
    await_verdict,
    kept,
    node0_over,
    results_with_own,
    wait_tick,
)

KEYS = JobKeys.derive(b"bounded-wait-test", "job", "0")
TICK = 0.05  # the waits' tick, shortened: checks begin after it and double from there


@pytest.fixture()
def server():
    return TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )


def scope(server, index: int, prefix: str = "r0/a0") -> Scope:
    store = Store(
        StoreClient.connect("127.0.0.1", server.port, 10), Endpoint("127.0.0.1", server.port), "n/"
    )
    return Scope(store, prefix, index, KEYS)


def outsider(server) -> TCPStore:
    return TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))


RESULT = {"exits": []}  # what each node here wrote as its result


def landed(writer: Scope, name: str) -> None:
    """A round trip on the writer's own connection: its writes before it were processed. One
    connection is in order, two are not (a `set` has no answer), so an outsider's delete sent
    after our write could otherwise reach the server first."""
    assert writer.store.exists(writer.key(name))


def wait_verdict(reader: Scope, own: str | None = "result/1") -> dict:
    mine = None if own is None else (own, RESULT)
    return await_verdict(reader, queue.SimpleQueue(), mine, tick=TICK)


@pytest.mark.parametrize("forgery", [None, b"garbage"])  # deleted, or replaced by garbage
def test_a_verdict_tampered_with_after_node_0_closed_the_attempt_is_named(server, forgery) -> None:
    node0, reader, evil = scope(server, 0), scope(server, 1), outsider(server)
    reader.put("result/1", {"exits": []})
    node0.put("verdict", {"restart": False, "code": 0})
    node0.close()  # the sealed `closed` record: the verdict was written before it
    landed(node0, "abort")
    key = reader.key("verdict")
    evil.delete_key(key) if forgery is None else evil.set(key, forgery)
    start = time.monotonic()
    with pytest.raises(Tampered) as caught:
        wait_verdict(reader)
    assert caught.value.message.startswith(f"{TAMPERING} at {key}:")
    assert "node 0 has closed the attempt" in caught.value.message
    assert caught.value.code == ExitCode.REFUSED
    assert time.monotonic() - start < 10  # checks after 0.05 s, then 0.1, 0.2...: a hang-catcher


def test_node_0_gone_in_order_without_a_verdict_is_named_too(server) -> None:
    reader = scope(server, 1)
    reader.put("result/1", {"exits": []})
    Scope(reader.store, MEMBERSHIP, 0, KEYS).put("gone/0", {"why": None})
    with pytest.raises(Tampered, match="node 0's agent has left"):
        wait_verdict(reader)


def test_node_0_gone_on_a_failure_of_its_own_is_no_tampering(server) -> None:
    reader = scope(server, 1)
    reader.put("result/1", {"exits": []})
    Scope(reader.store, MEMBERSHIP, 0, KEYS).put("gone/0", {"why": "agent received SIGTERM"})
    with pytest.raises(PeerFailed, match="node 0's agent left: agent received SIGTERM") as caught:
        wait_verdict(reader)
    assert not isinstance(caught.value, Tampered) and caught.value.code == ExitCode.RENDEZVOUS


@pytest.mark.parametrize("forgery", [None, b"garbage"])  # deleted, or replaced by garbage
def test_a_node_whose_own_result_vanishes_writes_it_again(server, forgery) -> None:
    """A deletion delays, never decides: node 0's wait for the results sees the re-posted one,
    and the job's verdict (not "tampering", exit 4) reaches the node."""
    node0, reader, evil = scope(server, 0), scope(server, 1), outsider(server)
    reader.put("result/1", RESULT)
    landed(reader, "result/1")
    key = reader.key("result/1")
    evil.delete_key(key) if forgery is None else evil.set(key, forgery)
    got: list[dict] = []
    waiter = threading.Thread(target=lambda: got.append(wait_verdict(reader)))
    waiter.start()
    judged: list[list[dict]] = []
    judge = threading.Thread(
        target=lambda: judged.append(results_with_own(node0, [0, 1], 0, {"exits": [], "n": 0}))
    )
    judge.start()
    judge.join(30)  # a hang-catcher: the node re-posts within its first checks
    assert judged == [[{"exits": [], "n": 0}, RESULT]]
    node0.put("verdict", {"restart": False, "code": 0})
    node0.close()
    waiter.join(30)
    assert got == [{"restart": False, "code": 0}]


class Reads(Store):
    """A store that tells which keys were read, as they are."""

    def __init__(self, server) -> None:
        client = StoreClient.connect("127.0.0.1", server.port, 10)
        super().__init__(client, Endpoint("127.0.0.1", server.port), "n/")
        self.read: list[str] = []
        self.changed = threading.Condition()

    def multi_get(self, keys, present=False):
        values = super().multi_get(keys, present)
        with self.changed:
            self.read += keys
            self.changed.notify_all()
        return values

    def await_read(self, key: str) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: key in self.read, 30)  # a hang-catcher


def test_node_0_reads_the_results_as_they_come_each_once(server) -> None:
    """At 4,096 simulated agents the one read of every result at the end was 1.2 s between the
    last result and summary.json: each is read as it comes, so a result read once and deleted
    afterwards (an outsider) is not waited for again."""
    store = Reads(server)
    node0, evil = Scope(store, "r0/a0", 0, KEYS), outsider(server)
    writers = [scope(server, i) for i in range(4)]
    judged: list[list[dict]] = []
    judge = threading.Thread(
        target=lambda: judged.append(results_with_own(node0, [0, 1, 2, 3], 0, {"n": 0}, 0.05)),
        daemon=True,  # a failure here leaves it blocked: not the session's end
    )
    judge.start()
    for i in (1, 2):
        writers[i].put(f"result/{i}", {"n": i})
        store.await_read(node0.key(f"result/{i}"))
        evil.delete_key(node0.key(f"result/{i}"))
    writers[3].put("result/3", {"n": 3})
    judge.join(30)  # a hang-catcher
    assert judged == [[{"n": i} for i in range(4)]]
    assert sorted(store.read) == sorted(node0.key(f"result/{i}") for i in (1, 2, 3))


def test_a_result_garbled_faster_than_node_0_reads_it_still_reaches_node_0(server) -> None:
    """The soak's clean seed 4012: node 1's result garbled every few hundred ms; node 1 wrote it
    again at its checks, node 0 polled the known key and never caught it sealed (a hung job).
    Each time it is written again it is also a secret-named copy node 0 blocks on."""
    node0, reader, evil = scope(server, 0), scope(server, 1), outsider(server)
    reader.put("result/1", RESULT)
    landed(reader, "result/1")
    key = reader.key("result/1")
    got: list[dict] = []
    waiter = threading.Thread(target=lambda: got.append(wait_verdict(reader)))
    waiter.start()
    with hammering(lambda: evil.set(key, b"garbage"), 0.002), ThreadPoolExecutor(1) as judge:
        judged = judge.submit(results_with_own, node0, [0, 1], 0, {"exits": [], "n": 0})
        assert judged.result(timeout=60) == [{"exits": [], "n": 0}, RESULT]  # a hang-catcher
    node0.put_again("verdict", {"restart": False, "code": 0}, 1)
    node0.close()
    waiter.join(30)
    assert got == [{"restart": False, "code": 0}]


@pytest.mark.parametrize("name", ["verdict", "lineup"])
def test_a_record_node_0_writes_once_reaches_nodes_however_fast_it_is_garbled(server, name):
    """Node 0 writes the verdict and the lineup once, with a first secret-named copy: nodes
    blocked past the garbage read the copy the moment it comes (polling the known key, they
    never caught it sealed while an outsider garbled it every 2 ms)."""
    node0, reader, evil = scope(server, 0), scope(server, 1), outsider(server)
    reader.put("result/1", RESULT)
    key = reader.key(name)
    with hammering(lambda: evil.set(key, b"garbage"), 0.002), ThreadPoolExecutor(1) as pool:
        if name == "verdict":
            got = pool.submit(wait_verdict, reader)
        else:
            got = pool.submit(await_sealed, reader, name, name, queue.SimpleQueue(),
                              lambda s: None, lambda: "", 60.0, TICK)  # fmt: skip
        wait_for(lambda: evil.check([key]), 10, "the outsider's first garbage")
        node0.put_again(name, {"restart": False, "code": 0}, 1)
        assert got.result(timeout=60) == {"restart": False, "code": 0}


@pytest.mark.parametrize("whose", [0, 1])
def test_a_health_report_garbled_faster_than_node_0_reads_it_still_counts(server, whose):
    """A health report garbled every 2 ms. A member's: while it waits for the lineup it writes
    the report again, each time as a copy node 0 blocks on (before: excluded as having sent
    none, after the round's whole deadline). Node 0's own: taken from its hand (the soak's
    restart seed 8057: node 0 waited for its own report in the store)."""
    from agent.run.health import Health
    from agent.run.lineup import gather, post_health

    leader, member, evil = (
        scope(server, 0, "r0/l0"),
        scope(server, 1, "r0/l0"),
        outsider(server),
    )
    post_health(member, Health(), 2)
    assert member.store.exists(member.key("health/1"))
    over = node0_over(member, kept(member, "health/1", Health().to_json(), "health report"))
    key = member.key(f"health/{whose}")
    with hammering(lambda: evil.set(key, b"garbage"), 0.002), ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(await_sealed, member, "lineup", "lineup", queue.SimpleQueue(),
                              lambda s: None, over, 60.0, TICK)  # fmt: skip
        post_health(leader, Health(), 2)
        reports = gather(leader, [0, 1], set, 30.0, own=(0, Health()))
        assert reports == {0: Health(), 1: Health()}
        leader.put_again("lineup", {"ok": True}, 1)
        assert waiting.result(timeout=60) == {"ok": True}


def test_a_forged_verdict_before_node_0_wrote_its_own_is_waited_past(server) -> None:
    node0, reader, evil = scope(server, 0), scope(server, 1), outsider(server)
    reader.put("result/1", {"exits": []})
    evil.set(reader.key("verdict"), b"garbage")
    got: list[dict] = []
    waiter = threading.Thread(target=lambda: got.append(wait_verdict(reader)))
    waiter.start()
    waiter.join(0.5)  # several checks have passed: the attempt is not over, so it waits on
    assert waiter.is_alive() and not got
    node0.put("verdict", {"restart": True, "code": 1})
    node0.close()
    waiter.join(30)
    assert got == [{"restart": True, "code": 1}]


def test_a_spare_waits_for_the_verdict_without_a_result_of_its_own(server) -> None:
    node0, spare = scope(server, 0), scope(server, 2)
    got: list[dict] = []
    waiter = threading.Thread(target=lambda: got.append(wait_verdict(spare, None)))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive()
    node0.put("verdict", {"restart": False, "code": 0})
    waiter.join(30)
    assert got == [{"restart": False, "code": 0}]


def test_a_lineup_that_never_comes_sealed_ends_at_its_limit(server) -> None:
    reader, evil = scope(server, 1, "r0/l0"), outsider(server)
    evil.set(reader.key("lineup"), b"garbage")
    start = time.monotonic()
    with pytest.raises(Tampered, match="none came within 0.3s"):
        await_sealed(reader, "lineup", "lineup", queue.SimpleQueue(), lambda s: None, limit=0.3)
    assert time.monotonic() - start < 10


def test_node_0_judges_its_own_result_from_its_hand(server) -> None:
    node0, node1, evil = scope(server, 0), scope(server, 1), outsider(server)
    node1.put("result/1", {"exits": [], "from": 1})
    evil.set(node0.key("result/0"), b"garbage")  # node 0's copy in the store: not read
    mine = {"exits": [], "from": 0}
    assert results_with_own(node0, [0, 1], 0, mine) == [mine, {"exits": [], "from": 1}]


def test_a_node_that_found_the_tampering_first_ends_the_others_wait(server) -> None:
    node0, first, second, evil = (
        scope(server, 0),
        scope(server, 1),
        scope(server, 2),
        outsider(server),
    )
    for node in (first, second):
        node.put(f"result/{node.index}", RESULT)
    node0.put("verdict", {"restart": False, "code": 0})
    node0.close()
    landed(node0, "abort")
    evil.delete_key(first.key("verdict"))
    with pytest.raises(Tampered) as caught:
        wait_verdict(first)
    how = caught.value.message  # node 1 stops and tells the attempt (its farewell), over `closed`
    first.report(Failure(Kind.SETUP, how, host="n1", tampering=caught.value.tampering))
    with pytest.raises(Tampered, match="n1 found the store tampered with"):
        wait_verdict(second, "result/2")


@pytest.mark.parametrize(
    ("nodes", "seconds"), [(1, 1.0), (2, 1.0), (512, 1.0), (1024, 2.0), (2048, 4.0), (4096, 8.0)]
)
def test_lineup_and_verdict_waits_renew_less_often_in_jobs_too_large_for_node_0s_store(
    nodes, seconds
):
    """Each renewal is a wait and its cancel at node 0's store: N nodes share 512 a second."""
    assert wait_tick(nodes) == seconds
