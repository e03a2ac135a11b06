"""One scrape: when its request head is complete, and the whole reply to it (pure).

HTTP/1.0, one request a connection: what http.server answered before, and what every scraper
takes. The server (agent.metrics.server) reads the head within its bounds of time and size.
"""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus
from urllib.parse import urlsplit

TEXT = "text/plain; charset=utf-8"


def complete(head: bytes) -> bool:
    return b"\r\n\r\n" in head or b"\n\n" in head


def answer(head: bytes, render: Callable[[], bytes]) -> bytes:
    """The whole reply to a request head: GET /metrics renders; anything else says what is."""
    parts = head.split(b"\n", 1)[0].split()
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
        return reply(400, b"bad request: GET /metrics\n", TEXT)
    method, target = parts[0], parts[1].decode("latin-1")
    if method != b"GET":
        return reply(405, b"only GET /metrics\n", TEXT, allow="GET")
    if urlsplit(target).path != "/metrics":
        return reply(404, b"not here: GET /metrics\n", TEXT)
    from prometheus_client.exposition import choose_encoder

    # The text format every scraper takes (the library's answer to no Accept header).
    return reply(200, render(), choose_encoder("")[1])


def reply(code: int, body: bytes, kind: str, allow: str = "") -> bytes:
    """Status line, headers and body as one buffer: one send, so Nagle's algorithm never holds
    the body back for the scraper's delayed ACK of the headers."""
    lines = [
        f"HTTP/1.0 {code} {HTTPStatus(code).phrase}",
        f"Content-Type: {kind}",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if allow:
        lines.append(f"Allow: {allow}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + body


TOO_LARGE = reply(431, b"request head too large\n", TEXT)
CROWDED = reply(503, b"too many scrapes at once; try again\n", TEXT)
