"""Our torch-free TCPStore client against torch's real server, and torch's client beside it."""

from __future__ import annotations

import select
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from agent.node.store_client import ProtocolMismatch, StoreClient, StoreClosed, StoreTimeout


@pytest.fixture()
def server():
    store = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    yield store


def _ours(server) -> StoreClient:
    return StoreClient.connect("127.0.0.1", server.port, 10)


def test_values_cross_between_our_client_and_torchs(server) -> None:
    ours = _ours(server)
    ours.set("a/b", b"\x00bytes\xff")
    assert server.get("a/b") == b"\x00bytes\xff"
    server.set("from-torch", "text")
    assert ours.get("from-torch") == b"text"
    assert ours.multi_get(["a/b", "from-torch"]) == [b"\x00bytes\xff", b"text"]
    assert ours.add("n", 5) == 5 and server.add("n", 2) == 7 and ours.add("n", 0) == 7
    assert ours.check(["a/b", "from-torch"]) and not ours.check(["a/b", "missing"])


def test_which_of_many_keys_exist_comes_back_in_order_key_by_key(server) -> None:
    """Node 0's coordinator asks which nodes posted a standing: one pipelined query for all."""
    from agent.node.local_store import LocalStore
    from agent.node.store import Endpoint, Store

    keys = [f"standing/{i}" for i in range(3000)]
    for key in keys[::7]:
        server.set(key, "x")
    expected = [i % 7 == 0 for i in range(3000)]
    assert _ours(server).check_each(keys) == expected
    assert (
        Store(_ours(server), Endpoint("127.0.0.1", server.port), "").exists_each(keys) == expected
    )
    local = LocalStore()
    local.set("b", b"1")
    assert Store(local, Endpoint("127.0.0.1", 1), "").exists_each(["a", "b"]) == [False, True]
    assert _ours(server).check_each([]) == []


def test_wait_returns_when_another_client_sets_the_key(server) -> None:
    ours = _ours(server)
    setter = threading.Timer(0.2, lambda: server.set("later", "1"))
    setter.start()
    ours.wait(["later"], 10)
    assert ours.get("later") == b"1"
    setter.join()


def test_wait_timeout_cancels_and_leaves_the_connection_usable(server) -> None:
    ours = _ours(server)
    with pytest.raises(StoreTimeout, match="timeout"):
        ours.wait(["never"], 0.2)
    ours.set("after", b"x")  # the cancelled wait left nothing half-read on the socket
    assert ours.get("after") == b"x" and ours.add("c", 1) == 1


def test_a_server_that_is_not_a_tcpstore_is_a_protocol_mismatch() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def answer_garbage() -> None:
        conn, _ = listener.accept()
        conn.recv(64)
        conn.sendall(b"HTTP")
        conn.close()

    thread = threading.Thread(target=answer_garbage)
    thread.start()
    with pytest.raises(ProtocolMismatch):
        StoreClient.connect("127.0.0.1", listener.getsockname()[1], 5)
    thread.join()
    listener.close()


def test_connect_waits_for_a_late_server_and_gives_up_on_none() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    with pytest.raises(TimeoutError):
        StoreClient.connect("127.0.0.1", port, 0.3)
    holder: list[TCPStore] = []
    starter = threading.Timer(
        0.3,
        lambda: holder.append(TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)),
    )
    starter.start()
    ours = StoreClient.connect("127.0.0.1", port, 20)
    starter.join()
    ours.set("k", b"v")
    assert holder[0].get("k") == b"v"


def test_a_dead_server_is_reported_as_closed() -> None:
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ours = StoreClient.connect("127.0.0.1", server.port, 10)
    del server
    with pytest.raises(StoreClosed):
        ours.wait(["never"], None)


def test_the_client_does_not_import_torch() -> None:
    code = "import sys, agent.node.store, agent.node.membership, agent.node.agent; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


