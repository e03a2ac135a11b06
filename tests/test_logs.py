"""LogRouter with real pipes: every byte reaches the rank file, console or not (copy and splice)."""

from __future__ import annotations

import hashlib
import io
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from agent.console.router import LogRouter, Stream

# Writes 4 MiB of pseudo-random bytes (newlines included) in uneven chunks, then a partial line.
WRITER = r"""
import hashlib, os, sys
data = b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(1 << 17))
data = data.replace(b"\x00", b"\n") + b"no newline at the end"
i = 0
while i < len(data):
    step = 1 + (i * 7919) % 300000
    os.write(1, data[i:i + step]); i += step
sys.stdout.write(hashlib.sha1(data).hexdigest()); sys.stdout.flush()
"""


@pytest.mark.parametrize("to_console", [False, True])
def test_every_byte_reaches_the_file(tmp_path, to_console) -> None:
    console_out, console_err = io.BytesIO(), io.BytesIO()
    router = LogRouter(console_out, console_err, console_depth=1 << 16)
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    path = tmp_path / "rank-00000.out"
    state = router.add(
        os.dup(proc.stdout.fileno()), Stream(0, "out", str(path), b"h:0: ", to_console)
    )
    proc.stdout.close()  # the router owns its duplicate, as in agent.workers
    assert proc.wait(60) == 0
    assert state.done.wait(30)
    router.close()
    written = path.read_bytes()
    body, digest = written[:-40], written[-40:].decode()
    assert hashlib.sha1(body).hexdigest() == digest
    assert state.bytes == len(written)
    shown = console_out.getvalue()
    if to_console:
        lines = shown.split(b"\n")[:-1]
        assert all(line.startswith(b"h:0: ") for line in lines)
        assert b"\n".join(line[len(b"h:0: ") :] for line in lines) == written
    else:
        assert shown == b"" and state.splice  # moved by splice(2) all along, never fell back


class _StuckConsole(io.BytesIO):
    """A terminal that stops reading until released, like a paused ssh session."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def write(self, data) -> int:
        self.release.wait(30)
        return super().write(data)


def test_a_stuck_console_drops_whole_chunks_counts_them_and_keeps_the_file_complete(
    tmp_path,
) -> None:
    console, errors = _StuckConsole(), io.BytesIO()
    router = LogRouter(console, errors, console_depth=2)
    read_end, write_end = os.pipe()
    path = tmp_path / "rank-00004.out"
    state = router.add(read_end, Stream(4, "out", str(path), b"h:4: ", True))
    sent = b""
    for chunk in range(20):
        data = b"".join(b"chunk %d line %d\n" % (chunk, i) for i in range(50))
        os.write(write_end, data)
        sent += data
        deadline = time.monotonic() + 10
        while state.bytes < len(sent):  # wait until the router has read it: one chunk per read
            assert time.monotonic() < deadline, "router stopped reading"
            time.sleep(0.001)
    os.close(write_end)
    assert state.done.wait(10)  # the rank file is finished while the console is still stuck
    assert path.read_bytes() == sent
    console.release.set()
    router.close()
    shown = console.getvalue().splitlines()
    dropped = [
        int(m) for m in re.findall(rb"console too slow: (\d+) lines of rank 4", errors.getvalue())
    ]
    assert dropped and sum(dropped) > 0
    assert len(shown) + sum(dropped) == 20 * 50
    assert all(line.startswith(b"h:4: chunk ") for line in shown)


def test_several_step_lines_in_one_read_count_the_latest_step(tmp_path) -> None:
    """Lines written together arrive in one read: the rank is at the last step of the chunk."""
    from agent.plan.options import progress_pattern

    router = LogRouter(io.BytesIO(), io.BytesIO(), progress=progress_pattern(r"step (?P<step>\d+)"))
    read_end, write_end = os.pipe()
    state = router.add(read_end, Stream(0, "out", str(tmp_path / "r.out"), b"h:0: ", False))
    os.write(write_end, b"step 1\n")
    os.write(write_end, b"step 2\nstep 3\nstep 4\n")  # one write, one chunk
    os.close(write_end)
    assert state.done.wait(30)
    router.close()
    clock = router.clocks()[0]
    assert clock.step == 4


def _fed_in_reads(tmp_path, pattern: str, reads: list[bytes]) -> list[tuple[int | None, int]]:
    """Feeds a router one write per read (each read waited for), then EOF; after each read and
    after the end, rank 0's clock as (step, progress lines seen)."""
    from agent.plan.options import progress_pattern

    router = LogRouter(io.BytesIO(), io.BytesIO(), progress=progress_pattern(pattern))
    read_end, write_end = os.pipe()
    state = router.add(read_end, Stream(0, "out", str(tmp_path / "r.out"), b"h:0: ", True))
    seen, sent = [], 0
    for data in reads:
        os.write(write_end, data)
        sent += len(data)
        deadline = time.monotonic() + 10
        while state.bytes < sent:  # read and handled: the next write is a read of its own
            assert time.monotonic() < deadline, "router stopped reading"
            time.sleep(0.001)
        clock = router.clocks()[0]
        seen.append((clock.step, clock.lines))
    os.close(write_end)
    assert state.done.wait(30)
    router.close()
    clock = router.clocks()[0]
    return [*seen, (clock.step, clock.lines)]


