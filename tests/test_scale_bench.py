"""The scale bench's pure parts (scripts/bench/scale*.py): what it reports from the numbers its
processes send, and the inputs it builds. Nothing is run or timed here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from bench import scale, scale_e2e, scale_offline  # noqa: E402


def test_latest_is_the_last_agent_and_counts_those_that_got_there() -> None:
    assert scale_e2e._latest([[1.0, None, 3.0], [2.5]], since=0.5) == (2.5, 3)
    assert scale_e2e._latest([[None], []], since=0.0) == (None, 0)


def test_cpu_by_thread_kind_folds_numbers_and_names_native_threads() -> None:
    names = {11: "heartbeat", 12: "Thread-7 (run)", 13: "Thread-8 (run)"}
    before = {10: 1.0, 11: 0.0, 12: 0.0, 13: 0.0}
    after = {10: 1.5, 11: 0.1, 12: 0.05, 13: 0.05, 14: 0.0}
    assert scale_e2e._by_thread(before, after, names, span=1.0) == {
        "native": 50.0,
        "heartbeat": 10.0,
        "Thread": 10.0,
    }


def test_results_are_rebuilt_per_node_with_the_root_cause_where_it_happened() -> None:
    cause = {"kind": "rank", "rank": 3, "node_rank": 1, "how": "exit code 1"}
    ranks = [{"rank": r, "node_rank": r // 2, "state": "terminated"} for r in range(4)]
    results = scale_offline.results_of({"root_cause": cause, "attempts": [{"ranks": ranks}]})
    assert [len(r["exits"]) for r in results] == [2, 2]
    assert [r["failure"] for r in results] == [None, cause]


def test_stack_answers_make_three_groups_the_odd_ones_first() -> None:
    answers = scale_offline.node_answers(2)
    assert [len(a["stacks"]) for a in answers] == [8, 8]
    assert answers[1]["stacks"][7]["threads"][0]["frames"][-1][0] == "check"  # the last rank spins
    assert answers[0]["stacks"][7]["threads"][0]["frames"][-1][0] == "get"  # rank 7: data loader


def _row(n: int, **values) -> dict:
    base = {
        "n": n,
        "join_s": 1.0,
        "payload_s": 1.5,
        "started_s": 2.0,
        "startup_cpu_s": n * 0.01,
        "leader_cpu_pct": 4.0,
        "leader_fd_count": 5 * n,
        "fanout_s": 0.5,
        "abort_cpu_s": n * 0.001,
        "summary_s": 0.2,
        "verdict_all_s": 1.0,
        "offline": {"verdict": {"total_s": 0.1}, "stacks": {"total_s": 0.3}},
        "cli_summary": {"s": 0.4},
        "cli_tail5": {"s": 0.6},
    }
    return {**base, **values}


@pytest.mark.parametrize(
    ("rows", "verdicts"),
    [
        ([_row(256), _row(1024)], [True, True, True, True, True]),
        (
            [_row(256), _row(4096, payload_s=9.0, leader_cpu_pct=12.0)],
            [False, False, True, True, True],
        ),
        ([_row(256), {"n": 4096, "error": "not run: the section's time was spent"}], [True] * 5),
    ],
)
def test_targets_are_judged_on_the_largest_n_that_ran(rows, verdicts) -> None:
    tables, targets, _ = scale.summarize({"rows": rows, "idle_s": 5.0})
    assert [t.ok for t in targets] == verdicts
    text = tables[0].markdown()
    assert "| 256 (2048) |" in text and "10.00 ms" in text
    if "error" in rows[-1]:
        assert "not run" in text


IDLE = {"leader_cpu_pct": 10.0, "followers_cpu_pct": 90.0}  # one core between them


@pytest.mark.parametrize(
    ("row", "shown"),
    [
        # 30 s of CPU to start 1,000 agents in 10 s at an idle core: 20 s of it is the start's
        ({"n": 1000, "startup_cpu_s": 30.0, "started_s": 10.0, **IDLE}, "20.00 ms"),
        ({"n": 1000, "startup_cpu_s": 30.0, "started_s": 0.0, **IDLE}, "30.00 ms"),
        ({"n": 1000, "startup_cpu_s": 30.0, "started_s": 10.0, "leader_cpu_pct": 10.0}, "n/a"),
    ],
)
def test_the_start_s_cpu_less_the_idle_rate_over_its_wall_time(row, shown) -> None:
    assert scale._beyond_idle(row) == shown


@pytest.mark.parametrize(
    ("row", "base", "plain", "per_reference"),
    [
        # 4,096 agents: 40 ms each against 25 at 1,024; each operation 1.25× dearer there
        ({"n": 4096, "startup_cpu_s": 163.84, "reference_cpu_ms": 1.25},
         {"n": 1024, "startup_cpu_s": 25.6, "reference_cpu_ms": 1.0}, 1.6, 1.28),
        ({"n": 4096, "startup_cpu_s": 102.4, "reference_cpu_ms": 1.0},
         {"n": 1024, "startup_cpu_s": 25.6, "reference_cpu_ms": 1.0}, 1.0, 1.0),
        ({"n": 4096, "startup_cpu_s": 102.4}, {"n": 1024, "startup_cpu_s": 25.6}, 1.0, None),
        ({"n": 4096}, {"n": 1024, "startup_cpu_s": 25.6}, None, None),
    ],
)  # fmt: skip
def test_cpu_per_agent_against_1024_plain_and_per_unit_of_reference_work(
    row, base, plain, per_reference
) -> None:
    got = scale._ratio(row, base), scale._ratio(row, base, per_reference=True)
    assert got == (pytest.approx(plain), pytest.approx(per_reference))
    rows = [{**_row(1024), **base}, {**_row(4096), **row}]
    named = {t.name: t for t in scale.summarize({"rows": rows, "idle_s": 5.0})[1]}
    judged = named["… per unit of the reference work's CPU"]
    assert judged.ok == (None if per_reference is None else per_reference <= 1.2)


@pytest.mark.parametrize(
    ("ops", "shown"),
    [
        # node 0's process, then one light process's agents (per agent): beats counted apart
        ([{"Thread check": 38.0}, {"Thread check": 14.0, "Thread connect": 3.0,
          "heartbeat set": 4.95, "heartbeat check": 1.0}], "17.0 + 6.0 beats"),
        ([{}, {"Thread wait": 6.0}], "6.0 + 0.0 beats"),
        ([{"Thread check": 38.0}, {}], "n/a"),
        (None, "n/a"),
    ],
)  # fmt: skip
def test_store_queries_to_start_are_one_other_agent_s_with_its_beats_apart(ops, shown) -> None:
    assert scale._queries({"n": 1024, "startup_ops": ops}) == shown
