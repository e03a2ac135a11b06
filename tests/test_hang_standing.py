"""A node's standing and node 0's judges over them (pure tables), and the coordinator reading
sealed standings from a real in-process store: ranks that exited are done, not quiet; an
outsider's counter bump, deletion, garbage or replayed record never decides a hang."""

from __future__ import annotations

import time

import pytest
from store_peers import node_scope, outsider, store_server

from agent.hang.desk import StackDesk
from agent.hang.judge import HangJudge
from agent.hang.standing import (
    Ended,
    RankEnd,
    Standing,
    job_line,
    skew_line,
    still_running,
    stillness,
)
from agent.hang.watch import RECHECK_DESK, WAKE, HangWatch
from agent.metrics.recorder import RunMetrics
from agent.node.failure import Kind
from agent.node.scope import Scope
from agent.node.trust import JobKeys
from agent.plan.options import resolve
from agent.run.coordinator import Coordinator


def _standing(agent: int, seq: int = 1, live=(), ended=(), quiet: bool = False) -> Standing:
    return Standing(agent, agent, f"h{agent}", seq, tuple(live), tuple(ended), quiet)


ACTIVE, QUIET, DONE = "active", "quiet", "done"


def _of(states: dict[int, str]) -> dict[int, Standing]:
    return {
        a: _standing(a, 1, () if s == DONE else (a,), (RankEnd(a, 0, 1.0),) if s == DONE else (),
                     s == QUIET)
        for a, s in states.items()
    }  # fmt: skip


@pytest.mark.parametrize(
    ("states", "still", "quiet"),
    [
        ({0: QUIET, 1: QUIET}, True, {0, 1}),
        ({0: DONE, 1: QUIET}, True, {1}),  # node 0's ranks exited: done, not quiet
        ({0: QUIET, 1: DONE, 2: QUIET}, True, {0, 2}),  # a middle node done
        ({0: DONE, 1: ACTIVE}, False, set()),
        ({0: DONE, 1: DONE}, False, set()),  # every rank ended: the attempt is ending, no hang
        ({0: QUIET}, False, set()),  # node 1 never heard from: it may be starting
    ],
)
def test_stillness_counts_exited_ranks_as_done(states, still, quiet):
    got = stillness([0, 1] if len(states) < 3 else [0, 1, 2], _of(states), 100.0, 4.0)
    assert got.still is still and set(got.quiet) == quiet


@pytest.mark.parametrize(
    ("now", "still"),
    [
        (4.9, False),  # rank 0 ended at 1.0: the ranks that waited for it get T from then
        (5.0, True),
    ],
)
def test_an_exit_is_progress_for_the_ranks_still_running(now, still):
    assert stillness([0, 1], _of({0: DONE, 1: QUIET}), now, 4.0).still is still


def test_the_exited_clause_groups_ranks_by_how_they_ended():
    ends = [RankEnd(1, 0, 43200.0), RankEnd(0, 0, 43205.0), RankEnd(4, -9, 43300.0)]
    clause = Ended.of([_standing(0, ended=ends)]).clause(local=False)
    assert clause == "ranks 0-1 exited 0 at 12:00:00; rank 4 killed by signal 9 at 12:01:40"
    assert Ended.of([_standing(0)]).clause() == ""


@pytest.mark.parametrize(
    ("standings", "now", "line"),
    [
        ([_standing(0, ended=[RankEnd(0, 0, 100.0)]), _standing(1, live=[1])], 399.0, ""),
        (
            [_standing(0, ended=[RankEnd(0, 0, 100.0)]), _standing(1, live=[1])],
            400.0,
            "exit skew: rank 0 exited 0 300 s ago; rank 1 on h1 still runs (--hang-warning): "
            "see where with python -m agent stacks logs/7.0",
        ),
        (
            [_standing(0, ended=[RankEnd(0, 0, 100.0), RankEnd(1, 0, 90.0)]),
             _standing(1, live=[2, 3]), _standing(2, live=[4])],
            400.0,
            "exit skew: ranks 0-1 exited 0 310 s ago; ranks 2-4 on h1, h2 still run "
            "(--hang-warning): see where with python -m agent stacks logs/7.0",
        ),
        ([_standing(0, ended=[RankEnd(0, 1, 100.0)]), _standing(1, live=[1])], 900.0, ""),
        ([_standing(0, ended=[RankEnd(0, 0, 100.0)])], 900.0, ""),  # nothing runs on
    ],
)  # fmt: skip
def test_the_exit_skew_line(standings, now, line):
    assert skew_line(standings, now, 300.0, "logs/7.0") == line


