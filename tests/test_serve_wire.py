"""agent.control.wire: the authenticated, encrypted channel between node 0's agent and clients,
over real loopback sockets, against honest peers, impostors, and a man in the middle."""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from agent.control import wire
from agent.control.wire import MAX_FRAME, WireError, pack_bytes, unpack_bytes
from agent.errors import ExitCode

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
POOL = ThreadPoolExecutor(max_workers=8)
Hook = Callable[[str, int, bytes, Callable[[bytes], None], Callable[[bytes], None]], None]


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def plain(obj: dict) -> bytes:
    return frame(json.dumps(obj).encode())


def read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def read_frame(sock: socket.socket) -> bytes:
    (length,) = struct.unpack(">I", read_exactly(sock, 4))
    return read_exactly(sock, length)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.create_server(("127.0.0.1", 0))
    yield sock
    sock.close()


def port_of(sock: socket.socket) -> int:
    return sock.getsockname()[1]


def serve_once(listener: socket.socket, key: bytes = KEY, timeout: float = 5.0) -> Future:
    """wire.accept on the next connection, in a thread: its Channel or its exception."""

    def accept_one() -> wire.Channel:
        conn, _ = listener.accept()
        return wire.accept(conn, key, timeout)

    return POOL.submit(accept_one)


def pair(listener: socket.socket, port: int | None = None) -> tuple[wire.Channel, wire.Channel]:
    server = serve_once(listener)
    client = wire.connect("127.0.0.1", port or port_of(listener), KEY, 5.0)
    return client, server.result(timeout=10)


class Proxy:
    """A man in the middle that forwards whole frames; `hook` may alter, drop, duplicate,
    reorder or reflect them (direction "c2s" or "s2c", index counted from 0 per direction)."""

    def __init__(self, upstream: int, hook: Hook | None = None) -> None:
        self.hook = hook or (lambda _d, _i, body, forward, _back: forward(frame(body)))
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = port_of(self.sock)
        self.frames: dict[str, list[bytes]] = {"c2s": [], "s2c": []}
        self._upstream = upstream
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        client, _ = self.sock.accept()
        server = socket.create_connection(("127.0.0.1", self._upstream))
        self.ends = (client, server)
        threading.Thread(target=self._pump, args=("s2c", server, client), daemon=True).start()
        self._pump("c2s", client, server)

    def _pump(self, direction: str, src: socket.socket, dst: socket.socket) -> None:
        index = 0
        try:
            while True:
                body = read_frame(src)
                self.frames[direction].append(body)
                self.hook(direction, index, body, dst.sendall, src.sendall)
                index += 1
        except (EOFError, OSError):
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


def test_messages_travel_both_ways_encrypted(listener):
    proxy = Proxy(port_of(listener))
    client, server = pair(listener, proxy.port)
    blob = os.urandom(3 << 20)
    client.send({"op": "run", "argv": ["train.py", "--lr=1e-3"], "env": {"TOKEN": "hunter2-x"}})
    assert server.recv(timeout=5) == {
        "op": "run",
        "argv": ["train.py", "--lr=1e-3"],
        "env": {"TOKEN": "hunter2-x"},
    }
    server.send({"out": pack_bytes(blob), "fd": 1, "text": "r\u00e9sum\u00e9"})
    got = client.recv(timeout=10)
    assert unpack_bytes(got["out"]) == blob and got["text"] == "r\u00e9sum\u00e9"
    assert client.peer == f"127.0.0.1:{proxy.port}" and server.fileno() >= 0
    # What the man in the middle saw: neither the request nor its secrets in clear.
    assert len(proxy.frames["c2s"]) == 2
    assert b"hunter2-x" not in proxy.frames["c2s"][1] and b"train.py" not in proxy.frames["c2s"][1]
    client.close()
    assert server.recv(timeout=5) is None  # an orderly EOF
    server.close()


