"""The failure record (agent.node.failure, pure): its JSON keeps summary.json's keys and strings,
hostile input never raises, every kind is worded and classed — as tables."""

from __future__ import annotations

import json

import pytest

from agent.node.failure import Failure, Kind, closed, words
from agent.run.failure_class import FailureClass, classify
from agent.run.summary import RankExit, rank_failure

RANK = {
    "kind": "rank",
    "rank": 3,
    "local_rank": 1,
    "node_rank": 1,
    "host": "n1",
    "returncode": 3,
    "how": "exit code 3",
    "signal": None,
    "time": 12.5,
    "stderr_tail": ["ValueError: bad"],
}


@pytest.mark.parametrize(
    "record",
    [
        pytest.param(RANK, id="rank"),
        pytest.param({**RANK, "traceback": "Traceback ...", "seq": 1, "agent": 1}, id="rank-full"),
        pytest.param(
            {
                "kind": "lost",
                "node_rank": 1,
                "host": "n1",
                "how": "lost: silent",
                "time": 5.0,
                "agent": 1,
                "seq": 2,
            },
            id="lost",
        ),  # fmt: skip
        pytest.param(
            {
                "kind": "signal",
                "node_rank": 0,
                "host": "n0",
                "how": "agent received SIGINT",
                "time": 5.0,
                "signal": "SIGINT",
            },
            id="signal",
        ),  # fmt: skip
        pytest.param(
            {"kind": "setup", "node_rank": None, "host": "n0", "how": "no script", "time": 5.0},
            id="setup-no-rank",
        ),  # fmt: skip
        pytest.param(
            {"kind": "secret", "node_rank": 2, "how": "another secret", "time": 5.0, "agent": 2},
            id="secret",
        ),  # fmt: skip
        pytest.param({"kind": "join", "how": "node 3 never arrived"}, id="join"),
        pytest.param({"kind": "down", "how": "stopped", "agent": 0, "time": 5.0}, id="down"),
        pytest.param(
            {
                "kind": "hang",
                "node_rank": 0,
                "host": "n0",
                "how": "hang",
                "time": 5.0,
                "stacks": "...",
                "stacks_file": "/l/stacks-a0.txt",
            },
            id="hang",
        ),  # fmt: skip
        pytest.param(
            {
                "kind": "no_progress",
                "how": "no progress; not restarting",
                "attempts": [0, 1],
                "failure": RANK,
            },
            id="guard",
        ),  # fmt: skip
        pytest.param({"kind": "closed"}, id="closed"),
        pytest.param(
            {
                "kind": "setup",
                "node_rank": 0,
                "host": "n0",
                "how": "x",
                "time": 1.0,
                "tampering": True,
            },
            id="tampering",
        ),  # fmt: skip
    ],
)
def test_json_round_trip_keeps_every_key(record):
    """What the reporters wrote before the type: read back and written again, key for key."""
    failure = Failure.from_json(record)
    assert failure is not None and failure.to_json() == record
    assert json.loads(json.dumps(failure.to_json())) == record


def test_a_ranks_record_is_what_it_always_was():
    exit = RankExit(3, 1, 1, "n1", 99, 3, "failed", 1.0, 12.5, 0)
    assert rank_failure(exit, ["ValueError: bad"], None).to_json() == RANK


HOSTILE = [
    None,
    [],
    "rank",
    3,
    {},
    {"kind": None},
    {"kind": 7},
    {"kind": ["rank"]},
    {"kind": "meteor", "how": "unknown to this version"},
    {"kind": "RANK"},
]


@pytest.mark.parametrize("data", HOSTILE)
def test_what_is_no_record_is_none(data):
    assert Failure.from_json(data) is None


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"kind": "rank", "rank": "3", "node_rank": True, "how": 5},
            Failure(Kind.RANK),
        ),  # fmt: skip
        (
            {"kind": "lost", "time": float("nan"), "host": ["n1"], "seq": 1.5},
            Failure(Kind.LOST),
        ),  # fmt: skip
        ({"kind": "lost", "time": 10**400}, Failure(Kind.LOST)),
        ({"kind": "setup", "how": "x", "tampering": "yes"}, Failure(Kind.SETUP, "x")),
        ({"kind": "setup", "how": "x", "tampering": 1}, Failure(Kind.SETUP, "x")),
        ({"kind": "rank", "stderr_tail": "one string", "traceback": {"a": 1}}, Failure(Kind.RANK)),
        (
            {"kind": "rank", "stderr_tail": ["ok", 3, None, "too"]},
            Failure(Kind.RANK, stderr_tail=("ok", "too")),
        ),  # fmt: skip
        (
            {"kind": "no_progress", "attempts": [0, "1", None, 2], "failure": "rank"},
            Failure(Kind.NO_PROGRESS, attempts=(0, 2)),
        ),  # fmt: skip
        (
            {"kind": "no_progress", "attempts": {"0": 1}, "failure": {"kind": "meteor"}},
            Failure(Kind.NO_PROGRESS),
        ),  # fmt: skip
        ({"kind": "signal", "signal": 2, "time": 5}, Failure(Kind.SIGNAL, time=5.0)),
    ],
)
def test_wrong_types_are_absent(data, expected):
    assert Failure.from_json(data) == expected


def test_a_guard_is_read_one_level_deep():
    """An inner failure's own inner one is not read: a deep nest costs nothing."""
    deep: dict = {"kind": "rank", "how": "bottom"}
    for _ in range(5000):
        deep = {"kind": "same_failure", "how": "again", "failure": deep}
    failure = Failure.from_json(deep)
    assert failure is not None and failure.failure is not None
    assert failure.failure.failure is None


def test_only_a_true_tampering_field_says_tampering():
    """No message text decides: a `how` that reads like tampering is only words."""
    said = Failure.from_json({"kind": "setup", "how": "store tampering suspected at k: gone"})
    assert said is not None and not said.tampering
    assert Failure.from_json({"kind": "setup", "how": "x", "tampering": True}).tampering


@pytest.mark.parametrize("kind", list(Kind))
def test_every_kind_is_worded_and_classed(kind):
    """Adding a kind shows every consumer: each reader's match covers it (or fails here)."""
    failure = Failure(kind, "what happened", node_rank=1, host="n1", rank=2, seq=1)
    assert "what happened" in failure.line()
    expected = FailureClass.PROGRAM if kind is Kind.RANK else FailureClass.INFRA
    assert classify(failure, [failure], False, "train.py").failure_class is expected


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (
            {"kind": "lost", "node_rank": 1, "host": "n1", "how": "lost: silent"},
            "node 1 (n1) lost: silent",
        ),  # fmt: skip
        ({"kind": "meteor", "how": "from a newer version"}, "meteor: from a newer version"),
        (
            {"kind": "same_failure", "how": "twice", "failure": {"kind": "join", "how": "x"}},
            "twice (last: join: x)",
        ),  # fmt: skip
        ("not a record", None),
    ],
)
def test_words_read_from_a_file(data, line):
    assert words(data) == line


def test_closed_is_no_failure():
    assert closed().closed and closed().to_json() == {"kind": "closed"}