@pytest.mark.e2e
def test_a_one_node_job_runs_without_the_agent_importing_torch(tmp_path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(
        "import os, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"  # rank 0 hosts the ranks' store: the agent hosts none
        "print(os.environ['TORCHELASTIC_USE_AGENT_STORE'], dist.get_world_size())\n"
        "dist.destroy_process_group()\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "agent",
            "--nproc-per-node",
            "2",
            "--log-dir",
            str(tmp_path / "logs"),
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "agent.node.agent" in imported and "torch" not in imported
    for rank in (0, 1):
        assert (tmp_path / "logs" / f"rank-0000{rank}.out").read_text() == "False 2\n"


def test_a_server_that_goes_silent_times_out_instead_of_blocking_forever() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    held: list[socket.socket] = []

    def handshake_then_silence() -> None:
        conn, _ = listener.accept()
        held.append(conn)  # kept open: a dead host sends no FIN
        hello = conn.recv(64)
        conn.sendall(hello[-4:])  # echo the PING nonce, then never answer again

    thread = threading.Thread(target=handshake_then_silence)
    thread.start()
    ours = StoreClient.connect("127.0.0.1", listener.getsockname()[1], 5, op_timeout=0.3)
    thread.join()
    with pytest.raises(TimeoutError):
        ours.add("hb/1", 1)
    for sock in (*held, listener):
        sock.close()


@pytest.mark.e2e
@pytest.mark.parametrize("fixed_port", [False, True])
def test_a_one_node_job_restarts_with_rank_0_hosting_the_store_again(tmp_path, fixed_port) -> None:
    script = tmp_path / "rank.py"
    script.write_text(
        "import os, sys, torch.distributed as dist\n"
        "dist.init_process_group('gloo'); dist.barrier()\n"
        "attempt = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
        "print('attempt', attempt, 'port', os.environ['MASTER_PORT'])\n"
        "dist.destroy_process_group()\n"
        "sys.exit(3 if attempt == 0 else 0)\n"
    )
    port = []
    if fixed_port:
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = ["--master-port", str(probe.getsockname()[1])]
    logs = tmp_path / "logs"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            *port,
            "--log-dir",
            str(logs),
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    first, second = (
        (logs / "rank-00001.out").read_text().split(),
        (logs / "rank-00001.r1.out").read_text().split(),
    )
    assert first[:2] == ["attempt", "0"] and second[:2] == ["attempt", "1"]
    if fixed_port:
        assert first[3] == second[3] == port[1]


@pytest.mark.parametrize("garbage", [b"garbage", b"", b"{}", b"9" * 30])
def test_a_counter_an_outsider_set_to_a_non_number_is_reset_not_the_end_of_the_store(
    server, garbage
) -> None:
    """torch's server closes the connection of a client whose add() meets a value that is not a
    number. Anyone may set one over our counters (the tampering fuzzer found it: the agent's
    add() then said "lost the job store", exit 3): the store is still there, so the counter is
    reset and added to again, on a fresh connection that goes on answering."""
    ours = _ours(server)
    outsider = TCPStore(
        "127.0.0.1", server.port, is_master=False, wait_for_workers=False,
        timeout=timedelta(seconds=10),
    )  # fmt: skip
    ours.add("wake", 3)
    outsider.set("wake", garbage)
    assert outsider.get("wake") == garbage  # processed: a `set` has no answer, a `get` has
    assert ours.add("wake", 1) == 1
    outsider.set("b", garbage)
    assert outsider.get("b") == garbage
    assert ours.add_all(["a", "b", "c"], 2) == [2, 2, 2]  # a: added before the close, once
    assert server.get("a") == b"2" and ours.get("wake") == b"1"


def test_a_server_gone_after_an_add_is_still_reported_as_closed() -> None:
    server = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5)
    )
    ours = _ours(server)
    del server  # torch's server stops with its last reference: no new connection is answered
    with pytest.raises(StoreClosed):
        ours.add("n", 1)


def _closed_by_the_server(client: StoreClient) -> None:
    """A byte torch's server cannot parse: it closes the connection (as it does on what an
    outsider's writes can lead to), the store itself still up."""
    client._sock.sendall(b"\xff")
    assert select.select([client._sock], [], [], 10)[0], "the server kept the connection"


@pytest.mark.parametrize("query", ["wait", "get", "multi_get", "check", "set", "add"])
def test_a_query_goes_on_over_a_fresh_connection_when_the_server_closed_ours(server, query) -> None:
    """Only a store that answers no new connection is lost (issue 35: an agent waiting in the
    join barrier said 'lost the job store' while node 0's server was up). A counter that holds
    a number is not reset: the close had another cause."""
    ours = _ours(server)
    server.set("k", b"5")
    _closed_by_the_server(ours)
    if query == "wait":
        ours.wait(["k"], 10)
    elif query == "get":
        assert ours.get("k") == b"5"
    elif query == "multi_get":
        assert ours.multi_get(["k", "k"]) == [b"5", b"5"]
    elif query == "check":
        assert ours.check(["k"])
    elif query == "set":
        ours.set("n", b"x")
        assert ours.get("n") == b"x"
    else:
        assert ours.add("k", 1) == 6
    assert ours.check(["k"]) and server.get("k") == (b"6" if query == "add" else b"5")


