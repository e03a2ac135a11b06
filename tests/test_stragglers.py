"""Stragglers from step times (pure), the step clock, and the restart loop guard (pure)."""

from __future__ import annotations

import pytest

from agent.console.stream import STEPS_KEPT, StepClock
from agent.errors import ExitCode
from agent.node.failure import Failure, Kind
from agent.plan.options import progress_pattern, resolve
from agent.run.stragglers import MIN_STEPS, RankPace, changes, judge_pace, started_line
from agent.run.summary import build_summary, cause_line, render_report
from agent.run.verdict import Verdict, guard_loop


def pace(rank: int, node: int, median: float, steps: int = 10) -> RankPace:
    return RankPace(rank, node, f"h{node}", median, steps, step=steps)


# (case, paces, factor, job median, stragglers as (node, rank))
CASES = [
    ("equal ranks", [pace(r, r // 2, 0.2) for r in range(4)], 1.5, 0.2, []),
    (
        "node 1 twice as slow: the node, not its ranks",
        [pace(0, 0, 0.2), pace(1, 0, 0.2), pace(2, 1, 0.4), pace(3, 1, 0.4)],
        1.5,
        0.2,
        [(1, None)],
    ),
    (
        "one slow rank on a node that keeps pace",
        [pace(0, 0, 0.2), pace(1, 0, 0.2), pace(2, 1, 0.2), pace(3, 1, 0.5)],
        1.5,
        0.2,
        [(1, 3)],
    ),
    (
        "at the factor exactly: not a straggler",
        [pace(0, 0, 0.2), pace(1, 0, 0.2), pace(2, 1, 0.3), pace(3, 1, 0.3)],
        1.5,
        0.2,
        [],
    ),
    (
        "a larger factor tolerates it",
        [pace(0, 0, 0.2), pace(1, 0, 0.2), pace(2, 1, 0.4), pace(3, 1, 0.4)],
        2.5,
        0.2,
        [],
    ),
    (
        "one node: ranks are judged, the node is not",
        [pace(0, 0, 0.2), pace(1, 0, 0.2), pace(2, 0, 0.9)],
        1.5,
        0.2,
        [(0, 2)],
    ),
    (
        "too few step times: not judged",
        [pace(0, 0, 0.2), pace(1, 0, 0.2), pace(2, 1, 9.0, steps=MIN_STEPS - 1)],
        1.5,
        0.2,
        [],
    ),
    ("a single rank: nothing to compare", [pace(0, 0, 0.2)], 1.5, None, []),
    ("nothing yet", [], 1.5, None, []),
]


@pytest.mark.parametrize(
    ("case", "paces", "factor", "job", "expected"), CASES, ids=[c[0] for c in CASES]
)
def test_judge_pace(case, paces, factor, job, expected):
    result = judge_pace(paces, factor)
    assert result.job_median == job
    assert [(s.node_rank, s.rank) for s in result.stragglers] == expected


def test_changes_start_and_end_once():
    slow = [pace(0, 0, 0.2), pace(1, 0, 0.2), pace(2, 1, 0.4), pace(3, 1, 0.4)]
    even = [pace(r, r // 2, 0.2) for r in range(4)]
    first = judge_pace(slow, 1.5)
    started = changes((), first)
    assert [s.what() for s in started.started] == ["node 1 (h1)"] and not started.ended
    again = changes(first.stragglers, judge_pace(slow, 1.5))
    assert not again.started and not again.ended  # still slow: nothing new to say
    over = changes(first.stragglers, judge_pace(even, 1.5))
    assert not over.started and [s.what() for s in over.ended] == ["node 1 (h1)"]
    assert "node 1 (h1) steps in 0.4 s, the job's median is 0.2 s (2x) at step 10" in started_line(
        first.stragglers[0]
    )


def test_step_clock_times_steps_and_stays_bounded():
    clock = StepClock()
    clock.tick(0, 10.0)
    clock.tick(1, 10.5)
    clock.tick(4, 12.0)  # three steps in one look: 0.5 s each
    assert list(clock.durations) == [0.5, 0.5]
    clock.tick(2, 13.0)  # the number went back (a new epoch's count): the clock restarts
    assert list(clock.durations) == [0.5, 0.5] and clock.step == 2
    for n in range(3, 100):
        clock.tick(n, 13.0 + n)
    assert len(clock.durations) == STEPS_KEPT and clock.lines == 101
    plain = StepClock()  # no `step` group: the time between progress lines
    for t in (1.0, 1.25, 1.5):
        plain.tick(None, t)
    assert list(plain.durations) == [0.25, 0.25]


def test_router_reads_the_step_group():
    from agent.console.router import _step_group

    assert _step_group(progress_pattern(r"step (?P<step>\d+)")) == 1
    assert _step_group(progress_pattern(r"(?P<loss>[0-9.]+) step (?P<step>\d+)")) == 2
    assert _step_group(progress_pattern(r"iter \d+")) is None


def _failed(attempt: int) -> Verdict:
    cause = Failure(Kind.RANK, "exit code 3", node_rank=0, host="h0", rank=1)
    return Verdict(1, True, cause, {"attempt": attempt, "root_cause": cause.to_json()})


# (progress per attempt so far, restart kept?)
GUARD = [
    ([False], True),  # the first attempt alone: one more try
    ([False, False], False),  # two in a row without progress: stop
    ([True, False], True),
    ([False, True], True),
    ([True, True, False, False], False),
]


@pytest.mark.parametrize(("progressed", "restart"), GUARD)
def test_guard_loop(progressed, restart):
    verdict = guard_loop(_failed(len(progressed) - 1), progressed)
    assert verdict.restart is restart
    if restart:
        assert verdict.code == 1 and verdict.root_cause.kind is Kind.RANK
        return
    k = len(progressed) - 1
    assert verdict.code == ExitCode.NO_PROGRESS == 5
    assert verdict.root_cause.how == f"no progress in attempts {k - 1} and {k}; not restarting"
    assert verdict.record["root_cause"] == verdict.root_cause.to_json()
    assert verdict.record["root_cause"]["kind"] == "no_progress"
    assert verdict.root_cause.failure.rank == 1  # the attempt's own failure kept
    summary = build_summary({}, [dict(verdict.record)], verdict.code)
    assert "not restarting (last: rank 1 on h0 (node 0) exit code 3)" in cause_line(
        summary["root_cause"]
    )


def test_guard_leaves_a_verdict_without_restart_alone():
    final = Verdict(1, False, None, {"attempt": 5})
    assert guard_loop(final, [False] * 6) is final


def test_summary_lists_stragglers_of_every_attempt():
    entry = {"node_rank": 1, "host": "h1", "rank": None, "median": 0.4, "job_median": 0.2}
    attempts = [{"attempt": 0, "stragglers": [{**entry, "attempt": 0}]}, {"attempt": 1}]
    summary = build_summary({}, attempts, 0)
    assert summary["stragglers"] == [{**entry, "attempt": 0}]
    assert (
        "straggler in attempt 0: node 1 (h1) at 0.4 s/step, the job's median 0.2 s/step"
        in render_report(summary)
    )


@pytest.mark.parametrize("value", [1.0, 0.5, float("nan"), float("inf"), 1001])
def test_straggler_factor_range(value):
    from agent.errors import AgentError

    with pytest.raises(AgentError, match="--straggler-factor .*expected a factor more than 1"):
        resolve({"straggler_factor": value}, {})


def test_options_defaults():
    options = resolve({}, {})
    assert options.straggler_factor == 1.5 and options.restart_without_progress is False
    assert resolve({}, {"straggler_factor": 3}).straggler_factor == 3.0


def _pace_pair(factor: float = 1.5, port: int | None = None):
    """Node 0 and node 1's PaceWatch and node 0's PaceJudge over one in-process store (or a
    real server's at `port`), each node with its own clocks."""
    from agent.node.local_store import LocalStore
    from agent.node.scope import Scope
    from agent.node.store import Endpoint, Store
    from agent.node.store_client import StoreClient
    from agent.node.trust import JobKeys
    from agent.run.pace import PaceJudge, PaceWatch

    client = LocalStore() if port is None else StoreClient.connect("127.0.0.1", port, 10)
    store = Store(client, Endpoint("127.0.0.1", port or 1), "t/")
    keys = JobKeys.derive(b"pace-test", "job", "0")
    clocks = [{0: StepClock(), 1: StepClock()}, {2: StepClock(), 3: StepClock()}]
    watches = [
        PaceWatch(
            Scope(store, "r0/a0", node, keys),
            lambda node=node: clocks[node],
            agent=node,
            node_rank=node,
            host=f"h{node}",
        )
        for node in (0, 1)
    ]
    judge = PaceJudge(Scope(store, "r0/a0", 0, keys), agents=[0, 1], factor=factor, attempt=0)
    return watches, judge, clocks


def _step(clocks, node: int, seconds: float, steps: int, start: float) -> None:
    for clock in clocks[node].values():
        for n in range(steps):
            clock.tick(n, start + n * seconds)


def test_pace_watch_names_a_slow_node_once_and_its_end(caplog):
    watches, judge, clocks = _pace_pair()
    _step(clocks, 0, 0.2, 6, 0.0)
    _step(clocks, 1, 0.4, 6, 0.0)
    caplog.set_level("WARNING", logger="agent")
    for now in (10.0, 10.5, 11.0):  # node 1 posts first, then node 0 posts; node 0 judges
        watches[1].tick(now)
        watches[0].tick(now)
        judge.tick(now)
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "straggler: node 1 (h1) steps in 0.4 s, the job's median is 0.2 s (2x) at step 5"
    ]
    for clock in clocks[1].values():  # node 1 catches up: twenty fast steps
        for n in range(6, 26):
            clock.tick(n, 2.0 + (n - 5) * 0.2)
    watches[1].tick(12.0)
    watches[0].tick(12.0)
    judge.tick(12.0)
    said = [r.getMessage() for r in caplog.records]
    assert said[1:] == ["straggler no more: node 1 (h1) keeps the job's pace again"]
    (episode,) = judge.close()
    assert (episode["node_rank"], episode["rank"], episode["attempt"]) == (1, None, 0)
    assert episode["median"] == pytest.approx(0.4) and episode["job_median"] == pytest.approx(0.2)
    assert episode["until"] >= episode["since"]


def test_a_pace_watch_looks_again_soon_while_ranks_step_and_later_once_they_are_quiet():
    """The supervisor wakes at `due`: POST_EVERY while a record went out in the last
    QUIET_AFTER seconds, QUIET_LOOK once none did (an idle node's supervisor then sleeps)."""
    from agent.run.pace import POST_EVERY, QUIET_AFTER, QUIET_LOOK

    watches, _, clocks = _pace_pair()
    watch = watches[0]
    nexts = []
    looks = ((10.0, True), (10.25, False), (10.5, False), (10.0 + QUIET_AFTER, False),
             (13.0, True), (13.25, False))  # fmt: skip
    for now, news in looks:
        if news:
            _step(clocks, 0, 0.2, 3 + len(nexts), 0.0)
        watch.tick(now)
        nexts.append(round(watch.due - now, 3))
    assert nexts == [POST_EVERY, POST_EVERY, POST_EVERY, QUIET_LOOK, POST_EVERY, POST_EVERY]
    assert QUIET_LOOK > POST_EVERY


@pytest.mark.parametrize(
    ("ended", "still_straggling"),
    [
        ((), True),  # every rank runs: node 1 is slow
        ((0, 1), True),  # node 0's ranks are done: node 1 is still slower than the job's pace
        ((2, 3), False),  # node 1's ranks are done: its episode ends with them
        ((2,), True),  # one of node 1's ranks is done: the other still straggles
    ],
)
def test_a_straggler_episode_lasts_until_its_ranks_keep_pace_or_end(ended, still_straggling):
    watches, judge, clocks = _pace_pair()
    _step(clocks, 0, 0.2, 6, 0.0)
    _step(clocks, 1, 0.4, 6, 0.0)
    for watch in watches:
        watch.tick(10.0)
    judge.tick(10.0)
    assert [s.node_rank for s in judge.active] == [1]
    judge.tick(11.0, live=lambda rank: rank not in ended)  # the nodes' standings say who runs
    assert bool(judge.active) is still_straggling
    assert ("until" in judge.episodes[0]) is not still_straggling


def test_pace_watch_posts_only_when_a_rank_stepped():
    watches, _, clocks = _pace_pair()
    scope = watches[1].scope
    watches[1].tick(1.0)
    assert scope.get_if("pace/1", "pace") is None  # no steps yet: nothing posted
    _step(clocks, 1, 0.3, 4, 0.0)
    watches[1].tick(2.0)
    first = scope.get_if("pace/1", "pace")
    assert first["node_rank"] == 1 and [r[0] for r in first["ranks"]] == [2, 3]
    scope.put("pace/1", {"marker": True})
    watches[1].tick(3.0)  # nothing new since: the record is left alone
    assert scope.get_if("pace/1", "pace") == {"marker": True}


def test_an_old_pace_record_written_back_names_no_straggler():
    """S1: the outsider (torch's client) writes node 1's old slow record back after node 1
    caught up, then garbage, then deletes it: no new episode, the newest record stands."""
    from store_peers import outsider, store_server

    server = store_server()
    evil = outsider(server)
    watches, judge, clocks = _pace_pair(port=server.port)
    _step(clocks, 0, 0.2, 6, 0.0)
    _step(clocks, 1, 0.4, 6, 0.0)
    for watch in watches:
        watch.tick(10.0)
    judge.tick(10.0)
    assert [s.node_rank for s in judge.active] == [1]
    key = watches[1].scope.key("pace/1")
    slow = evil.get(key)  # node 1's genuine record of its slow steps
    for clock in clocks[1].values():  # node 1 catches up: twenty fast steps
        for n in range(6, 26):
            clock.tick(n, 2.0 + (n - 5) * 0.2)
    watches[1].tick(12.0)
    judge.tick(12.0)
    assert judge.active == [] and "until" in judge.episodes[0]
    now = 13.0
    for tamper in (lambda: evil.set(key, slow), lambda: evil.set(key, b"garbage"),
                   lambda: evil.delete_key(key), lambda: evil.set(key, slow)):  # fmt: skip
        tamper()
        judge.tick(now)
        now += 1.0
        assert judge.active == [] and len(judge.episodes) == 1
