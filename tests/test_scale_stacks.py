"""`stacks` at scale (pure): frames read from many ranks' JSON are made once and shared, bounds
still hold, and grouping is unchanged."""

from __future__ import annotations

import re

import pytest

from agent.hang.collate import collate
from agent.hang.stacks import MAX_TEXT, Frame, RankStack, thread_stack


def _record(rank: int, frames: list[list]) -> dict:
    return {
        "rank": rank,
        "host": f"n{rank // 8}",
        "pid": 100 + rank,
        "method": "py-spy",
        "error": None,
        "threads": [{"name": "MainThread", "idle": False, "frames": frames}],
    }


STEP = [["main", "/job/train.py", 10], ["step", "/job/train.py", 96]]


def test_ranks_with_the_same_frames_share_them() -> None:
    stacks = [RankStack.from_json(_record(r, [list(f) for f in STEP])) for r in range(64)]
    first = stacks[0].threads[0].frames
    assert first == (Frame("main", "/job/train.py", 10), Frame("step", "/job/train.py", 96))
    assert all(s.threads[0].frames[i] is first[i] for s in stacks for i in range(2))
    assert [len(g.ranks) for g in collate(stacks)] == [64]


@pytest.mark.parametrize(
    ("item", "error"),
    [
        (["f", "file", True], "line is not an integer"),  # a bool is no line, even if True == 1
        (["f", "file", 1.0], "line is not an integer"),
        ([1, "file", 1], "function is not a string"),
        (["f", "file"], "not [function, file, line]"),
    ],
)
def test_a_cached_frame_never_admits_what_the_checks_refuse(item, error) -> None:
    RankStack.from_json(_record(0, [["f", "file", 1]]))  # the valid twin is cached
    with pytest.raises(ValueError, match=re.escape(error)):
        RankStack.from_json(_record(1, [item]))


def test_long_strings_are_cut_and_frames_within_bounds_kept_as_they_are() -> None:
    long = "x" * (MAX_TEXT + 10)
    kept = Frame("f", "file", 1)
    thread = thread_stack("MainThread", False, [kept, Frame(long, long, 2)])
    assert thread.frames[0] is kept
    assert thread.frames[1] == Frame("x" * MAX_TEXT, "x" * MAX_TEXT, 2)
    parsed = RankStack.from_json(_record(0, [[long, "file", 3]]))
    assert parsed.threads[0].frames[0].function == "x" * MAX_TEXT