@pytest.mark.parametrize(
    "data",
    [
        None, [], {"agent": 0}, {"agent": True, "node_rank": 0, "seq": 1, "live": [], "ended": []},
        {"agent": 0, "node_rank": 0, "seq": 1, "live": ["x"], "ended": []},
        {"agent": 0, "node_rank": 0, "seq": 1, "live": [], "ended": [[0, 0]]},
        {"agent": 0, "node_rank": 0, "seq": 1, "live": [], "ended": [[0, 0, "t"]]},
        {"agent": 0, "node_rank": 0, "seq": 1, "live": list(range(5000)), "ended": []},
    ],
)  # fmt: skip
def test_a_standing_that_is_not_one_is_none(data):
    assert Standing.from_json(data) is None


def test_a_standing_round_trips():
    s = _standing(3, 7, live=[6, 7], ended=[RankEnd(5, 0, 12.5)], quiet=True)
    assert Standing.from_json(s.to_json()) == s
    assert still_running([s, _standing(1, live=[2])]) == [(2, "h1"), (6, "h3"), (7, "h3")]


# -- over a real store (torch's server, our client; an outsider with torch's own client) ----------
class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


JOB = (b"standing-test", "job", "0")  # secret, job, step
KEYS = JobKeys.derive(*JOB)


@pytest.fixture()
def server():
    return store_server()


def _scope(server, agent: int) -> Scope:
    return node_scope(server, agent, KEYS)


def _coordinator(server, clock: Clock | None = None, nodes=(0, 1)) -> Coordinator:
    scope = _scope(server, 0)
    coordinator = Coordinator(
        scope, nodes=nodes, options=resolve({}, {"hang_timeout": 4}), log_dir="/nonexistent",
        attempt=0, node_rank=0, host="h0", report=lambda record: record, metrics=RunMetrics(),
        clock=clock or time.monotonic,
    )  # fmt: skip
    desk = StackDesk(scope, nodes, "h0", list)
    desk.start()
    coordinator.desk = desk
    coordinator.hang = HangJudge(desk, scope, timeout=4, log_dir="/nonexistent", attempt=0,
                                 node_rank=0, host="h0", clock=coordinator.clock)  # fmt: skip
    return coordinator


def _watch(
    server, agent: int, clock: Clock, silence: list[float] | None = None, desk=None
) -> HangWatch:
    """A node's watch; with `silence` (seconds its live ranks have been quiet, as the test
    sets it) it also answers node 0's recheck through its node's desk (`desk`: node 0's, the
    coordinator's; else one of its own)."""
    scope = _scope(server, agent)
    watch = HangWatch(scope, agent=agent, node_rank=agent, host=f"h{agent}", timeout=4,
                      clock=clock)  # fmt: skip
    if silence is not None:
        if desk is None:
            desk = StackDesk(scope, (0, 1), f"h{agent}", list)
            desk.start()
        desk.relays[RECHECK_DESK] = lambda number, request: watch.recheck(silence[0])
    return watch


def test_the_coordinator_keeps_the_newest_record_past_deletion_garbage_and_replay(server):
    clock, evil = Clock(), outsider(server)
    coordinator = _coordinator(server)
    side = coordinator.scope
    node1 = _watch(server, 1, clock)
    node1.started([1])
    node1.tick(10.0)  # quiet: seq 2
    key = side.key("standing/1")
    old = evil.get(key)
    node1.tick(0.0)  # speaks again: seq 3
    assert coordinator.read_standings(side, clock())[1].quiet is False
    for tamper in (lambda: evil.set(key, old), lambda: evil.set(key, b"garbage"),
                   lambda: evil.delete_key(key)):  # fmt: skip
        tamper()
        evil.add(side.key(WAKE), 1)
        seen = coordinator.read_standings(side, clock())[1]
        assert (seen.seq, seen.quiet) == (3, False)  # what was known stands
    coordinator.close()


