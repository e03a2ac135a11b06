"""summary.json's one reader (agent.history.summary_doc.read_summary, pure): whatever a file
holds — an older agent's summary, a hand's edit, a hostile user's — it never raises; a value of
the wrong type reads as its default, a list entry that is not an object is skipped."""

from __future__ import annotations

import json
import math

import pytest

from agent.history.summary_doc import (
    SCHEMA,
    Job,
    RankExit,
    Seat,
    Straggler,
    Summary,
    read_seatings,
    read_summary,
)
from agent.run.summary import build_summary, started_summary

RANK = {"rank": 3, "local_rank": 1, "node_rank": 1, "host": "n1", "pid": 99, "returncode": -9,
        "state": "failed", "start": 100.0, "end": 110.5, "attempt": 0, "binding": None,
        "how": "killed by SIGKILL"}  # fmt: skip


def test_a_summary_as_node_0_writes_it():
    exit = RankExit(3, 1, 1, "n1", 99, -9, "failed", 100.0, 110.5, 0)
    attempt = {"attempt": 0, "ranks": [exit.to_json()], "root_cause": {"kind": "rank"},
               "nodes": [{"node": 1, "host": "n1", "ranks": [2, 3]}], "spares": ["n9"],
               "lost_nodes": [], "failure": {"class": "program"}}  # fmt: skip
    job = {"run_id": "8.0", "id": "8", "step": "0", "nnodes": 2, "command": ["t.py", "a.yml"]}
    doc = read_summary(json.loads(json.dumps(build_summary(job, [attempt], 1))))
    assert doc.schema == SCHEMA and doc.status == "failed" and doc.exit_code == 1
    assert doc.job == Job(run_id="8.0", id="8", step="0", nnodes=2, command=("t.py", "a.yml"))
    (read,) = doc.attempts
    assert read.ranks == (RankExit(**{**exit.to_json(), "how": "killed by SIGKILL"}),)
    assert read.ranks[0].to_json() == exit.to_json()  # written, read, written: the same
    assert read.seated and read.seating.nodes == (Seat(1, "n1", (2, 3)),)
    assert read.seating.spares == ("n9",) and read.failure == {"class": "program"}
    assert read.root_cause == {"kind": "rank"} and not doc.running


def test_the_running_record_and_an_older_summary():
    running = read_summary(started_summary({"id": "8"}, {"pid": 7}))
    assert running.running and running.schema == SCHEMA and running.node0 == {"pid": 7}
    assert running.exit_code is None and running.attempts == ()
    older = read_summary({"job": {"id": "8"}, "status": "succeeded", "exit_code": 0})
    assert older.schema == 0 and older.job.run_id == "" and older.job.max_restarts is None


EMPTY = Summary(0, "", None, Job(), None, (), (), None)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(None, EMPTY, id="null"),
        pytest.param([1, 2], EMPTY, id="a-list"),
        pytest.param("summary", EMPTY, id="a-string"),
        pytest.param({}, EMPTY, id="empty"),
        pytest.param(
            {
                "schema": "1",
                "status": 5,
                "exit_code": "0",
                "job": ["x"],
                "root_cause": "boom",
                "attempts": {"0": {}},
                "stragglers": "n1",
                "node0": [],
            },
            Summary(0, "5", None, Job(), None, (), (), None),
            id="every-field-a-wrong-type",
        ),  # fmt: skip
        pytest.param(
            {"schema": True, "exit_code": True, "root_cause": {}, "attempts": [1, "a", None]},
            EMPTY,
            id="booleans-and-non-objects",
        ),
    ],
)
def test_hostile_summaries_read_as_defaults(value, expected):
    assert read_summary(value) == expected


