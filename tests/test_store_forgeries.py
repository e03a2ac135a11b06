"""What an outsider writes into the job store (torch's own client, real server) never decides
and never ends a wait: readers wait past values that do not open, barriers end on sealed records
only, and a wait that never gets one ends as suspected tampering."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from agent.errors import AgentError, ExitCode
from agent.node.failure import Failure, Kind
from agent.node.scope import Scope
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


def test_a_barrier_whose_counter_was_reset_ends_as_suspected_tampering(server) -> None:
    first, second, evil = scope(server, 0), scope(server, 1), outsider(server)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(first.barrier, 2, 2.0, NAMES)
        evil.set(first.key("arrived"), b"-5")  # the last agent never counts to 2
        with pytest.raises(AgentError) as excinfo:
            second.barrier(2, 2.0, NAMES)
        with pytest.raises(AgentError):
            waiting.result(timeout=30)
    assert "store tampering suspected at" in excinfo.value.message


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


def test_node_0_whose_plan_was_deleted_ends_its_barrier_as_suspected_tampering(server) -> None:
    from agent.errors import PeerFailed
    from agent.run.prepare import prepare

    leader, follower, evil = (
        scope(server, 0, wakes=("plan", "done")),
        scope(server, 1),
        outsider(server),
    )
    leader.put("plan", {"plan": {}})
    evil.delete_key(leader.key("plan"))  # before node 1 read it: node 1 never arrives
    with pytest.raises(Tampered) as excinfo:
        leader.barrier(2, 1.0, NAMES, kept=("plan",))
    assert excinfo.value.message.startswith(f"store tampering suspected at {leader.key('plan')}")
    error = excinfo.value  # as node 0's agent does: a setup failure that says "tampering"
    leader.report(Failure(Kind.SETUP, error.message, tampering=error.tampering))
    with pytest.raises(PeerFailed) as told:  # node 1, waiting for the plan, hears of it: exit 4
        prepare(follower, world=None, plan=None, environ={}, read_topology=None, timeout=30,
                names=NAMES)  # fmt: skip
    assert told.value.code == ExitCode.REFUSED and "store tampering suspected" in told.value.message