def test_counters_only_wake_the_coordinator(server):
    """An outsider's `add` on the wake counter makes node 0 read, never decide; a counter set
    back (add -1000) delays a read by SLOW_LOOK at most."""
    clock, evil = Clock(), outsider(server)
    coordinator = _coordinator(server)
    side = coordinator.scope
    nodes = [_watch(server, a, clock) for a in (0, 1)]
    for a, node in enumerate(nodes):
        node.started([a])
    wake = evil.add(side.key(WAKE), 5)  # bumped: every standing read, nobody quiet
    assert coordinator.hang.look(coordinator.read_standings(side, clock())) is None
    evil.add(side.key(WAKE), -1000)
    for node in nodes:
        node.tick(10.0)  # both quiet now; the counter they bump stays far below where it was
    evil.add(side.key(WAKE), wake - evil.add(side.key(WAKE), 0))  # set back to the last read
    assert not coordinator.read_standings(side, clock())[0].quiet  # no wake: not read yet
    clock.now += 5.0  # SLOW_LOOK
    seen = coordinator.read_standings(side, clock())
    assert seen[0].quiet and seen[1].quiet
    coordinator.close()


def test_ranks_that_end_together_are_posted_in_one_standing(server):
    """A node's 8 ranks end at once (a teardown): one record with every exit, not 8 posts."""
    clock = Clock()
    watch = _watch(server, 1, clock)
    scope = _scope(server, 1)
    watch.started([4, 5, 6])
    watch.exited(4, 0, 1.0, post=False)
    watch.exited(5, 0, 1.0, post=False)
    assert (
        Standing.from_json(
            KEYS.unseal(server.get(scope.key("standing/1")), scope.key("standing/1"), "standing")
        ).seq
        == 1
    )  # held back
    watch.exited(6, 0, 1.0)
    posted = Standing.from_json(
        KEYS.unseal(server.get(scope.key("standing/1")), scope.key("standing/1"), "standing")
    )
    assert (posted.seq, posted.live, [e.rank for e in posted.ended]) == (2, (), [4, 5, 6])
    watch.flush()  # nothing held back: no post
    assert server.add(scope.key(WAKE), 0) == 2


def test_a_wake_reads_the_standing_of_the_node_it_names_and_the_slow_look_reads_all(server):
    """A teardown posts 8 standings a node: each wake reads the nodes its keys name, not all N.
    Garbage over node 2's record is only seen (node 2 unsure) when every record is read."""
    clock, evil = Clock(), outsider(server)
    coordinator = _coordinator(server, clock, nodes=(0, 1, 2))
    side = coordinator.scope
    nodes = [_watch(server, a, clock) for a in (0, 1, 2)]
    for a, node in enumerate(nodes):
        node.started([a])
    assert coordinator.read_standings(side, clock()).keys() == {0, 1, 2}  # the first: all
    evil.set(side.key("standing/2"), b"garbage")
    nodes[1].tick(10.0)  # quiet: wakes node 0, naming node 1
    seen = coordinator.read_standings(side, clock())
    assert seen[1].quiet and coordinator.unsure == frozenset()  # node 2's record not read
    clock.now += 5.0  # SLOW_LOOK: every record, node 2's garbage among them
    coordinator.read_standings(side, clock())
    assert coordinator.unsure == frozenset({2}) and seen[2].seq == 1  # what was known stands
    coordinator.close()