def test_a_wait_whose_new_connection_is_not_answered_ends_at_its_deadline(server) -> None:
    """torch's server leaves about one new connection in 50 unanswered for seconds: the fresh
    connection a wait makes after a close is bounded by the wait's own deadline (it waited
    through every handshake try, 14 s, before), and the client says closed, not a crash, next."""
    ours = _ours(server)
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never answers the handshake
    ours._address = ("127.0.0.1", silent.getsockname()[1])
    _closed_by_the_server(ours)
    start = time.monotonic()
    with pytest.raises(StoreTimeout):
        ours.wait(["never"], 1.0)
    assert time.monotonic() - start < 6  # 1 s + one handshake's 1 s floor; 14 s before
    ours._address = None  # no new connection to try: the next query is told, not crashed
    with pytest.raises(StoreClosed):
        ours.check(["k"])
    silent.close()


def test_a_wait_over_a_fresh_connection_keeps_its_deadline(server) -> None:
    ours = _ours(server)
    _closed_by_the_server(ours)
    start = time.monotonic()
    with pytest.raises(StoreTimeout):
        ours.wait(["never"], 1.0)
    assert time.monotonic() - start < 5


def test_a_key_deleted_between_a_check_and_its_get_reads_as_nothing_not_a_lost_store(server):
    """Readers check, then get (one round trip less); an outsider may delete the key in
    between. It reads as an empty value (one that opens as nothing: the reader waits past it),
    never as a lost store: torch's libuv server answers one; its older backend closes the
    connection, and the client checks again on its new one."""
    ours = _ours(server)
    server.set("there", b"1")
    assert ours.get("gone", wait=False) == b""
    assert ours.multi_get(["there", "gone", "there"], wait=False) == [b"1", b"", b"1"]
    ours.set("after", b"ok")
    assert ours.get("after") == b"ok"  # the client goes on over its new connection


def test_a_store_gone_for_good_is_told_with_why_no_new_connection_was_made() -> None:
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ours = StoreClient.connect("127.0.0.1", server.port, 10)
    del server
    start = time.monotonic()
    with pytest.raises(StoreClosed, match="refused for 1s"):
        ours.check(["k"])
    assert time.monotonic() - start < 10  # the grace is 1 s: a hang-catcher


def test_a_store_that_refuses_a_new_connection_briefly_is_not_lost() -> None:
    """A refusal shorter than the grace (here the server is down for 0.3 s and comes back on
    the same port) does not end the store: the query goes on over the new connection."""
    first = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    port = first.port
    ours = StoreClient.connect("127.0.0.1", port, 10)
    del first
    back: list[TCPStore] = []
    restart = threading.Timer(
        0.3,
        lambda: back.append(TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)),
    )
    restart.start()
    try:
        ours.set("k", b"after")  # refused at first, then answered by the store back on its port
        assert ours.get("k") == b"after"
    finally:
        restart.join()


def test_a_one_agent_store_hosts_its_ranks_store_once_asked() -> None:
    """A one-agent job's ranks meet at rank 0's store (the agent has no torch) until its agent
    is asked to host it (a resident agent, once warm): then every rank is a client of the
    agent's server, which is there before any rank asks (no connect back-off)."""
    from agent.node.store import Endpoint, Store

    store = Store.host(Endpoint("127.0.0.1", 0), "ns", "here", alone=True)
    first = store.serve_workers()
    assert not first.agent_store and first.port > 0
    store.host_ranks_store()
    hosted = store.serve_workers()
    assert hosted.agent_store
    rank = TCPStore("127.0.0.1", hosted.port, is_master=False, timeout=timedelta(seconds=10))
    rank.set("k", "v")
    assert rank.get("k") == b"v"
    again = store.serve_workers()  # the next attempt: a fresh store, the last one closed
    fresh = TCPStore("127.0.0.1", again.port, is_master=False, timeout=timedelta(seconds=10))
    assert again.agent_store and fresh.check(["k"]) is False
    store.close_workers()
