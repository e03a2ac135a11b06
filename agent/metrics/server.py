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

import errno
import ipaddress
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable, Collection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from agent.metrics.recorder import RunMetrics
from agent.node.hosting import is_ip
from agent.plan.run_plan import RunPlan
from agent.world import World

log = logging.getLogger("agent")
TEXTFILE = "metrics.prom"  # node-exporter's textfile collector reads *.prom
POLL = 0.1  # how often the server looks for close(): what closing adds to a run's end


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
            where, port, exc.strerror or exc, TEXTFILE,
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
    if ipaddress.ip_address(addr).is_loopback and not is_ip(master_addr):
        return "0.0.0.0"
    return addr


def write_textfile(exposition: object, log_dir: str) -> None:
    """LOG_DIR/metrics.prom, written then renamed (a textfile collector never reads half)."""
    from prometheus_client import write_to_textfile

    path = os.path.join(log_dir, TEXTFILE)
    try:
        write_to_textfile(path, exposition)  # type: ignore[arg-type]  # any collect() will do
    except OSError as exc:
        log.error("cannot write %s (%s)", path, exc.strerror or exc)


class MetricsServer:
    """GET /metrics on ADDR:PORT from a daemon thread (a thread per request: one slow client
    never holds the others); `close()` stops it and frees the port."""

    def __init__(self, render: Callable[[], bytes], addr: str, port: int) -> None:
        server_class = _V6Server if ":" in addr else _Server
        self.httpd = server_class((addr, port), _Handler)
        self.httpd.render = render
        self.addr, self.port = addr, int(self.httpd.server_address[1])
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": POLL}, name="metrics",
            daemon=True,
        )  # fmt: skip
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5.0)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    render: Callable[[], bytes]

    def handle_error(self, request: object, client_address: object) -> None:
        """One line, not socketserver's traceback on the job's console (a scraper that hung
        up mid-reply, or a bug of ours: the run goes on either way)."""
        failed = sys.exc_info()[1]
        log.warning("metrics: a scrape from %s failed: %r", client_address, failed)


class _V6Server(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    # Headers and body are two writes: with Nagle's algorithm the body waits for the scraper's
    # delayed ACK of the headers (40 ms on Linux) on every scrape.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if urlsplit(self.path).path != "/metrics":
            self._reply(404, b"not here: GET /metrics\n", "text/plain; charset=utf-8")
            return
        from prometheus_client.exposition import choose_encoder

        # The text format every scraper takes (the library's answer to no Accept header).
        self._reply(200, self.server.render(), choose_encoder("")[1])

    def _reply(self, code: int, body: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        """No access log on the job's console."""