def test_the_slow_look_opens_only_the_standings_that_changed(server):
    """The slow look reads all N every SLOW_LOOK s while the job runs: a record whose bytes are
    those opened last time is not opened again (4,096 nodes: 2-4 % of node 0's core). One that
    does not open is not remembered: it is tried, and its node unsure, at every look."""
    opened: list[str] = []

    class Counted(JobKeys):
        def unseal(self, data, key, what):
            opened.append(key)
            return super().unseal(data, key, what)

    clock, evil = Clock(), outsider(server)
    coordinator = _coordinator(server, clock, nodes=(0, 1, 2))
    side = node_scope(server, 0, Counted.derive(*JOB))  # node 0's scope, counting
    nodes = [_watch(server, a, clock) for a in (0, 1, 2)]
    for a, node in enumerate(nodes):
        node.started([a])
    assert coordinator.read_standings(side, clock()).keys() == {0, 1, 2} and len(opened) == 3
    evil.set(side.key("standing/2"), b"garbage")
    for news, quiet in ((False, False), (True, True), (False, True)):
        if news:
            nodes[1].tick(10.0)  # node 1's ranks fall quiet: a new record
        opened.clear()
        clock.now += 5.0  # SLOW_LOOK: every record read
        seen = coordinator.read_standings(side, clock())
        assert seen[1].quiet is quiet and coordinator.unsure == frozenset({2})
        expected = {side.key("standing/2")} | ({side.key("standing/1")} if news else set())
        assert sorted(opened) == sorted(expected)
    coordinator.close()


@pytest.mark.parametrize("tamper", ["bump", "garble"])
def test_an_outsiders_wake_keys_delay_a_read_never_lose_it(server, tamper):
    """A bump with no key (the coordinator waits GAP_WAIT for it, then reads every record) or
    garbage over a node's wake key (every record read at once): the node's news still comes."""
    from agent.run.coordinator import GAP_WAIT

    clock, evil = Clock(), outsider(server)
    coordinator = _coordinator(server, clock)
    side = coordinator.scope
    node1 = _watch(server, 1, clock)
    node1.started([1])
    coordinator.read_standings(side, clock())
    if tamper == "bump":
        evil.add(side.key(WAKE), 1)
    node1.tick(10.0)  # quiet
    if tamper == "garble":
        count = evil.add(side.key(WAKE), 0)
        evil.set(side.key(f"{WAKE}/{count}"), b"garbage")
        assert coordinator.read_standings(side, clock())[1].quiet
    else:
        assert not coordinator.read_standings(side, clock())[1].quiet  # its key never comes
        clock.now += GAP_WAIT
        assert coordinator.read_standings(side, clock())[1].quiet
    coordinator.close()


def test_a_hang_is_called_on_every_running_node_answering_still(server):
    clock = Clock()
    coordinator = _coordinator(server, clock)
    side = coordinator.scope
    node1 = _watch(server, 1, clock, [10.0])
    node0 = _watch(server, 0, clock, [0.0], coordinator.desk)
    node0.started([0])
    node1.started([1])
    node0.exited(0, 0, time.time() - 10)  # node 0's rank is done: not quiet, done
    node1.tick(10.0)  # node 1 quiet
    judge = coordinator.hang
    record = judge.look(coordinator.read_standings(side, clock()))
    assert record is not None and record.kind is Kind.HANG and judge.rechecks == 1
    assert record.how.startswith("hang: no progress for 4 s from the 1 rank still running; ")
    assert "; rank 0 exited 0 at " in record.how, record.how
    assert judge.look(coordinator.read_standings(side, clock())) is None  # once
    coordinator.close()


def test_a_replayed_quiet_record_makes_node_0_ask_never_decide(server):
    """Node 1 spoke again but an outsider wrote its old quiet record back before node 0 read
    it: node 0 asks, node 1 answers that it is active, no hang; node 0 asks again only after
    RECHECK_AGAIN, and calls the hang once node 1 is really quiet."""
    clock, silence, evil = Clock(), [10.0], outsider(server)
    coordinator = _coordinator(server, clock)
    side = coordinator.scope
    node0 = _watch(server, 0, clock, [0.0], coordinator.desk)
    node1 = _watch(server, 1, clock, silence)
    node0.started([0])
    node0.exited(0, 0, time.time() - 10)
    node1.started([1])
    key = side.key("standing/1")
    node1.tick(10.0)  # quiet
    quiet = evil.get(key)
    silence[0] = 0.0
    node1.tick(0.0)  # speaks again: a record node 0 never reads
    evil.set(key, quiet)
    judge = coordinator.hang
    assert judge.look(coordinator.read_standings(side, clock())) is None
    assert judge.rechecks == 1
    evil.set(key, quiet)
    evil.add(side.key(WAKE), 1)
    assert judge.look(coordinator.read_standings(side, clock())) is None
    assert judge.rechecks == 1  # not asked again so soon
    clock.now += 1.0  # RECHECK_AGAIN
    silence[0] = 10.0
    record = judge.look(coordinator.read_standings(side, clock()))
    assert record is not None and judge.rechecks == 2
    coordinator.close()