def test_sends_from_many_threads_arrive_whole_and_in_order(listener):
    client, server = pair(listener)

    def sender(thread: int) -> None:
        for n in range(100):
            server.send({"t": thread, "n": n, "pad": "x" * (n * 37)})

    senders = [threading.Thread(target=sender, args=(t,)) for t in range(4)]
    for thread in senders:
        thread.start()
    seen: dict[int, list[int]] = {t: [] for t in range(4)}
    for _ in range(400):
        msg = client.recv(timeout=10)
        seen[msg["t"]].append(msg["n"])
    for thread in senders:
        thread.join()
    assert all(numbers == list(range(100)) for numbers in seen.values())
    client.close()
    server.close()


def test_a_client_with_another_secret_is_refused_with_a_clear_message(listener):
    server = serve_once(listener)
    with pytest.raises(WireError) as client_error:
        wire.connect("127.0.0.1", port_of(listener), OTHER_KEY, 5.0)
    message = client_error.value.message
    assert client_error.value.code == ExitCode.REFUSED and "\n" not in message
    assert message.startswith("node 0's agent refused us: secret mismatch")
    assert "AGENT_SECRET" in message and "~/.config/launch-agent/secret" in message
    with pytest.raises(WireError) as server_error:
        server.result(timeout=10)
    assert server_error.value.code == ExitCode.REFUSED
    assert "does not hold the job's secret" in server_error.value.message


def fake_server(listener: socket.socket, answer: Callable[[dict], dict]) -> Future:
    """Speaks the handshake without the key: its proof is whatever `answer` makes of ours."""

    def run() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(plain({"hello": wire.PROTOCOL, "nonce": os.urandom(16).hex()}))
            conn.sendall(plain(answer(json.loads(read_frame(conn)))))
            try:
                conn.recv(1)  # until the client hangs up
            except OSError:
                pass

    return POOL.submit(run)


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(lambda _ours: {"proof": "00" * 32}, id="made-up-proof"),
        pytest.param(lambda ours: {"proof": ours["proof"]}, id="our-own-proof-reflected"),
        pytest.param(lambda _ours: {"welcome": True}, id="no-proof"),
    ],
)
def test_a_server_that_does_not_know_the_secret_is_refused(listener, answer):
    done = fake_server(listener, answer)
    with pytest.raises(WireError) as excinfo:
        wire.connect("127.0.0.1", port_of(listener), KEY, 5.0)
    assert excinfo.value.code == ExitCode.REFUSED
    assert "did not prove it holds the job's secret" in excinfo.value.message
    done.result(timeout=10)


def tamper(direction: str, index: int, body: bytes, forward, _back) -> None:
    if direction == "c2s" and index == 1:
        body = body[:5] + bytes([body[5] ^ 0x01]) + body[6:]
    forward(frame(body))


def replay(direction: str, index: int, body: bytes, forward, _back) -> None:
    forward(frame(body))
    if direction == "c2s" and index == 1:
        forward(frame(body))


def reflect(direction: str, index: int, body: bytes, forward, back) -> None:
    forward(frame(body))
    if direction == "c2s" and index == 1:
        back(frame(body))  # the client's own frame, as if the server had sent it


def make_reorder() -> Hook:
    held: list[bytes] = []

    def reorder(direction: str, index: int, body: bytes, forward, _back) -> None:
        if direction == "c2s" and index == 1:
            held.append(body)
            return
        forward(frame(body))
        if held:
            forward(frame(held.pop()))

    return reorder


@pytest.mark.parametrize(
    ("hook", "victim", "opened"),
    [
        pytest.param(tamper, "server", 0, id="altered-byte"),
        pytest.param(replay, "server", 1, id="replayed"),
        pytest.param(make_reorder(), "server", 0, id="reordered"),
        pytest.param(reflect, "client", 0, id="reflected"),
    ],
)
def test_frames_changed_in_flight_are_refused(listener, hook, victim, opened):
    proxy = Proxy(port_of(listener), hook)
    client, server = pair(listener, proxy.port)
    client.send({"n": 0})
    client.send({"n": 1})
    reader = server if victim == "server" else client
    for n in range(opened):
        assert reader.recv(timeout=5) == {"n": n}
    with pytest.raises(WireError) as excinfo:
        reader.recv(timeout=5)
    assert excinfo.value.code == ExitCode.REFUSED
    assert "does not open with this session's key" in excinfo.value.message
    with pytest.raises(WireError):  # and the channel stays refused: no resynchronising
        reader.recv(timeout=5)
    client.close()
    server.close()


