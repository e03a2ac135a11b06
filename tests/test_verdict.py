"""The verdict on an attempt (pure): exit code, restart or not, root cause — as tables."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agent.node.failure import Failure, Kind, closed
from agent.node.result import Result
from agent.run.failure_class import AttemptFailure, FailureClass, Signature
from agent.run.verdict import Budget, judge, root_cause


def _exit(rank: int, state: str, code: int | None = 0) -> dict:
    return {"rank": rank, "state": state, "returncode": code}


OK = Result.from_json({"exits": [_exit(0, "succeeded"), _exit(1, "succeeded")]})
FAILED = Result.from_json({"exits": [_exit(2, "failed", 3), _exit(3, "terminated", -15)]})
LOST = Result.from_json({"lost": True, "node": 1, "host": "n1", "exits": []})
RANK_FAILURE = Failure(Kind.RANK, "exit code 3", rank=2, seq=1)
LOST_FAILURE = Failure(Kind.LOST, "node 1 lost", node_rank=1, seq=2)
STOP_FAILURE = Failure(Kind.SIGNAL, "agent received SIGINT", signal="SIGINT", seq=1)


@pytest.mark.parametrize(
    ("results", "failures", "attempt", "max_restarts", "code", "restart"),
    [
        ([OK, OK], [], 0, 0, 0, False),
        ([OK, FAILED], [RANK_FAILURE], 0, 0, 1, False),
        ([OK, FAILED], [RANK_FAILURE], 0, 2, 1, True),
        ([OK, FAILED], [RANK_FAILURE], 2, 2, 1, False),  # restarts used up (two before it)
        ([OK, LOST], [LOST_FAILURE], 0, 0, 3, False),
        ([OK, LOST], [LOST_FAILURE], 0, 5, 3, False),  # the same world cannot run without it
        ([OK, replace(FAILED, refused="forged abort record")], [RANK_FAILURE], 0, 3, 4, True),
        # An operator's stop (Ctrl-C, scancel): 128 + N as every agent exits, never a restart
        ([OK, replace(FAILED, signal=2)], [RANK_FAILURE], 0, 3, 130, False),  # during a teardown
        ([OK, replace(FAILED, signal=2)], [STOP_FAILURE], 0, 3, 130, False),
        ([OK, OK], [replace(STOP_FAILURE, signal="SIGTERM")], 0, 0, 143, False),  # on another node
        ([OK, replace(LOST, signal=15)], [LOST_FAILURE], 0, 0, 143, False),
    ],
)
def test_exit_code_and_restart(results, failures, attempt, max_restarts, code, restart):
    # the earlier attempts failed differently each time: only the budget counts here
    earlier = [_bug(f"E{k}") for k in range(attempt)]
    verdict = judge(attempt, results, failures, Budget(max_restarts, max_restarts), earlier=earlier)
    assert (verdict.code, verdict.restart) == (code, restart)


def _bug(exception: str) -> AttemptFailure:
    signature = Signature(exception, None, "exit code 1", "train.py")
    return AttemptFailure(FailureClass.PROGRAM, exception, signature)


def test_root_cause_is_the_failure_the_store_saw_first():
    later = Failure(Kind.RANK, "exit code 1", rank=7, seq=4)
    assert root_cause([later, LOST_FAILURE, RANK_FAILURE]) == RANK_FAILURE
    assert root_cause([closed()]) is None
    assert root_cause([]) is None


def test_the_attempt_record_lists_every_rank_and_the_lost_nodes():
    verdict = judge(1, [FAILED, OK, LOST], [LOST_FAILURE, RANK_FAILURE], Budget())
    record = verdict.record
    assert record["attempt"] == 1 and record["root_cause"] == RANK_FAILURE.to_json()
    assert [r["rank"] for r in record["ranks"]] == [-1, 0, 1, 2, 3]
    assert record["ranks"][0]["state"] == "lost" and record["lost_nodes"] == [1]
