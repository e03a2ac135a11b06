"""The joined node (agent.node.joined): what `NodeAgent.connect` returns holds its store,
membership and reporter from the start, and node 0's endpoint record is found only when sealed
(a value that does not open is waited past, never taken). One agent, its in-process store."""

from __future__ import annotations

import time

import pytest

from agent.node.agent import NodeAgent, NodeSettings
from agent.node.joined import ENDPOINT, JoinedNode
from agent.node.membership import Membership
from agent.node.reporter import Reporter
from agent.node.sealed import Tampered
from agent.node.store import Store
from agent.world import world_from_env


@pytest.fixture()
def joined():
    world = world_from_env({}, hostname="localhost")
    agent = NodeAgent(
        world=world, settings=NodeSettings(rdzv_timeout=5), secret=b"joined-test", environ={}
    )
    node = agent.connect()
    yield node
    agent.close()


def test_connect_returns_a_joined_node_with_everything_in_hand(joined):
    assert isinstance(joined, JoinedNode)
    assert isinstance(joined.store, Store)
    assert isinstance(joined.membership, Membership)
    assert isinstance(joined.reporter, Reporter)
    assert joined.leader and joined.lost() == {}


def test_the_endpoint_is_found_once_published(joined):
    assert joined.endpoint_port() is None
    joined.publish_endpoint(4242)
    assert joined.endpoint_port() == 4242
    assert joined.endpoint_port(1.0) == 4242


@pytest.mark.parametrize("record", [{"port": "4242"}, {"port": True}, {}])
def test_a_sealed_record_without_a_port_is_no_endpoint(joined, record):
    joined.node_scope().put(ENDPOINT, record)
    assert joined.endpoint_port() is None


def test_a_forged_endpoint_is_waited_past_never_taken(joined):
    scope = joined.node_scope()
    joined.store.set_bytes(scope.key(ENDPOINT), b'{"port": 1}')  # an outsider's, unsealed
    assert joined.endpoint_port() is None
    start = time.monotonic()
    with pytest.raises(Tampered):
        joined.endpoint_port(0.3)
    assert time.monotonic() - start < 5  # bounded by its timeout, not a hang
