"""What an outsider writes into the job store (torch's own client, real server) never decides
and never ends a wait: readers wait past values that do not open, barriers end on sealed records
only, and a wait that never gets one ends as suspected tampering."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import timedelta

import pytest
from cluster import wait_for
from outsider import hammering
from torch.distributed import TCPStore

from agent.errors import ExitCode
from agent.node.scope import LOOK_FIRST, LOOK_MAX, Scope, look_pace
from agent.node.sealed import Tampered
from agent.node.store import Endpoint, Store
from agent.node.store_client import StoreClient
from agent.node.trust import JobKeys

KEYS = JobKeys.derive(b"forgery-test", "job", "0")
NAMES = ["node 0 (n0)", "node 1 (n1)"]


@pytest.fixture()
def server():
    return TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )


@pytest.mark.parametrize(
    ("agents", "first_awaited", "expected"),
    [
        (2, True, (LOOK_FIRST, LOOK_MAX)),
        (2, False, (LOOK_FIRST, LOOK_MAX)),
        (256, False, (LOOK_FIRST, LOOK_MAX)),  # a look a second from each: 256 looks/s
        (1024, False, (4.0, LOOK_MAX)),
        (4096, False, (16.0, 16.0)),  # never more than 256 looks a second in all
        (4096, True, (LOOK_FIRST, LOOK_MAX)),  # the one that ends a barrier a reset count stalls
    ],
)
def test_barrier_looks_past_the_counter_are_paced_by_the_jobs_size(agents, first_awaited, expected):
    assert look_pace(agents, first_awaited) == expected


def scope(server, index: int, prefix: str = "r0", wakes=("done",)) -> Scope:
    store = Store(
        StoreClient.connect("127.0.0.1", server.port, 10), Endpoint("127.0.0.1", server.port), "n/"
    )
    return Scope(store, prefix, index, KEYS, wakes)


def outsider(server) -> TCPStore:
    return TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))


def test_a_forged_value_is_waited_past_until_the_sealed_record_comes(server) -> None:
    reader, writer, evil = scope(server, 1), scope(server, 0), outsider(server)
    evil.set(reader.key("verdict"), b"garbage")
    with ThreadPoolExecutor(1) as pool:
        got = pool.submit(reader.get, "verdict", "verdict")
        with pytest.raises(FutureTimeout):  # still waiting: the garbage is not an answer
            got.result(timeout=1.0)
        evil.set(reader.key("verdict"), KEYS.seal({"code": 9}, reader.key("other")))  # moved
        writer.put("verdict", {"restart": True, "code": 0})
        assert got.result(timeout=30) == {"restart": True, "code": 0}


def test_get_if_treats_a_forgery_as_absent(server) -> None:
    reader, evil = scope(server, 1), outsider(server)
    evil.set(reader.key("abort"), b"\x01" + b"x" * 40)
    assert reader.get_if("abort", "abort record") is None and reader.failure() is None


def test_a_wait_with_a_timeout_ends_as_suspected_tampering(server) -> None:
    reader, evil = scope(server, 1), outsider(server)
    evil.set(reader.key("plan"), b"garbage")
    with pytest.raises(Tampered) as excinfo:
        reader.get("plan", "config payload", timeout=0.5)
    assert excinfo.value.code == ExitCode.REFUSED
    assert excinfo.value.message.startswith(f"store tampering suspected at {reader.key('plan')}")


def test_a_bumped_count_and_a_forged_done_do_not_end_a_barrier(server) -> None:
    first, second, evil = scope(server, 0), scope(server, 1), outsider(server)
    evil.add(first.key("arrived"), 1)  # as if the other agent had arrived
    evil.set(first.key("done"), b"garbage")
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(first.barrier, 2, 60.0, NAMES)
        with pytest.raises(FutureTimeout):  # still waiting for the real second agent
            waiting.result(timeout=1.0)
        second.barrier(2, 60.0, NAMES)  # the real second agent: its count is 3, its notes all in
        waiting.result(timeout=30)
    assert KEYS.unseal(evil.get(first.key("done")), first.key("done"), "done") == {}


@pytest.mark.parametrize("tamper", ["set back", "deleted", "garbage", "first note deleted"])
def test_a_barrier_whose_counter_was_tampered_with_still_ends_on_the_sealed_notes(
    server, tamper
) -> None:
    """The count only wakes (issue 35): set back, deleted or garbled after the first agent
    arrived, the last one never counts to 2; a note deleted, the count is right but the notes
    are not all in. Either way the barrier ends within a look past the counter (LOOK_FIRST s,
    the first agent writing its note again), never at its timeout."""
    first, second, evil = scope(server, 0), scope(server, 1), outsider(server)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(first.barrier, 2, 30.0, NAMES)
        wait_for(lambda: evil.check([first.key("arrived")]), 10, "the first arrival")
        if tamper == "set back":
            evil.set(first.key("arrived"), b"-5")
        elif tamper == "deleted":
            evil.delete_key(first.key("arrived"))
        elif tamper == "garbage":
            evil.set(first.key("arrived"), b"garbage")
        else:
            evil.delete_key(first.key("in", 0))
        start = time.monotonic()
        second.barrier(2, 30.0, NAMES)
        waiting.result(timeout=30)
        took = time.monotonic() - start
    assert took <= LOOK_FIRST + 10, f"{took:.1f}s: the barrier waited for its counter"
    assert KEYS.unseal(evil.get(first.key("in/0")), first.key("in/0"), "note") == {}


def test_a_done_record_garbled_after_the_first_agent_left_is_written_again(server) -> None:
    """The soak's clean seed 2008: node 0 had left the join barrier; an outsider set the count
    back and garbled the done record before node 1 read it. Node 1 looked only when the count
    said so, so nobody wrote it again and the job hung. Garbage at the done record is a full
    look: every sealed note in, the done record written again."""
    first, second, evil = scope(server, 0), scope(server, 1), outsider(server)
    second.put("in/1", {})
    first.barrier(2, 30.0, NAMES)  # ends at its first look: both notes are in
    evil.add(first.key("arrived"), -1000)
    evil.set(first.key("done"), b"garbage")
    assert evil.get(first.key("done")) == b"garbage"
    start = time.monotonic()
    second.barrier(2, 30.0, NAMES)
    assert time.monotonic() - start < 10, "node 1 waited for the barrier's timeout"


def test_a_forged_round_end_leaves_node_0_waiting_only_until_the_rounds_deadline(server) -> None:
    from agent.run.health import Health
    from agent.run.lineup import REPORT_SLACK, gather, post_health

    leader, evil = scope(server, 0, "r0/l0", ("health-done",)), outsider(server)
    evil.add(leader.key("reported"), 1)  # as if member 1 had reported
    evil.set(leader.key("health-done"), b"")
    evil.set(leader.key("health", 1), b"garbage")  # and its report, forged
    post_health(leader, Health(), 2)
    found: list = []
    thread = threading.Thread(
        target=lambda: found.append(gather(leader, [0, 1], set, 0.5, slack=0.5))
    )
    thread.daemon = True  # a regression hangs here: the test fails instead of the suite
    thread.start()
    thread.join(REPORT_SLACK + 30)
    assert found, "node 0 still waits for a report that will never come sealed"
    assert found[0][0] == Health() and found[0][1] is None  # member 1 sent no sealed report


def test_node_0_gathers_the_reports_though_their_counter_was_deleted(server) -> None:
    """The count only wakes (issue 35): deleted between two reports, the last reporter never
    counts to 2 and sets no `health-done`; node 0 looks at the reports themselves within 1 s,
    not at the end of the round (--health-timeout and the slack)."""
    from agent.run.health import Health
    from agent.run.lineup import gather, post_health

    leader, member = scope(server, 0, "r0/l0", ("health-done",)), scope(server, 1, "r0/l0")
    post_health(member, Health(), 2)
    outsider(server).delete_key(leader.key("reported"))
    post_health(leader, Health(), 2)
    start = time.monotonic()
    found = gather(leader, [0, 1], set, 30.0)
    took = time.monotonic() - start
    assert found == {0: Health(), 1: Health()}
    assert took <= 10, f"{took:.1f}s: node 0 waited for the counter"


@pytest.mark.parametrize("attack", ["deleted", "garbled", "garbled every 5 ms"])
def test_node_0_whose_plan_was_deleted_or_garbled_writes_it_again(server, attack) -> None:
    """A deletion delays, never decides: node 0 looks past its barrier's counter and finds the
    plan it published gone (the soak's most common outcome change: node 0 ended the job as
    tampering, exit 4, node 1 never arrived); it writes the plan again and the run goes on.
    Garbled every 5 ms (the soak's seed 2000: node 1 polled the known key and never caught a
    sealed plan between node 0's writes), each write is also a copy under a name only the job
    can compute, and node 1, blocked on that name, reads it the moment it comes."""
    leader, follower, evil = (
        scope(server, 0, wakes=("plan", "done")),
        scope(server, 1, wakes=("plan", "done")),
        outsider(server),
    )
    record = {"plan": {"script": "train.py"}, "absent": []}
    leader.put("plan", record)
    assert leader.store.exists(leader.key("plan"))  # processed before the outsider's write
    key = leader.key("plan")
    evil.delete_key(key) if attack == "deleted" else evil.set(key, b"garbage")
    often = attack == "garbled every 5 ms"
    garbled = hammering(lambda: evil.set(key, b"garbage"), 0.005 if often else 3600)
    start = time.monotonic()
    with garbled, ThreadPoolExecutor(1) as pool:
        ended = pool.submit(leader.barrier, 2, 60.0, NAMES, kept={"plan": record})
        assert follower.get("plan", "config payload", timeout=60) == record
        follower.barrier(2, 60.0, NAMES)
        ended.result(timeout=60)
    assert time.monotonic() - start < 10 * (LOOK_FIRST + 1)  # a hang-catcher: one look re-posts


def test_notes_garbled_faster_than_the_looks_come_still_end_the_barrier(server) -> None:
    """The soak's restart seed 3005: both agents' notes garbled every few hundred ms; each agent
    wrote its own again at its looks, node 0 never found both sealed at one look, and the job
    hung. A note read sealed once counts (its agent arrived), and one that does not open is
    looked for among its agent's secret-named copies."""
    first, second, evil = scope(server, 0), scope(server, 1), outsider(server)
    notes = [first.key("in", 0), first.key("in", 1)]

    def garble() -> None:  # every note, once it exists
        for key in notes:
            if evil.check([key]):
                evil.set(key, b"garbage")

    with hammering(garble, 0.005), ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(first.barrier, 2, 30.0, NAMES)
        wait_for(lambda: evil.check([notes[0]]) and evil.get(notes[0]) == b"garbage", 10,
                 "the outsider to garble node 0's note")  # fmt: skip
        second.barrier(2, 30.0, NAMES)
        waiting.result(timeout=30)


@pytest.mark.parametrize("tamper", ["garbage", "delete"])
def test_a_done_record_garbled_or_deleted_as_fast_as_it_comes_still_ends_the_barrier(
    server, tamper
) -> None:
    """The soak's clean seed 4000: the barrier's done record garbled every few hundred ms; the
    agents wrote it again and polled the known key, never catching it sealed (a hung job). Each
    write of it is also a secret-named copy, which a waiting agent blocks on."""
    first, second, evil = scope(server, 0), scope(server, 1), outsider(server)
    done = first.key("done")

    def attack() -> None:  # the done record, from before anyone writes it
        evil.set(done, b"garbage") if tamper == "garbage" else evil.delete_key(done)

    with hammering(attack, 0.002), ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(first.barrier, 2, 30.0, NAMES)
        second.barrier(2, 30.0, NAMES)
        waiting.result(timeout=30)


def test_a_reader_goes_on_to_the_writers_latest_copy(server) -> None:
    """Copies deleted or garbled before anyone read them: the reader goes on to the writer's
    latest (an outsider cannot write a copy's name before the writer does: it needs the
    secret; it can garble or delete one it has seen listed)."""
    writer, reader, evil = scope(server, 0), scope(server, 1), outsider(server)
    copy = [writer.keys.copy_name(writer.key("lineup"), n) for n in (0, 1, 2, 3)]
    for n in (1, 2, 3):
        writer.put_again("lineup", {"n": n}, n)
    assert writer.store.exists(copy[3])  # every write processed before the outsider's
    evil.delete_key(copy[1])
    evil.set(copy[2], b"garbage")
    evil.set(writer.key("lineup"), b"garbage")
    assert evil.get(writer.key("lineup")) == b"garbage"
    start = time.monotonic()
    assert reader.get("lineup", "lineup", timeout=30) == {"n": 3}
    assert time.monotonic() - start < 10  # a hang-catcher: no wait for copy 1 to come back


def test_garbage_over_the_public_key_check_is_no_secret_mismatch(server) -> None:
    """Issue 35: an outsider's garbage at `hello` ended a joining agent as a secret mismatch
    (exit 4) and left node 0 waiting out the join. Now it is waited past, then the check is
    skipped (a join with another secret is still refused by the rendezvous timeout); a
    readable value that differs is still a mismatch."""
    from agent.node.handshake import UNREADABLE_WAIT, check
    from agent.node.trust import Refused

    public = scope(server, 1).store.under("la/job/0/")
    outsider(server).set(public.key("hello"), b"garbage")
    start = time.monotonic()
    check(public, KEYS, 1, 60.0, "node 0 (n0)")
    assert time.monotonic() - start <= UNREADABLE_WAIT + 5
    other = JobKeys.derive(b"another-secret", "job", "0")
    public.set_json(public.key("hello"), {"check": other.check_value})
    with pytest.raises(Refused):
        check(public, KEYS, 1, 60.0, "node 0 (n0)")
