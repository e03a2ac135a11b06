"""A node index is claimed by a sealed record of the claiming agent; the claim counter only
wakes. An outsider who bumps the counter (found with list_keys) or writes garbage where a claim
goes delays a node's claim at most by the claim's short wait; only another agent's sealed claim
refuses it (torch's own client as the outsider, a real server)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from agent.errors import AgentError, ExitCode
from agent.node.membership import SCOPE, Membership
from agent.node.store import Endpoint, Store
from agent.node.store_client import StoreClient
from agent.node.trust import JobKeys

KEYS = JobKeys.derive(b"claim-test", "job", "0")
NAMES = ["node 0 (h0)", "node 1 (h1)"]
WAIT = 0.5  # the claim's wait for an earlier ticket's record, shortened


@pytest.fixture()
def server():
    return TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )


def member(server, index: int = 1) -> Membership:
    endpoint = Endpoint("127.0.0.1", server.port)
    store = Store(StoreClient.connect("127.0.0.1", server.port, 10), endpoint, "ns/")
    return Membership(store, 2, index, NAMES, KEYS)


def outsider(server) -> TCPStore:
    return TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))


def claim_counter(server) -> str:
    (key,) = [k for k in outsider(server).list_keys() if k.endswith(f"{SCOPE}/claim/1")]
    return key


@pytest.mark.parametrize("bump", [1, 1000, -5])
def test_a_bumped_claim_counter_does_not_refuse_the_node(server, bump) -> None:
    first = member(server, 0)
    first.claim("h0")  # the counters of the job exist: an outsider finds them with list_keys
    evil = outsider(server)
    evil.add(first.store.key(SCOPE, "claim", 1), bump)  # before node 1 claims
    start = time.monotonic()
    member(server).claim("h1", wait=WAIT)  # not refused
    assert time.monotonic() - start < 5 * WAIT + 5  # a bounded delay, not a hang


def test_garbage_where_the_first_claim_goes_does_not_refuse_the_node(server) -> None:
    evil, node = outsider(server), member(server)
    evil.add(node.store.key(SCOPE, "claim", 1), 1)
    evil.set(node.store.key(SCOPE, "claim", 1, 1), b"garbage")  # an unsealed 'claim' of ticket 1
    node.claim("h1", wait=WAIT)


def test_a_second_agent_with_the_same_index_is_refused_naming_the_first(server) -> None:
    member(server).claim("h1", wait=WAIT)
    with pytest.raises(AgentError) as caught:
        member(server).claim("h1", wait=WAIT)
    assert caught.value.code == ExitCode.RENDEZVOUS
    assert "node 1 (h1) is already taken" in caught.value.message
    assert "h1" in caught.value.message and "pid" in caught.value.message


@pytest.mark.parametrize("tamper", ["deleted", "set back", "garbage"])
def test_a_second_agent_is_refused_though_the_claim_counter_went_back(server, tamper) -> None:
    """An outsider deletes, sets back or garbles the counter (garbage: our client resets it):
    the second agent's ticket is the first one's again; the sealed claim there refuses it."""
    member(server).claim("h1", wait=WAIT)
    evil, counter = outsider(server), claim_counter(server)
    if tamper == "deleted":
        evil.delete_key(counter)
    else:
        evil.set(counter, b"0" if tamper == "set back" else b"garbage")
    with pytest.raises(AgentError) as caught:
        member(server).claim("h1", wait=WAIT)
    assert "node 1 (h1) is already taken" in caught.value.message


def test_a_later_claimant_waits_for_an_earlier_ticket_that_is_being_written(server) -> None:
    """Two agents started at once: the one with the later ticket sees the earlier one's
    sealed claim though it is written after the later one looks."""
    early = member(server)
    ticket = early.store.add(early.store.key(SCOPE, "claim", 1))  # the early agent, mid-claim
    refused: list[AgentError] = []

    def later() -> None:
        try:
            member(server).claim("h1", wait=30.0)
        except AgentError as exc:
            refused.append(exc)

    thread = threading.Thread(target=later)
    thread.start()
    evil, own = outsider(server), early.store.key(SCOPE, "claim", 1, ticket + 1)
    evil.wait([own], timedelta(seconds=30))  # the later one has taken its ticket and claimed
    early.scope.put(f"claim/1/{ticket}", {"i": 1, "ticket": ticket, "host": "h1", "pid": 7})
    thread.join(30)
    assert not thread.is_alive()
    assert refused and "already taken" in refused[0].message


@pytest.mark.parametrize("tamper", ["deleted", "garbage"])
def test_hosts_read_after_the_join_wait_past_a_tampered_note_within_a_bound(server, tamper) -> None:
    """Issue 35: node 0 read the hosts (for each attempt's seating) waiting for ever past a
    host announcement an outsider garbled after the join: the job hung. Now it waits
    HOSTS_WAIT s at most and that host is unknown."""
    from agent.node.membership import HOSTS_WAIT

    first, second = member(server, 0), member(server, 1)
    first.scope.put("in/0", {"host": "h0"})
    second.scope.put("in/1", {"host": "h1"})
    key = first.scope.key("in", 1)
    if tamper == "deleted":
        outsider(server).delete_key(key)
    else:
        outsider(server).set(key, b"garbage")
    start = time.monotonic()
    assert first.hosts() == ["h0", ""]
    assert time.monotonic() - start <= HOSTS_WAIT + 5
