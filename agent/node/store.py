"""The job's c10d TCPStore: node 0 hosts it, every agent joins with O(1) operations.

The only module that imports torch.distributed, and only node 0 needs it (to host the server):
the other agents talk to it through agent.node.store_client, which is torch-free, and fall back
to torch's client only if the server speaks a dialect that client does not know; a one-agent job
keeps its store in process (agent.node.local_store). Keys live under a namespace derived from the
job's secret (agent.node.trust); only `la/<job>/<step>/hello|mismatch` are public. Nothing is
ever unpickled: records are JSON, sealed with AES-GCM and bound to their key (agent.node.scope).
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from agent.errors import AgentError, ExitCode
from agent.node.hosting import is_ip, probe_port, raise_fd_limit
from agent.node.local_store import LocalStore
from agent.node.ranks_store import RanksStore
from agent.node.store_client import ProtocolMismatch, StoreClient

_LONG = timedelta(days=7)


def _torch_store():
    # Imported lazily: `--help`, `logs`, `doctor` and `bootstrap` never pay for torch.
    import torch
    from torch.distributed import TCPStore

    from agent.node.dnsfix import disable_reverse_dns

    disable_reverse_dns(os.path.join(os.path.dirname(torch.__file__), "lib"))
    return TCPStore


def _is_timeout(exc: BaseException) -> bool:
    return "timeout" in str(exc).lower() or "timed out" in str(exc).lower()


@dataclass(frozen=True)
class Endpoint:
    addr: str
    port: int


class Store:
    """One agent's view of the job store (a client, plus the server on node 0)."""

    def __init__(self, client: Any, endpoint: Endpoint, namespace: str, server: Any = None) -> None:
        self._client = client
        self.endpoint = endpoint
        self.ns = namespace
        self._server = server  # keeps node 0's server alive as long as this object lives
        self._workers: Any = None  # node 0: the ranks' store of the running attempt
        self._hosts_ranks = False  # a one-agent job: host its ranks' store (host_ranks_store)
        self.local_addr: str | None = None  # node 0: where its own server is reached

    # -- opening --------------------------------------------------------------------------
    @classmethod
    def host(
        cls, endpoint: Endpoint, namespace: str, where: str, alone: bool = False, agents: int = 1
    ) -> Store:
        """Node 0: bind the port now (fail fast if taken) and serve `agents` until this agent
        exits. `alone`: a one-agent job keeps its store in process; its rank 0 will host the
        ranks' store on the given port (checked free now) or on a free one."""
        try:
            if alone:
                if endpoint.port:
                    probe_port(endpoint.port)
                return cls(LocalStore(), endpoint, namespace)
            raise_fd_limit(agents)
            listener = _listener(endpoint)  # before torch: a taken port fails fast here
            server = _torch_store()(
                "0.0.0.0" if listener is None else endpoint.addr,
                endpoint.port if listener is None else listener.getsockname()[1],
                is_master=True,
                wait_for_workers=False,
                timeout=_LONG,
                master_listen_fd=None if listener is None else listener.fileno(),
            )
        except (RuntimeError, ValueError, OSError) as exc:
            raise AgentError(
                f"cannot open the job store on {where} port {endpoint.port}: {_first_line(exc)}; "
                "another job may hold it: pass --master-port PORT (a free port)",
                ExitCode.USAGE,
            ) from None
        bound = Endpoint(endpoint.addr, server.port)
        # The main thread talks to its own server through the Python client, like every other
        # agent: its blocking waits then answer to signals (torch's client blocks in C++).
        local = "127.0.0.1" if listener is None else listener.getsockname()[0]
        try:
            client: Any = StoreClient.connect(local, server.port, 30.0)
        except (ProtocolMismatch, OSError):
            client = server
        store = cls(client, bound, namespace, server=(server, listener))
        store.local_addr = local
        return store

    @classmethod
    def connect(cls, endpoint: Endpoint, namespace: str, timeout: float, who: str) -> Store:
        """Other agents: connect, retrying until `timeout` (node 0 may start later)."""
        try:
            try:
                client = StoreClient.connect(endpoint.addr, endpoint.port, timeout)
            except ProtocolMismatch:
                client = _torch_client(endpoint, timedelta(seconds=timeout))
        except (RuntimeError, ValueError, OSError) as exc:
            raise AgentError(
                f"rendezvous failed: {who} at {endpoint.addr}:{endpoint.port} did not answer "
                f"within {timeout:g}s ({_first_line(exc)}); is node 0's agent running? "
                "raise --rdzv-timeout if it starts late",
                ExitCode.RENDEZVOUS,
            ) from None
        return cls(client, endpoint, namespace)

    def another_client(self, op_timeout: float | None = None, lazy: bool = False) -> Store:
        """A second connection, for a thread that blocks (watchers) or ticks (heartbeats).
        `op_timeout` bounds each query but waits (our client only; torch's keeps its own);
        `lazy`: connected at its first query (node 0 serves every agent's connections)."""
        if isinstance(self._client, LocalStore):
            return self
        if isinstance(self._client, StoreClient):
            addr = self.local_addr or self.endpoint.addr
            if lazy:
                client: Any = StoreClient.deferred(addr, self.endpoint.port, op_timeout)
            else:
                client = StoreClient.connect(addr, self.endpoint.port, 30.0, op_timeout)
        else:
            client = _torch_client(self.endpoint, _LONG)
        return Store(client, self.endpoint, self.ns)

    @property
    def local(self) -> bool:
        """The in-process store of a one-agent job (no network, no value size limit)."""
        return isinstance(self._client, LocalStore)

    def under(self, namespace: str) -> Store:
        """The same connection, under another namespace (the job's public keys)."""
        store = Store(self._client, self.endpoint, namespace, self._server)
        store.local_addr = self.local_addr
        return store

    def serve_workers(self) -> RanksStore:
        """Node 0: a fresh store for the ranks of one attempt (torch's agent-store protocol);
        the previous attempt's is closed (its ranks are gone). `close_workers` ends the last.

        A one-agent job only picks a free port, where its rank 0 hosts the store (plan.rank_env),
        until `host_ranks_store` has been called (a resident agent, once its warm interpreter
        is ready): then the agent hosts it too, on that port if one was given.
        """
        alone = isinstance(self._client, LocalStore)
        if alone and not self._hosts_ranks:
            return RanksStore(self.endpoint.port or probe_port(0), agent_store=False)
        self.close_workers()
        tcp_store = _torch_store()
        port = self.endpoint.port if alone else 0
        server = tcp_store("0.0.0.0", port, is_master=True, wait_for_workers=False, timeout=_LONG)
        self._workers = server
        return RanksStore(server.port, agent_store=True)

    def host_ranks_store(self) -> None:
        """A one-agent job's agent hosts its ranks' store from the next attempt on (imports
        torch: seconds of CPU, so a resident agent does it once, off the run's path). With rank
        0 hosting it, a rank that reached init_process_group first waited out torch's connect
        back-off: 0.4-0.7 s of a warm 1 x 2 run's 0.8 s, one run in two (BENCHMARKS.md)."""
        if isinstance(self._client, LocalStore):
            _torch_store()
            self._hosts_ranks = True

    def close(self) -> None:
        """This client's connection, now (torch's own closes when it is collected)."""
        close = getattr(self._client, "close", None)
        if close is not None:
            close()

    def close_workers(self) -> None:
        """The ranks' store of the last attempt, closed (its port and threads with it)."""
        self._workers = None  # torch's server stops when its last reference goes

    # -- primitives -----------------------------------------------------------------------
    def key(self, *parts: object) -> str:
        return self.ns + "/".join(str(p) for p in parts)

    def set_json(self, key: str, value: Any) -> None:
        self._client.set(key, json.dumps(value, separators=(",", ":")))

    def set_bytes(self, key: str, value: bytes) -> None:
        self._client.set(key, value)

    def get_bytes(self, key: str, present: bool = False) -> bytes:
        """Waits for the key to exist; `present`: known to exist, one round trip (our client)."""
        if present and isinstance(self._client, StoreClient):
            return self._client.get(key, wait=False)
        return bytes(self._client.get(key))

    def get_json(self, key: str) -> Any:
        return json.loads(self.get_bytes(key))

    def add(self, key: str, amount: int = 1) -> int:
        return int(self._client.add(key, amount))

    def add_all(self, keys: Sequence[str], amount: int = 1) -> list[int]:
        """`add` to every key (our client: the queries pipelined, not a round trip each)."""
        if isinstance(self._client, StoreClient):
            return self._client.add_all(keys, amount)
        return [int(self._client.add(key, amount)) for key in keys]

    def exists(self, key: str) -> bool:
        return bool(self._client.check([key]))

    def exists_each(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key exists: one round trip with our client."""
        if isinstance(self._client, StoreClient):
            return self._client.check_each(keys)
        return [bool(self._client.check([key])) for key in keys]

    def exists_all(self, keys: Sequence[str]) -> bool:
        """Whether every key exists (one query)."""
        return bool(self._client.check(list(keys)))

    def wait(self, keys: Iterable[str], timeout: float | None) -> bool:
        """Block until every key exists; False on timeout (other errors propagate)."""
        span: Any = timeout
        if not isinstance(self._client, (StoreClient, LocalStore)):
            span = _LONG if timeout is None else timedelta(seconds=max(timeout, 0.001))
        try:
            self._client.wait(list(keys), span)
        except RuntimeError as exc:  # DistStoreError subclasses RuntimeError
            if _is_timeout(exc):
                return False
            raise
        return True

    def multi_get(self, keys: Sequence[str], present: bool = False) -> list[bytes]:
        """Waits for every key; `present`: known to exist, one round trip (our client)."""
        if isinstance(self._client, StoreClient):
            return self._client.multi_get(keys, wait=not present)
        return [bytes(v) for v in self._client.multi_get(list(keys))]


def _listener(endpoint: Endpoint) -> socket.socket | None:
    """A socket bound to node 0's own address only, when MASTER_ADDR is one of this host's
    (not every interface: fewer networks reach the store); None where it is not (NAT, a k8s
    service name): then torch binds every interface, as before."""
    try:
        addr = socket.getaddrinfo(endpoint.addr, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except OSError:
        return None
    if ipaddress.ip_address(addr).is_loopback and not is_ip(endpoint.addr):
        # Debian maps a host's own name to 127.0.1.1 in /etc/hosts while the other nodes
        # resolve it to the real address: binding there would shut them out.
        return None
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore binds it
    try:
        listener.bind((addr, endpoint.port))
    except OSError as exc:
        listener.close()
        if exc.errno == errno.EADDRINUSE:
            raise
        return None
    listener.listen(1024)
    return listener


def _torch_client(endpoint: Endpoint, timeout: timedelta) -> Any:
    return _torch_store()(endpoint.addr, endpoint.port, is_master=False, timeout=timeout)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def public_namespace(job_id: str, step_id: str) -> str:
    """The only key names an outsider can compute; every other key is under JobKeys.namespace."""
    return f"la/{job_id or 'local'}/{step_id or '0'}/"