def test_a_frame_from_another_session_does_not_open(listener):
    first = Proxy(port_of(listener))
    client, server = pair(listener, first.port)
    client.send({"op": "down"})
    assert server.recv(timeout=5) == {"op": "down"}
    recorded = first.frames["c2s"][1]

    def transplant(direction: str, index: int, body: bytes, forward, _back) -> None:
        forward(frame(recorded if (direction, index) == ("c2s", 1) else body))

    second = Proxy(port_of(listener), transplant)
    client2, server2 = pair(listener, second.port)
    client2.send({"op": "status"})
    with pytest.raises(WireError) as excinfo:
        server2.recv(timeout=5)
    assert excinfo.value.code == ExitCode.REFUSED
    for channel in (client, server, client2, server2):
        channel.close()


def test_an_oversized_length_is_refused_before_reading_or_allocating(listener):
    def huge(direction: str, index: int, body: bytes, forward, _back) -> None:
        forward(
            struct.pack(">I", MAX_FRAME + 1) if (direction, index) == ("c2s", 1) else frame(body)
        )

    proxy = Proxy(port_of(listener), huge)
    client, server = pair(listener, proxy.port)
    client.send({"n": 0})
    tracemalloc.start()
    try:
        with pytest.raises(WireError) as excinfo:  # not TimeoutError: no wait for a body
            server.recv(timeout=30)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert excinfo.value.code == ExitCode.REFUSED and str(MAX_FRAME + 1) in excinfo.value.message
    assert peak < 1 << 20
    with pytest.raises(ValueError, match="limit"):
        client.send({"out": "x" * MAX_FRAME})
    client.close()
    server.close()


def test_recv_times_out_and_a_partial_frame_survives_the_timeout(listener):
    rest_may_go = threading.Event()

    def split(direction: str, index: int, body: bytes, forward, _back) -> None:
        if (direction, index) != ("s2c", 2):
            forward(frame(body))
            return
        whole = frame(body)
        forward(whole[:7])
        rest_may_go.wait(10)
        forward(whole[7:])

    proxy = Proxy(port_of(listener), split)
    client, server = pair(listener, proxy.port)
    with pytest.raises(TimeoutError):
        client.recv(timeout=0.1)  # nothing sent yet
    server.send({"n": 1})
    with pytest.raises(TimeoutError):
        client.recv(timeout=0.3)  # 7 bytes of it arrived; the reader keeps them
    rest_may_go.set()
    assert client.recv(timeout=5) == {"n": 1}
    client.close()
    server.close()


def test_a_connection_lost_mid_frame_is_an_error_and_close_wakes_a_reader(listener):
    def cut(direction: str, index: int, body: bytes, forward, _back) -> None:
        if (direction, index) == ("s2c", 2):
            forward(frame(body)[:9])
            raise EOFError  # the proxy hangs up on both sides
        forward(frame(body))

    proxy = Proxy(port_of(listener), cut)
    client, server = pair(listener, proxy.port)
    server.send({"n": 1})
    with pytest.raises(WireError) as excinfo:
        client.recv(timeout=5)
    assert excinfo.value.code == ExitCode.RENDEZVOUS and "middle" in excinfo.value.message
    client.close()
    server.close()

    client, server = pair(listener)
    woken = POOL.submit(client.recv)  # blocks for ever unless close() wakes it
    client.close()
    assert woken.result(timeout=10) is None
    with pytest.raises(WireError):
        client.send({"n": 2})
    server.close()


