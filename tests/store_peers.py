"""A real job store for in-process tests: torch's TCPStore server, our client as a node's, and
torch's own client as the outsider who can list, set, add and delete any key."""

from __future__ import annotations

from datetime import timedelta

from torch.distributed import TCPStore

from agent.node.scope import Scope
from agent.node.store import Endpoint, Store
from agent.node.store_client import StoreClient
from agent.node.trust import JobKeys


def store_server() -> TCPStore:
    return TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )


def node_scope(server: TCPStore, index: int, keys: JobKeys, prefix: str = "r0/a0") -> Scope:
    """Agent `index`'s scope over a connection of its own."""
    client = StoreClient.connect("127.0.0.1", server.port, 10)
    return Scope(Store(client, Endpoint("127.0.0.1", server.port), "n/"), prefix, index, keys)


def outsider(server: TCPStore) -> TCPStore:
    return TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))
