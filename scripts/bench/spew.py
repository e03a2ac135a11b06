"""Rank for the tee benchmark: writes a known byte stream to stdout as fast as it can.

    spew.py lines COUNT SIZE DIR [ROUNDS]   COUNT lines of SIZE bytes (newline included), one write() each
    spew.py bulk  TOTAL CHUNK DIR [ROUNDS]  TOTAL bytes without a newline, in writes of CHUNK bytes
Each round writes DIR/t0-<RANK>-<round> (time.time() just before its first write) and
DIR/t1-<RANK>-<round> (after its last flush). The content depends on the rank, so a mixed-up or
lost byte shows in the hash.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path


def line_template(rank: int, size: int) -> str:
    head = f"rank {rank:03d} line %09d "
    return head + "x" * (size - len(head % 0) - 1) + "\n"


def bulk_chunk(rank: int, chunk: int) -> bytes:
    seed = f"<rank {rank:03d} no newline here>".encode()
    return (seed * (chunk // len(seed) + 1))[:chunk]


def chunks(mode: str, count: int, size: int, rank: int) -> Iterator[bytes]:
    """The exact bytes the rank writes, in pieces (for the bench's expected hash)."""
    if mode == "lines":
        template = line_template(rank, size)
        step = 10_000
        for start in range(0, count, step):
            yield "".join(template % i for i in range(start, min(count, start + step))).encode()
    else:
        piece = bulk_chunk(rank, size)
        full, rest = divmod(count, size)
        for _ in range(full):
            yield piece
        if rest:
            yield piece[:rest]


def expected(mode: str, count: int, size: int, rank: int, rounds: int = 1) -> tuple[int, str]:
    """(size, sha1) of everything one rank writes in `rounds` rounds."""
    digest, total = hashlib.sha1(), 0
    kept = list(chunks(mode, count, size, rank)) if mode == "lines" and rounds > 1 else None
    for _ in range(rounds):
        for piece in kept if kept is not None else chunks(mode, count, size, rank):
            digest.update(piece)
            total += len(piece)
    return total, digest.hexdigest()


def file_digest(path: Path) -> tuple[int, str]:
    digest, total = hashlib.sha1(), 0
    with open(path, "rb") as f:
        while piece := f.read(1 << 20):
            digest.update(piece)
            total += len(piece)
    return total, digest.hexdigest()


def write_round(mode: str, count: int, size: int, rank: int) -> None:
    out = sys.stdout
    if mode == "lines":
        template, write = line_template(rank, size), out.write
        for i in range(count):
            write(template % i)
        out.flush()
    else:
        piece, write = bulk_chunk(rank, size), out.buffer.write
        full, rest = divmod(count, size)
        for _ in range(full):
            write(piece)
        if rest:
            write(piece[:rest])
        out.buffer.flush()


def main(argv: list[str]) -> int:
    mode, count, size, where = argv[0], int(argv[1]), int(argv[2]), Path(argv[3])
    rounds = int(argv[4]) if len(argv) > 4 else 1
    rank = int(os.environ.get("RANK", "0"))
    for r in range(rounds):
        (where / f"t0-{rank}-{r}").write_text(repr(time.time()))
        write_round(mode, count, size, rank)
        (where / f"t1-{rank}-{r}").write_text(repr(time.time()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