def test_a_silent_peer_cannot_hold_accept_beyond_its_timeout(listener):
    pending = serve_once(listener, timeout=0.5)
    silent = socket.create_connection(("127.0.0.1", port_of(listener)))
    start = time.monotonic()
    with pytest.raises(WireError) as excinfo:
        pending.result(timeout=10)
    assert 0.4 <= time.monotonic() - start < 10  # waits its 0.5 s, then gives up (not a hang)
    assert excinfo.value.code == ExitCode.RENDEZVOUS and "within 0.5s" in excinfo.value.message
    assert silent.recv(4096)  # it got the greeting, then
    assert silent.recv(4096) == b""  # the server hung up
    silent.close()


def test_a_trickling_peer_cannot_hold_accept_beyond_its_timeout(listener):
    pending = serve_once(listener, timeout=0.6)
    trickler = socket.create_connection(("127.0.0.1", port_of(listener)))
    stop = threading.Event()

    def trickle() -> None:
        for byte in plain({"nonce": "00" * 16, "proof": "00" * 32}):
            if stop.wait(0.05):
                return
            try:
                trickler.send(bytes([byte]))
            except OSError:
                return

    POOL.submit(trickle)
    start = time.monotonic()
    with pytest.raises(WireError) as excinfo:
        pending.result(timeout=10)
    stop.set()
    assert time.monotonic() - start < 10 and excinfo.value.code == ExitCode.RENDEZVOUS
    trickler.close()


@pytest.mark.parametrize(
    ("sent", "expected"),
    [
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "announced a message", id="http"),
        pytest.param(struct.pack(">I", 4097) + b"{}", "announced a message", id="over-4KiB"),
        pytest.param(frame(b"\xff\xfe not json"), "not a JSON object", id="not-json"),
        pytest.param(
            plain({"nonce": "zz" * 16, "proof": "00" * 32}),
            "not a launch-agent client",
            id="bad-hex",
        ),
        pytest.param(plain({"hello": "x"}), "not a launch-agent client", id="no-proof"),
    ],
)
def test_garbage_instead_of_a_handshake_is_refused(listener, sent, expected):
    pending = serve_once(listener)
    with socket.create_connection(("127.0.0.1", port_of(listener))) as peer:
        peer.sendall(sent)
        with pytest.raises(WireError) as excinfo:
            pending.result(timeout=10)
    assert excinfo.value.code == ExitCode.REFUSED and expected in excinfo.value.message


@pytest.mark.parametrize(
    ("greeting", "expected"),
    [
        pytest.param(b"SSH-2.0-OpenSSH_9.6\r\n", "announced a message", id="ssh-banner"),
        pytest.param(
            plain({"hello": "launch-agent/serve/2", "nonce": "00" * 16}),
            "same launch-agent version",
            id="newer",
        ),
        pytest.param(plain({"hello": "redis"}), "is not a launch-agent resident agent", id="other"),
    ],
)
def test_a_client_refuses_what_is_not_our_agent(listener, greeting, expected):
    def greet() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(greeting)
            try:
                conn.recv(1)
            except OSError:
                pass

    done = POOL.submit(greet)
    with pytest.raises(WireError) as excinfo:
        wire.connect("127.0.0.1", port_of(listener), KEY, 5.0)
    assert excinfo.value.code == ExitCode.REFUSED and expected in excinfo.value.message
    done.result(timeout=10)


def test_nothing_listening_is_a_rendezvous_error():
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = port_of(closed)
    with pytest.raises(WireError) as excinfo:
        wire.connect("127.0.0.1", port, KEY, 5.0)
    assert excinfo.value.code == ExitCode.RENDEZVOUS
    assert f"cannot connect to 127.0.0.1:{port}" in excinfo.value.message


def test_unpack_bytes_refuses_what_is_not_base64():
    assert unpack_bytes(pack_bytes(b"\x00\xff")) == b"\x00\xff"
    for bad in ("not base64!", 12, None):
        with pytest.raises(ValueError):
            unpack_bytes(bad)