@pytest.mark.parametrize("tamper", ["garbage", "delete"])
def test_a_quiet_record_garbled_before_node_0_read_it_still_lets_it_ask(server, tamper):
    """The soak's hang seed 2011: node 1's quiet record was garbled before node 0 read it, node
    0 kept what it knew (active) and the hung job ran for ever. A node whose record is missing
    or does not open is one node 0 may ask about, once T has passed and every other node's
    record says still or done; the fresh answers decide. Not before T, and not while another
    node's record says it moves."""
    clock, evil = Clock(), outsider(server)
    coordinator = _coordinator(server, clock)
    side = coordinator.scope
    silence = [0.0]
    node0 = _watch(server, 0, clock, silence, coordinator.desk)
    node1 = _watch(server, 1, clock, [10.0])
    node0.started([0])
    node1.started([1])
    judge = coordinator.hang
    assert judge.look(coordinator.read_standings(side, clock())) is None  # both active
    node1.tick(10.0)  # quiet: a record node 0 never reads
    key = side.key("standing/1")
    evil.set(key, b"garbage") if tamper == "garbage" else evil.delete_key(key)
    evil.add(side.key(WAKE), 1)
    standings = coordinator.read_standings(side, clock())
    assert coordinator.unsure == {1} and not standings[1].quiet
    assert judge.look(standings, coordinator.unsure) is None and judge.rechecks == 0  # node 0 moves
    node0.tick(10.0)
    silence[0] = 10.0
    standings = coordinator.read_standings(side, clock())
    assert judge.look(standings, coordinator.unsure) is None and judge.rechecks == 0  # before T
    clock.now += 4.0
    record = judge.look(coordinator.read_standings(side, clock()), coordinator.unsure)
    assert record is not None and record.kind is Kind.HANG and judge.rechecks == 1
    coordinator.close()


def test_a_node_that_does_not_answer_the_recheck_is_no_hang(server):
    """Node 1's records say quiet but it never answers (its agent is wedged, or the records
    are an outsider's): no hang is called on what was written before the question."""
    clock = Clock()
    coordinator = _coordinator(server, clock)
    side = coordinator.scope
    node0 = _watch(server, 0, clock, [0.0], coordinator.desk)
    node1 = _watch(server, 1, clock)  # no desk: it cannot answer
    node0.started([0])
    node0.exited(0, 0, time.time() - 10)
    node1.started([1])
    node1.tick(10.0)
    judge = coordinator.hang
    assert judge.look(coordinator.read_standings(side, clock())) is None
    assert judge.rechecks == 1 and not judge.fired
    coordinator.close()


@pytest.mark.parametrize(
    ("standings", "line"),
    [
        ([], ""),
        ([_standing(0, live=[0, 1]), _standing(1, live=[2, 3])], "job: all 4 ranks running"),
        (
            [_standing(0, ended=[RankEnd(0, 0, 1.0), RankEnd(1, 0, 1.0)]),
             _standing(1, live=[2, 3])],
            "job: 2 of 4 ranks still running: ranks 2-3 on h1",
        ),
        ([_standing(0, ended=[RankEnd(0, 0, 1.0)]), _standing(1, live=[1])],
         "job: 1 of 2 ranks still running: rank 1 on h1"),
        ([_standing(a, live=[a]) if a % 2 else _standing(a, ended=[RankEnd(a, 0, 1.0)])
          for a in range(12)],
         "job: 6 of 12 ranks still running: ranks 1,3,5,7,9,11 on h1, h11, h3, h5 and 2 more"),
        ([_standing(0, ended=[RankEnd(0, 0, 1.0)]), _standing(1, ended=[RankEnd(1, 0, 2.0)])],
         "job: all 2 ranks exited"),
    ],
)  # fmt: skip
def test_the_live_tables_job_line(standings, line):
    assert job_line(standings, sum(len(s.live) + len(s.ended) for s in standings)) == line