STEP = r"step (?P<step>\d+)"


@pytest.mark.parametrize(
    ("pattern", "reads", "clock"),
    [
        # an unbuffered print('step', 1): four writes, one line, counted once at its end
        (STEP, [b"step", b" ", b"1", b"\n"], [(None, 0)] * 3 + [(1, 1)] * 2),
        # a line that straddles two reads, then a whole one in the second
        (STEP, [b"step 1\nste", b"p 2\nstep 3\n"], [(1, 1), (3, 2), (3, 2)]),
        # the last line has no newline: counted when the pipe ends
        (STEP, [b"step 4\nstep 5"], [(4, 1), (5, 2)]),
        # a progress bar redraws its line with \r: each redraw is a line
        (STEP, [b"\r 10% step 6", b"\r 20% step 7", b"\r"], [(None, 0), (6, 1), (7, 2), (7, 2)]),
        # ^ is a line's start, also for a line begun in an earlier read
        (
            "^" + STEP,
            [b"x step 1\nst", b"ep 2\n", b"x step 3\n"],
            [(None, 0), (2, 1), (2, 1), (2, 1)],
        ),
        # without a step group the first match of the read counts: one line, one tick
        (r"loss=", [b"lo", b"ss=1\nloss=2\n"], [(None, 0), (None, 1), (None, 1)]),
        # a 100 KiB line without an end: searched once it passes 64 KiB, not held forever
        (STEP, [b"step 8 " + b"." * 100_000], [(8, 1), (8, 1)]),
    ],
    ids=[
        "print-pieces",
        "straddle",
        "unended-last",
        "carriage-return",
        "anchored",
        "no-step",
        "long-line",
    ],  # fmt: skip
)
def test_a_progress_line_counts_whole_however_the_reads_cut_it(tmp_path, pattern, reads, clock):
    assert _fed_in_reads(tmp_path, pattern, reads) == clock


def test_a_closed_router_leaves_no_descriptor_or_thread(tmp_path) -> None:
    """A router per attempt: a resident node 0 makes one per run, so each must give back its
    wake pipe, selector and threads (2 descriptors an attempt once ran a node out of them)."""

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd")) - 1  # less listdir's own

    fds, threads = open_fds(), threading.active_count()
    for attempt in range(5):
        router = LogRouter(io.BytesIO(), io.BytesIO())
        read_end, write_end = os.pipe()
        router.add(read_end, Stream(0, "out", str(tmp_path / f"a{attempt}.out"), b"h:0: ", True))
        os.write(write_end, b"a line\n")
        os.close(write_end)  # the rank exits
        router.close()
        assert (tmp_path / f"a{attempt}.out").read_bytes() == b"a line\n"
    assert open_fds() == fds
    assert threading.active_count() == threads
