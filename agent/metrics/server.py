"""`/metrics` for one run on node 0, and `LOG_DIR/metrics.prom` at its end.

One server per run: it opens when node 0 starts executing the run and closes when the run ends
(after metrics.prom is written), so a resident agent serves only while a run that asked for it
(`agent run --metrics-port P`) executes, and the port is free again between runs. Bind address:
`--metrics-addr`, else node 0's own address in the job (the one the other nodes reach its store
at, so a scraper on the cluster network reaches it too, and no other network does); where that
is not one of this host's addresses (NAT, a service name), every interface. A port that cannot
be bound is one warning: the run goes on without /metrics, metrics.prom is still written.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from agent.metrics import scrape
from agent.metrics.recorder import RunMetrics
from agent.node import hosting
from agent.plan.log_dir import METRICS, LogDir
from agent.plan.run_plan import RunPlan
from agent.world import World

log = logging.getLogger("agent")


def run_metrics(
    plan: RunPlan, world: World, run: int, lost: Callable[[], Collection[int]]
) -> RunMetrics:
    """Node 0's recorder of a run; with --metrics-port, served and written at its end
    (`RunMetrics.close`)."""
    options = plan.options
    metrics = RunMetrics(
        world.job_id,
        run,
        tracks_progress=options.progress_regex is not None,
        lost=lost,
        exported=options.metrics_port is not None,
    )
    if options.metrics_port is None:
        return metrics
    from agent.metrics.collector import Exposition  # prometheus_client: only when asked for

    exposition = Exposition(metrics)
    metrics.on_close(lambda: write_textfile(exposition, plan.log_dir))
    server = open_server(exposition.render, options.metrics_addr, options.metrics_port, world)
    if server is not None:
        metrics.on_close(server.close)
    return metrics


def open_server(
    render: Callable[[], bytes], addr: str | None, port: int, world: World
) -> MetricsServer | None:
    where = addr or job_address(world.master_addr)
    try:
        try:
            server = MetricsServer(render, where, port)
        except OSError as exc:
            if addr or where == "0.0.0.0" or exc.errno != errno.EADDRNOTAVAIL:
                raise
            server = MetricsServer(render, "0.0.0.0", port)  # not this host's address after all
    except OSError as exc:
        log.warning(
            "metrics: cannot listen on %s port %d (%s); no /metrics for this run (pass another "
            "--metrics-port); %s is still written at its end",
            where, port, exc.strerror or exc, METRICS,
        )  # fmt: skip
        return None
    shown = world.master_addr if server.addr in ("0.0.0.0", "::") else server.addr
    host = f"[{shown}]" if ":" in shown else shown
    log.info("metrics: http://%s:%d/metrics while this run lasts", host, server.port)
    return server


def job_address(master_addr: str) -> str:
    """Node 0's address as the job names it, or every interface where that is no address of
    ours to bind (a name that does not resolve; a host name Debian maps to 127.0.1.1 while the
    other nodes resolve it to the real one)."""
    try:
        found = socket.getaddrinfo(master_addr, None, socket.AF_INET, socket.SOCK_STREAM)
        addr = str(found[0][4][0])
    except (OSError, IndexError):
        return "0.0.0.0"
    if ipaddress.ip_address(addr).is_loopback and not hosting.is_ip(master_addr):
        return "0.0.0.0"
    return addr


def write_textfile(exposition: object, log_dir: str) -> None:
    """LOG_DIR/metrics.prom, written then renamed (a textfile collector never reads half)."""
    from prometheus_client import write_to_textfile

    path = LogDir(log_dir).metrics
    try:
        write_to_textfile(path, exposition)  # type: ignore[arg-type]  # any collect() will do
    except OSError as exc:
        log.error("cannot write %s (%s)", path, exc.strerror or exc)


@dataclass(frozen=True)
class Bounds:
    """What scrapers may take of node 0 together: ~1,000 idle connections once spent every
    descriptor the job needed to report a rank's failure."""

    connections: int = 64  # at once; a new one takes the place of the oldest still sending
    request_seconds: float = 3.0  # for the whole request head (a scraper sends it at once)
    request_bytes: int = 8192  # request line and headers (a scraper's are ~300)
    reply_seconds: float = 10.0  # for the scraper to take the reply
    fd_reserve: int = 64  # descriptors kept for the job's own work: the server never takes them