@pytest.mark.parametrize(
    ("entry", "field", "expected"),
    [
        ({**RANK, "rank": "3"}, "rank", -1),
        ({**RANK, "rank": True}, "rank", -1),
        ({**RANK, "node_rank": [1]}, "node_rank", -1),
        ({**RANK, "host": {"n": 1}}, "host", ""),
        ({**RANK, "host": 7}, "host", "7"),
        ({**RANK, "pid": 1.5}, "pid", None),
        ({**RANK, "returncode": "-9"}, "returncode", None),
        ({**RANK, "state": None}, "state", ""),
        ({**RANK, "start": float("nan")}, "start", 0.0),
        ({**RANK, "start": 10**400}, "start", 0.0),
        ({**RANK, "end": float("inf")}, "end", None),
        ({**RANK, "end": "later"}, "end", None),
        ({**RANK, "how": ["x"]}, "how", ""),
        ({k: v for k, v in RANK.items() if k != "how"}, "words", "killed by SIGKILL"),
        ({**RANK, "start": -5.0}, "started", None),
        ({**RANK, "attempt": "0"}, "attempt", 4),  # the attempt it is listed in
    ],
)
def test_a_rank_record_field_of_the_wrong_type_is_its_default(entry, field, expected):
    assert getattr(RankExit.from_json(entry, attempt=4), field) == expected


@pytest.mark.parametrize(
    ("attempt", "check"),
    [
        ({"ranks": "x", "attempt": True}, lambda a: a.ranks == () and a.attempt == 2),
        ({"ranks": [RANK, 5, None, [RANK]]}, lambda a: [r.rank for r in a.ranks] == [3]),
        ({"lost_nodes": [1, "2", None]}, lambda a: a.lost_nodes == (1, -1, -1)),
        ({"nodes": [{"node": "0", "host": 1, "ranks": [0]}]},
         lambda a: a.seated and a.seating.nodes == (Seat(-1, "1", None),)),
        ({"nodes": "n0"}, lambda a: a.seated and a.seating.nodes == ()),
        ({"spares": [None, "n2"], "excluded": [{"host": "n3"}, "n4"]},
         lambda a: a.seating.spares == ("", "n2") and a.seating.excluded == ("n3",)),
        ({"failure": "program", "leftovers": [{"host": "n0"}, 3]},
         lambda a: a.failure is None and a.leftovers == ({"host": "n0"},)),
        ({}, lambda a: not a.seated and a.attempt == 2),
    ],
)  # fmt: skip
def test_hostile_attempts(attempt, check):
    (read,) = read_summary({"attempts": [None, "x", attempt]}).attempts
    assert check(read)


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"attempt": 1, "rank": 3, "node_rank": 0, "host": "n0", "median": 2.5,
          "job_median": 1.0, "since": 105.0, "until": None},
         Straggler(1, 3, 0, "n0", 2.5, 1.0, 105.0, None)),
        ({"rank": None, "node_rank": "0", "median": "slow", "since": -1, "until": math.inf},
         Straggler(-1, None, -1, "", None, None, None, None)),
    ],
)  # fmt: skip
def test_stragglers(entry, expected):
    (read,) = read_summary({"stragglers": [entry, "n9", 7]}).stragglers
    assert read == expected
    assert read.words.startswith(f"straggler in attempt {expected.attempt}: ")


def test_the_pace_is_worded_only_when_known():
    fast = Straggler(1, 3, 0, "n0", 2.5, 1.0, None, None)
    assert fast.words == (
        "straggler in attempt 1: rank 3 on n0 (node 0) at 2.5 s/step, the job's median 1 s/step"
    )
    assert Straggler(1, None, 0, "n0", None, 1.0, None, None).words == (
        "straggler in attempt 1: node 0 (n0)"
    )


def test_ranks_json_seatings():
    seatings = read_seatings(
        [{"attempt": 1, "nodes": [{"node": 0, "host": "n0", "ranks": [0, 1]}]}, "x", {"nodes": 5}]
    )
    assert sorted(seatings) == [-1, 1] and seatings[1].nodes == (Seat(0, "n0", (0, 1)),)
    assert read_seatings("not a list") == {}


def test_deep_and_huge_values_do_not_raise():
    deep: object = {}
    for _ in range(500):
        deep = {"job": deep, "attempts": [deep]}
    read_summary(deep)
    read_summary({"attempts": [{"ranks": [RANK] * 10_000}]})
