"""A node's result, node 0's decision and a lineup's end (pure): the JSON each has always had,
read back the same; what is no record reads as a safe value, never raised — as tables."""

from __future__ import annotations

import pytest

from agent.errors import ExitCode
from agent.node.failure import Failure, Kind
from agent.node.result import Result
from agent.run.decision import Decision
from agent.run.lineup import LineupEnd

EXIT = {"rank": 0, "local_rank": 0, "node_rank": 0, "host": "n0", "state": "failed",
        "returncode": 3, "how": "exit code 3"}  # fmt: skip
RAN = {
    "exits": [EXIT],
    "signal": None,
    "refused": None,
    "warnings": ["rank 0 has printed nothing for 60s (--hang-warning)"],
    "failure": {
        "kind": "signal",
        "node_rank": 0,
        "host": "n0",
        "how": "agent received SIGTERM",
        "signal": "SIGTERM",
        "time": 5.0,
        "agent": 0,
        "seq": 1,
    },  # fmt: skip
    "progressed": True,
}


@pytest.mark.parametrize(
    "record",
    [
        RAN,
        {**RAN, "failure": None, "leftovers": {"host": "n0", "killed": [], "stays": []}},
        {**RAN, "signal": 15, "progressed": False},
        {"lost": True, "node": 1, "host": "n1", "exits": []},
    ],
)
def test_a_result_round_trips_key_for_key(record):
    assert Result.from_json(record).to_json() == record


def test_node_0s_record_for_a_lost_node():
    gone = Result.gone(1, "n1")
    assert gone.to_json() == {"lost": True, "node": 1, "host": "n1", "exits": []}


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (None, Result()),
        ("result", Result()),
        ({"exits": "x", "signal": "SIGTERM", "progressed": "yes", "lost": 1}, Result()),
        ({"exits": [EXIT, 3, None], "warnings": ["w", 5]}, Result(exits=(EXIT,), warnings=("w",))),
        ({"failure": {"kind": "meteor"}, "leftovers": [1]}, Result()),
        ({"failure": {"kind": "rank", "how": "x"}}, Result(failure=Failure(Kind.RANK, "x"))),
        ({"lost": True, "node": "1", "host": 2}, Result(lost=True)),
    ],
)
def test_a_result_of_the_wrong_shape_reads_safely(data, expected):
    assert Result.from_json(data) == expected


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"restart": True, "code": 1}, Decision(True, 1)),
        ({"restart": False, "code": 0}, Decision(False, 0)),
        ({"restart": "yes", "code": "0"}, Decision(False, int(ExitCode.RANK_FAILED))),
        ({"code": True}, Decision(False, int(ExitCode.RANK_FAILED))),
        (None, Decision(False, int(ExitCode.RANK_FAILED))),
    ],
)
def test_a_decision_never_reads_as_success_unless_it_says_so(data, expected):
    assert Decision.from_json(data) == expected


def test_a_decision_round_trips():
    assert Decision.from_json(Decision(True, 1).to_json()) == Decision(True, 1)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (None, None),
        (
            {
                "code": 3,
                "cause": {
                    "kind": "excluded",
                    "node_rank": None,
                    "host": "n1",
                    "how": "x",
                    "time": 1.0,
                    "agent": 1,
                },
            },  # fmt: skip
            LineupEnd(3, Failure(Kind.EXCLUDED, "x", None, "n1", 1.0, agent=1)),
        ),
        ({"code": "3", "cause": "x"}, LineupEnd(int(ExitCode.RANK_FAILED), None)),
    ],
)
def test_a_lineup_end(data, expected):
    end = LineupEnd.from_json(data)
    assert end == expected
    if end is not None and isinstance(data["code"], int):
        assert end.to_json() == data
