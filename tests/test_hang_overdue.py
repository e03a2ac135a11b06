"""Ranks waiting in a collective near its process group's timeout (pure tables), and a node's
watch asking real probe sockets: only silent ranks, again when a pending collective comes due,
overdue ranks told once."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from agent.hang.collective_watch import LOOK_AFTER, CollectiveWatch
from agent.hang.overdue import IDLE_LOOK, clause, near, next_look, overdue
from agent.hang.probe.sitecustomize import socket_path
from agent.hang.recorder import RankRecorder


def _recorder(groups) -> RankRecorder:
    """groups: (name, desc, entered, completed, created, timeout) per group."""
    return RankRecorder.from_json({"torch": True, "initialised": True, "groups": [
        {"name": name, "desc": desc, "ranks": [], "entered": entered, "completed": completed,
         "last": [{"seq": entered, "op": "all_reduce", "created_ns": created * 1e9,
                   "timeout_ms": timeout * 1000}]}
        for name, desc, entered, completed, created, timeout in groups
    ]})  # fmt: skip


@pytest.mark.parametrize(
    ("timeout", "at"),
    [(20.0, 10.0), (120.0, 60.0), (600.0, 540.0), (1800.0, 1740.0)],
)
def test_near_is_a_minute_before_or_half_for_short_timeouts(timeout, at):
    assert near(timeout) == at


WORLD_4 = ("0", "default_pg", 4, 3, 1000.0, 20.0)  # entered #4 at t=1000, 20 s timeout


@pytest.mark.parametrize(
    ("groups", "now", "overdue_ranks"),
    [
        ([WORLD_4], 1009.9, set()),  # 9.9 s of 20: not yet
        ([WORLD_4], 1010.0, {0}),  # near: half of a short timeout
        ([("0", "default_pg", 4, 4, 1000.0, 20.0)], 5000.0, set()),  # completed: nothing pending
        ([("0", "default_pg", 3, 3, 1000.0, 20.0)], 9e9, set()),  # asleep between collectives
        ([("0", "", 4, 3, 1000.0, 600.0)], 1539.0, set()),
        ([("0", "", 4, 3, 1000.0, 600.0)], 1540.0, {0}),  # a minute before NCCL's 10 min
    ],
)
def test_only_a_pending_collective_near_its_timeout_is_overdue(groups, now, overdue_ranks):
    assert {p.rank for p in overdue({0: _recorder(groups)}, now)} == overdue_ranks


def test_next_look_is_when_the_pending_collective_comes_due():
    assert next_look(_recorder([WORLD_4]), 1007.0) == 1010.0  # sooner than the idle look
    assert next_look(_recorder([WORLD_4]), 1001.0) == 1001.0 + IDLE_LOOK
    assert next_look(_recorder([WORLD_4]), 1012.0) == 1012.0 + IDLE_LOOK  # due already
    assert next_look(RankRecorder(False, False), 50.0) == 50.0 + IDLE_LOOK


def test_the_clause_names_the_collective_most_ranks_wait_in():
    pair = ("1", "", 1, 0, 1001.0, 20.0)
    recorders = {0: _recorder([WORLD_4]), 1: _recorder([WORLD_4]), 2: _recorder([WORLD_4]),
                 3: _recorder([pair])}  # fmt: skip
    found = overdue(recorders, 1016.0)
    assert {p.rank for p in found} == {0, 1, 2, 3}
    assert clause(found, 1016.0) == (
        "ranks 0-2 waited 16 s in all_reduce #4 on default_pg, near its 20 s timeout"
    )
    # past it: NCCL's watchdog fired but has not ended the ranks yet (it waits up to a minute)
    assert clause(found, 1023.0) == (
        "ranks 0-2 waited 23 s in all_reduce #4 on default_pg, past its 20 s timeout"
    )


class Probe:
    """A rank's probe socket (the path the agent asks) answering a fixed recorder."""

    def __init__(self, directory: str, pid: int, answer: dict) -> None:
        self.asked = 0
        self.answer = answer
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(socket_path(directory, pid))
        self.sock.listen(4)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self.asked += 1
                conn.sendall(json.dumps(self.answer).encode() + b"\n")


def test_the_watch_asks_silent_ranks_and_tells_overdue_ones_once(tmp_path):
    clock = [1001.0]
    stuck = _recorder([WORLD_4]).to_json()
    busy = _recorder([("0", "default_pg", 4, 4, 1000.0, 20.0)]).to_json()
    probes = {0: Probe(str(tmp_path), 100, stuck), 1: Probe(str(tmp_path), 101, busy),
              2: Probe(str(tmp_path), 102, stuck)}  # fmt: skip
    silent = {0: LOOK_AFTER, 1: LOOK_AFTER, 2: 0.5}  # rank 2 printed half a second ago
    told: list[tuple[int, ...]] = []
    watch = CollectiveWatch(str(tmp_path), lambda: [(0, 100), (1, 101), (2, 102)],
                            silent.__getitem__, told.append, wall=lambda: clock[0])  # fmt: skip
    watch.look()
    assert (probes[0].asked, probes[1].asked, probes[2].asked) == (1, 1, 0)
    assert told == []  # 1 s of 20: not near
    clock[0] = 1005.0
    watch.look()  # both are due again at 1006 (rank 0's collective at 1010)
    assert (probes[0].asked, probes[1].asked) == (1, 1)
    clock[0] = 1010.0
    watch.look()
    assert (probes[0].asked, probes[1].asked) == (2, 2) and told == [(0,)]
    clock[0] = 1016.0
    watch.look()
    assert told == [(0,)]  # said once


@pytest.mark.parametrize(
    ("silent", "pause"),
    [
        ({}, LOOK_AFTER),  # no rank: none can be due before a new one has been quiet that long
        ({0: 0.0}, LOOK_AFTER),  # it just printed
        ({0: 0.0, 1: 3.5}, 1.5),  # rank 1's silence reaches LOOK_AFTER first
        ({0: 4.9}, 1.0),  # never sooner than the tick
    ],
)
def test_the_watch_sleeps_until_a_rank_can_be_due(tmp_path, silent, pause):
    watch = CollectiveWatch(str(tmp_path), lambda: [(r, 100 + r) for r in silent],
                            silent.__getitem__, lambda ranks: None, wall=lambda: 1000.0)  # fmt: skip
    assert watch.look() == pytest.approx(pause)
    assert watch.looks == 0


def test_a_rank_asked_is_not_looked_at_again_before_its_next_look(tmp_path):
    """A silent rank without a probe (not Python, --no-flight-recorder) is asked, then looked at
    again IDLE_LOOK later: the watch sleeps that long, less what has passed."""
    clock = [1000.0]
    watch = CollectiveWatch(str(tmp_path), lambda: [(0, 100)], lambda rank: 60.0,
                            lambda ranks: None, wall=lambda: clock[0])  # fmt: skip
    assert watch.look() == pytest.approx(IDLE_LOOK) and watch.looks == 1
    clock[0] = 1003.0
    assert watch.look() == pytest.approx(IDLE_LOOK - 3.0) and watch.looks == 1
    clock[0] = 1000.0 + IDLE_LOOK
    assert watch.look() == pytest.approx(IDLE_LOOK) and watch.looks == 2