SHORT_OF_FDS = 0.1  # seconds without accepting after accept() failed (EMFILE): no busy loop
FDS_LOOK_EVERY = 0.2  # seconds between counts of the open descriptors (~2.5 ms at 2,000)
ACCEPTS_A_WAKE = 64  # a flood of connections never starves the requests being read
BACKLOG = 512


@dataclass
class _Request:
    peer: object
    deadline: float  # time.monotonic()
    head: bytes = b""


class MetricsServer:
    """GET /metrics on ADDR:PORT. One thread accepts and reads every request head (an idle
    connection costs a descriptor, no thread); each complete request is answered from a thread
    of its own (one slow scraper never holds the others). Connections, their time and bytes,
    and the process's descriptors are bounded (`Bounds`); `close()` ends every connection and
    thread and frees the port."""

    def __init__(
        self,
        render: Callable[[], bytes],
        addr: str,
        port: int,
        bounds: Bounds = Bounds(),
        free_fds: Callable[[], int | None] = hosting.free_fds,
    ) -> None:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((addr, port))
            self._listener.listen(BACKLOG)
            self._listener.setblocking(False)
            self._selector = selectors.DefaultSelector()
        except OSError:
            self._listener.close()
            raise
        self._selector.register(self._listener, selectors.EVENT_READ)
        self.addr, self.port = addr, int(self._listener.getsockname()[1])
        self._render, self._bounds, self._free_fds = render, bounds, free_fds
        self._reading: dict[socket.socket, _Request] = {}  # oldest first: by deadline
        self._lock = threading.Lock()  # guards _replying
        self._replying: dict[socket.socket, threading.Thread] = {}
        self._threads: list[threading.Thread] = []  # repliers, those ending included
        self._accept_again = 0.0  # time.monotonic() to accept again after accept() failed
        # the last count: when, free then, held then
        self._fds: tuple[float, int | None, int] = (-FDS_LOOK_EVERY, None, 0)
        self._short = ""  # why connections are turned away now (told once per shortage)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the loop's select()
        self._thread.join(5.0)  # it closes what it reads from, the listener last
        with self._lock:
            for conn in self._replying:
                _hang_up(conn)  # its thread's send returns at once; that thread closes it
        for thread in self._threads:
            thread.join(5.0)

    def _loop(self) -> None:
        try:
            while not self._closed.is_set():
                for key, _ in self._selector.select(self._timeout()):
                    if key.fileobj is self._listener:
                        self._accept()
                    else:
                        self._read(key.fileobj)  # type: ignore[arg-type]  # ours: sockets
                self._expire()
        finally:
            for conn in self._reading:
                conn.close()
            self._reading.clear()
            self._selector.close()
            self._listener.close()

    def _timeout(self) -> float | None:
        """Until the oldest request's deadline or accepting again, whichever is first."""
        now = time.monotonic()
        if self._accept_again:
            if now >= self._accept_again:
                self._accept_again = 0.0
                self._selector.register(self._listener, selectors.EVENT_READ)
            else:
                return self._accept_again - now
        oldest = next(iter(self._reading.values()), None)
        return None if oldest is None else max(0.0, oldest.deadline - now)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._reading:
            conn, request = next(iter(self._reading.items()))
            if request.deadline > now:
                return
            self._drop(conn)  # silent or trickling: no complete request in time

    def _accept(self) -> None:
        for _ in range(ACCEPTS_A_WAKE):
            try:
                conn, peer = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if not self._closed.is_set():  # EMFILE and the like: the peer waits in the backlog
                    self._tell_short(f"cannot accept a connection: {exc.strerror or exc}")
                    self._selector.unregister(self._listener)
                    self._accept_again = time.monotonic() + SHORT_OF_FDS
                return
            self._admit(conn, peer)

    def _admit(self, conn: socket.socket, peer: object) -> None:
        """Read `conn`'s request. At the cap, or short of descriptors, it takes the place of the
        oldest connection still sending its request (an idle crowd cannot keep a scraper out,
        and the server never grows into the reserve); with none such (every one is being
        answered) it is turned away."""
        with self._lock:
            held = len(self._reading) + len(self._replying)
        short = self._short_of_fds(held)
        if short or held >= self._bounds.connections:
            if not self._reading:
                _send_now(conn, scrape.CROWDED)
                conn.close()
                return
            self._drop(next(iter(self._reading)))
        conn.setblocking(False)
        deadline = time.monotonic() + self._bounds.request_seconds
        self._reading[conn] = _Request(peer, deadline)
        self._selector.register(conn, selectors.EVENT_READ)

    def _short_of_fds(self, held: int) -> bool:
        """Fewer free descriptors than the reserve: counted at most every FDS_LOOK_EVERY (the
        count costs ~1 µs a descriptor), in between less what this server took since."""
        now = time.monotonic()
        looked, free, held_then = self._fds
        if now - looked >= FDS_LOOK_EVERY:
            looked, free, held_then = self._fds = (now, self._free_fds(), held)
        if free is None:
            return False
        free -= held - held_then
        if free >= self._bounds.fd_reserve:
            self._short = ""
            return False
        self._tell_short(f"{free} descriptors left, {self._bounds.fd_reserve} kept for the job")
        return True

    def _tell_short(self, why: str) -> None:
        if not self._short:  # once per shortage
            log.warning(
                "metrics: %s; /metrics takes no more connections until descriptors are freed "
                "(the open-files limit, `ulimit -n`, is nearly spent)",
                why,
            )
        self._short = why

    def _read(self, conn: socket.socket) -> None:
        request = self._reading[conn]
        try:
            chunk = conn.recv(self._bounds.request_bytes + 1 - len(request.head))
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:  # the peer hung up
            self._drop(conn)
            return
        request.head += chunk
        if scrape.complete(request.head):
            self._reply(conn, request, lambda: scrape.answer(request.head, self._render))
        elif len(request.head) > self._bounds.request_bytes:
            self._reply(conn, request, lambda: scrape.TOO_LARGE)

    def _drop(self, conn: socket.socket) -> None:
        del self._reading[conn]
        self._selector.unregister(conn)
        conn.close()

    def _reply(self, conn: socket.socket, request: _Request, answer: Callable[[], bytes]) -> None:
        del self._reading[conn]
        self._selector.unregister(conn)
        thread = threading.Thread(
            target=self._send, args=(conn, request, answer), name="metrics-scrape", daemon=True
        )
        with self._lock:
            self._replying[conn] = thread
        self._threads = [t for t in self._threads if t.is_alive()]
        self._threads.append(thread)
        thread.start()

    def _send(self, conn: socket.socket, request: _Request, answer: Callable[[], bytes]) -> None:
        try:
            reply = answer()
            conn.settimeout(self._bounds.reply_seconds)
            # One send, but a body over one segment would still wait for the scraper's delayed
            # ACK (40 ms on Linux) under Nagle's algorithm.
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.sendall(reply)
            if reply is scrape.TOO_LARGE:
                _drain(conn, request.deadline)
        except OSError:  # a peer that hung up or was too slow: nothing to say on the console
            pass
        except Exception as exc:  # a bug of ours: one line, and the run goes on
            log.warning("metrics: a scrape from %s failed: %r", request.peer, exc)
        finally:
            with self._lock:
                del self._replying[conn]
            conn.close()


def _hang_up(conn: socket.socket) -> None:
    """End a connection another thread owns: its send returns at once; that thread closes it
    (closing here could close a descriptor number the process reused meanwhile)."""
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)


def _drain(conn: socket.socket, deadline: float) -> None:
    """Read what the peer still sends until it closes or `deadline` passes: closing with unread
    bytes would reset the connection, and the peer would lose the reply before reading it."""
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_WR)
        while (left := deadline - time.monotonic()) > 0:
            conn.settimeout(left)
            if not conn.recv(65536):
                return


def _send_now(conn: socket.socket, data: bytes) -> None:
    """What fits in the socket's buffer now, never waiting on the peer."""
    with contextlib.suppress(OSError):
        conn.setblocking(False)
        conn.send(data)
