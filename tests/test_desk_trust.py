"""The attempt's request channel (`agent stacks`, `agent debug`) past an outsider: a request
number that leads to no sealed request is skipped, never waited on for ever, and node 0 numbers
its requests itself (torch's own client as the outsider, a real server)."""

from __future__ import annotations

import pytest
from store_peers import node_scope, outsider, store_server

from agent.hang.desk import StackDesk
from agent.node.scope import Scope
from agent.node.trust import JobKeys

KEYS = JobKeys.derive(b"desk-test", "job", "0")
RECHECK = 0.2  # how long an answering thread waits on one request before it looks past it


@pytest.fixture()
def server():
    return store_server()


def scope(server, index: int) -> Scope:
    return node_scope(server, index, KEYS)


def desk(server, index: int, start: bool = True) -> StackDesk:
    made = StackDesk(scope(server, index), [0, 1], f"h{index}", list, recheck=RECHECK)
    made.relays["echo"] = lambda number, request: {"echo": request.get("x"), "n": number}
    if start:
        made.start()
    return made


def seq_key(server) -> str:
    """The request counter as an outsider finds it (list_keys), or where it would be."""
    found = [k for k in outsider(server).list_keys() if k.endswith("stacks/seq")]
    return found[0] if found else "n/r0/a0/stacks/seq"


def answered(node: StackDesk, number: int) -> dict:
    """Node `node`'s answer to request `number` (a hang-catcher's bound, never a pause)."""
    key = node.scope.key(node.answer_name(number))
    assert node.scope.store.wait([key], 10), f"request {number} was never answered"
    return node.scope.get(node.answer_name(number), "echo answer", present=True)


@pytest.mark.parametrize("bump", [1, 1000, -1000])
def test_a_bumped_request_counter_leaves_every_node_answering(server, bump) -> None:
    node0, node1 = desk(server, 0), desk(server, 1)
    assert all(s.rank >= 0 for s in node0.ask(timeout=0.5))  # every node answered (no ranks)
    outsider(server).add(seq_key(server), bump)
    for _ in range(2):
        answers = node0.ask(timeout=0.5)
        assert [s.error for s in answers if s.rank < 0] == []  # no node named silent
    node0.end()
    del node1


def test_a_request_deleted_before_a_node_read_it_is_skipped(server) -> None:
    node0, node1 = desk(server, 0, start=False), desk(server, 1, start=False)
    first = node0.post({"desk": "echo", "x": 1})
    evil = outsider(server)
    evil.delete_key(node0.scope.key("stacks", "req", first))
    second = node0.post({"desk": "echo", "x": 2})
    node1.start()  # its thread finds request `first` gone, and a later one published
    assert answered(node1, second) == {"echo": 2, "n": second}
    node0.end()


def test_garbage_over_a_request_is_skipped_once_a_later_one_is_published(server) -> None:
    node0, node1 = desk(server, 0, start=False), desk(server, 1, start=False)
    first = node0.post({"desk": "echo", "x": 1})
    outsider(server).set(node0.scope.key("stacks", "req", first), b"garbage")
    second = node0.post({"desk": "echo", "x": 2})
    node1.start()
    assert answered(node1, second) == {"echo": 2, "n": second}
    node0.end()


@pytest.mark.parametrize(
    ("nodes", "seconds"), [(1, 5.0), (2, 5.0), (320, 5.0), (1024, 16.0), (2048, 32.0), (4096, 64.0)]
)
def test_answering_threads_recheck_less_often_in_jobs_too_large_for_node_0s_store(nodes, seconds):
    """Each recheck is a wait, its cancel and a query at node 0's store: N agents share 64 a
    second (only a deleted request needs one: a request that is there ends the wait at once)."""
    from agent.hang.desk import recheck_pace

    assert recheck_pace(nodes) == seconds


@pytest.mark.parametrize(
    ("node_1_answers", "silent"),
    [(False, [(-2, "node 1's answer did not open (altered in the store)")]), (True, [])],
)
def test_garbage_at_a_nodes_answer_key_never_holds_node_0(server, node_1_answers, silent):
    """A hang's stacks are asked once: garbage at a node's answer key must not keep node 0
    waiting past its bound, or the hung job never ends (the soak's hang seed 10: node 0 waited
    on one for ever). Garbage there before the node's answer is waited past until the answer
    comes; a node whose key holds only garbage is named, and the ask returns."""
    import threading

    node0, node1 = desk(server, 0), desk(server, 1, start=False)
    outsider(server).set(node0.scope.key(node0.answer_name(1, 1)), b"garbage")
    if node_1_answers:
        node1.start()
    got: list = []
    asking = threading.Thread(target=lambda: got.append(node0.ask(timeout=0.5)), daemon=True)
    asking.start()
    asking.join(60)  # a hang-catcher: the bound is 0.5 + ANSWER_SLACK s, twice over at most
    assert got, "node 0 still waits on a garbled answer"
    assert [(s.rank, s.error) for s in got[0] if s.rank < 0] == silent
    node0.end()
