"""Collating every rank's stacks (pure): grouping, order, idle folding, the headline's choice
of frame, rank lists and hostlists, bounded output; and the records' JSON, hostile included."""

from __future__ import annotations

import json

import pytest

from agent.hang.collate import (
    MAX_RENDER,
    Group,
    collate,
    headline,
    render,
)
from agent.hang.stacks import MAX_FRAMES, MAX_TEXT, MAX_THREADS, Frame, RankStack, ThreadStack
from agent.plan.rank_set import format_ranges

TORCH = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
THREADING = "/usr/lib/python3.11/threading.py"


def fr(function: str, file: str = "/job/train.py", line: int = 1) -> Frame:
    return Frame(function, file, line)


def th(*frames: Frame, name: str = "MainThread", idle: bool = False) -> ThreadStack:
    return ThreadStack(name, idle, frames)


def rs(rank: int, *threads: ThreadStack, host: str = "", method: str = "py-spy") -> RankStack:
    return RankStack(rank, host or f"n{rank // 4 + 1}", 1000 + rank, method, threads)


def bad(rank: int, error: str) -> RankStack:
    return RankStack(rank, f"n{rank // 4 + 1}", 1000 + rank, "none", (), error)


STEP = th(fr("<module>", line=100), fr("step", line=88), fr("all_reduce", TORCH, 2500))
# How a warm rank's main thread starts: the agent's frames above the user's <module>
WARM_START = (
    fr("<module>", "/venv/lib/python3.11/site-packages/agent/warm/zygote_main.py", 114),
    fr("main", "/venv/lib/python3.11/site-packages/agent/warm/zygote_main.py", 100),
    fr("serve", "/venv/lib/python3.11/site-packages/agent/warm/serve.py", 120),
    fr("become_rank", "/venv/lib/python3.11/site-packages/agent/warm/rank_start.py", 63),
    fr("run", "/venv/lib/python3.11/site-packages/agent/warm/script.py", 55),
    fr("_call", "/venv/lib/python3.11/site-packages/agent/warm/script.py", 98),
    fr("<lambda>", "/venv/lib/python3.11/site-packages/agent/warm/script.py", 52),
)
WARM_STEP = th(*WARM_START, *STEP.frames)
SITE = "/venv/lib/python3.11/site-packages"
LIGHTNING_HANG = th(
    fr("<module>", "/job/fit.py", 29),
    fr("fit", f"{SITE}/lightning/pytorch/trainer/trainer.py", 538),
    fr("training_step", "/job/fit.py", 12),
    fr("backward", f"{SITE}/torch/_tensor.py", 626),
    fr("_engine_run_backward", f"{SITE}/torch/autograd/graph.py", 823),
)
LOAD = th(fr("<module>", line=100), fr("load_batch", "/job/data.py", 40))
HELPER = th(fr("wait", THREADING, 320), name="pin_memory", idle=True)


def shape(groups: list[Group]) -> list[tuple]:
    return [(g.ranks, g.method, g.error, g.key_frame and g.key_frame.function) for g in groups]


@pytest.mark.parametrize(
    ("stacks", "expected"),
    [
        pytest.param([rs(r, STEP) for r in (2, 0, 1)], [((0, 1, 2), "py-spy", None, "step")]),
        pytest.param(
            [*(rs(r, STEP) for r in range(7)), rs(7, LOAD)],
            [((7,), "py-spy", None, "load_batch"), (tuple(range(7)), "py-spy", None, "step")],
            id="odd one out first",
        ),
        pytest.param(
            [rs(0, LOAD), rs(1, STEP), rs(2, LOAD), rs(3, STEP), rs(4, th(fr("x")))],
            [
                ((4,), "py-spy", None, "x"),
                ((0, 2), "py-spy", None, "load_batch"),
                ((1, 3), "py-spy", None, "step"),
            ],
            id="ties by lowest rank",
        ),
        pytest.param(
            [rs(0, STEP), rs(1, th(fr("<module>", line=100), fr("step", line=89)))],
            [((0,), "py-spy", None, "step"), ((1,), "py-spy", None, "step")],
            id="another line is another stack",
        ),
        pytest.param(
            [rs(0, STEP), rs(1, STEP, method="faulthandler"), rs(2, STEP)],
            [((1,), "faulthandler", None, "step"), ((0, 2), "py-spy", None, "step")],
            id="captured another way",
        ),
        pytest.param(
            [bad(3, "process exited"), rs(0, STEP), bad(1, "process exited"), bad(2, "py-spy: x")],
            [
                ((0,), "py-spy", None, "step"),
                ((2,), "none", "py-spy: x", None),
                ((1, 3), "none", "process exited", None),
            ],
            id="errors group by error",
        ),
        pytest.param(
            [
                rs(0, STEP, HELPER),
                rs(1, HELPER, th(fr("other", THREADING), name="t2", idle=True), STEP),
                rs(2, STEP),
            ],
            [((0, 1, 2), "py-spy", None, "step")],
            id="idle threads folded: ignored for grouping",
        ),
        pytest.param(
            [rs(0, STEP), rs(1, th(*STEP.frames, idle=True))],
            [((0, 1), "py-spy", None, "step")],
            id="idle main thread still compared, its state not",
        ),
        pytest.param(
            [rs(0, STEP, th(fr("spin"), name="a")), rs(1, th(fr("spin"), name="b"), STEP)],
            [((0, 1), "py-spy", None, "step")],
            id="active threads in any order, any name",
        ),
        pytest.param(
            [rs(0, STEP, th(fr("loads", THREADING), name="agent-probe")), rs(1, STEP)],
            [((0, 1), "py-spy", None, "step")],
            id="the agent's probe thread caught mid-answer sets no rank apart",
        ),
        pytest.param(
            [
                rs(0, th(fr("poll"), name="w", idle=True)),
                rs(1, th(fr("poll", line=2), name="w", idle=True)),
            ],
            [((0,), "py-spy", None, "poll"), ((1,), "py-spy", None, "poll")],
            id="no main, all idle: all compared",
        ),
        pytest.param([], [], id="nothing"),
    ],
)
def test_collate(stacks, expected):
    assert shape(collate(stacks)) == expected


@pytest.mark.parametrize(
    ("thread", "expected"),
    [
        pytest.param(STEP, fr("step", line=88), id="torch skipped"),
        pytest.param(
            th(
                fr("main"),
                fr("run", THREADING),
                fr("read", "/usr/lib/x86_64-linux-gnu/libc.so.6", 0),
            ),
            fr("main"),
            id="stdlib and native skipped",
        ),
        pytest.param(
            th(fr("f", "/opt/conda/lib/python3.10/site-packages/a.py", 5), fr("g", TORCH, 9)),
            fr("g", TORCH, 9),
            id="no user frame: innermost",
        ),
        pytest.param(
            th(fr("f", "/usr/lib/python3/dist-packages/x.py"), fr("<module>", "<frozen runpy>")),
            fr("<module>", "<frozen runpy>"),
            id="dist-packages and frozen",
        ),
        pytest.param(
            th(fr("user", "/home/me/python3.11/mine.py", 3)),
            fr("user", "/home/me/python3.11/mine.py", 3),
            id="python3.11 in a user path is not the stdlib",
        ),
        pytest.param(th(), None, id="no frames"),
        pytest.param(
            th(*WARM_START, fr("<module>", "/job/t.py", 2), fr("g", TORCH, 9)),
            fr("<module>", "/job/t.py", 2),
            id="the agent's warm start skipped",
        ),
    ],
)
def test_key_frame_is_the_innermost_user_frame(thread, expected):
    (group,) = collate([rs(0, thread)])
    assert group.key_frame == expected


def test_key_thread_is_the_main_one_else_the_first_active():
    busy = th(fr("busy", "/job/w.py", 7), name="worker")
    main_idle = th(fr("wait_here", "/job/m.py", 3), idle=True)
    assert collate([rs(0, busy, main_idle)])[0].key_frame == fr("wait_here", "/job/m.py", 3)
    idle = th(fr("idle_fn"), name="x", idle=True)
    assert collate([rs(0, idle, busy)])[0].key_frame == fr("busy", "/job/w.py", 7)


@pytest.mark.parametrize(
    ("stacks", "expected"),
    [
        pytest.param(
            [*(rs(r, STEP) for r in range(7)), rs(7, LOAD)],
            "rank 7 in load_batch (data.py:40); ranks 0-6 in all_reduce "
            "(torch/distributed/distributed_c10d.py:2500) called from step (train.py:88)",
            id="issue example",
        ),
        pytest.param(
            [rs(0, LIGHTNING_HANG)],
            "rank 0 in _engine_run_backward (torch/autograd/graph.py:823) called from "
            "training_step (fit.py:12)",
            id="blocked in a library: innermost frame and innermost user frame",
        ),
        pytest.param(
            [rs(0, th(fr("main", line=5), fr("wait", THREADING, 320)))],
            "rank 0 in wait (threading.py:320) called from main (train.py:5)",
            id="stdlib",
        ),
        pytest.param(
            [rs(0, th(fr("main"), fr("read", "/usr/lib/x86_64-linux-gnu/libc.so.6", 0)))],
            "rank 0 in read (libc.so.6:0) called from main (train.py:1)",
            id="native",
        ),
        pytest.param(
            [rs(0, th(fr("<module>", "<frozen runpy>", 88)))],
            "rank 0 in <module> (<frozen runpy>:88)",
            id="frozen, no user frame",
        ),
        pytest.param(
            [rs(0, th(fr("f", f"{SITE}/a.py", 5), fr("g", TORCH, 9)))],
            "rank 0 in g (torch/distributed/distributed_c10d.py:9)",
            id="no user frame: the innermost alone",
        ),
        pytest.param(
            [rs(0, th(*LOAD.frames, fr("spin", "/job/data.py", 44)))],
            "rank 0 in spin (data.py:44)",
            id="user code innermost: one frame",
        ),
        pytest.param(
            [rs(0, WARM_STEP), rs(1, STEP)],
            "ranks 0-1 in all_reduce (torch/distributed/distributed_c10d.py:2500) called from "
            "step (train.py:88)",
            id="a warm and a fresh rank at the same place: one group",
        ),
        pytest.param(
            [rs(0, th(*WARM_START))],
            "rank 0 in <lambda> (agent/warm/script.py:52)",
            id="stuck in the agent's warm start: named",
        ),
        pytest.param(
            [rs(0, LOAD), bad(1, "py-spy: Permission\n denied  " + "x" * 300)],
            "rank 0 in load_batch (data.py:40); rank 1: no stack (py-spy: Permission denied "
            + "x" * 74
            + ")",
            id="error, one line, cut",
        ),
        pytest.param(
            [rs(r, th(fr(f"f{r}", line=r + 1))) for r in range(6)],
            "rank 0 in f0 (train.py:1); rank 1 in f1 (train.py:2); rank 2 in f2 (train.py:3); "
            "rank 3 in f3 (train.py:4); and 2 more",
            id="at most four groups",
        ),
        pytest.param([], "", id="nothing"),
    ],
)
def test_headline(stacks, expected):
    assert headline(collate(stacks)) == expected


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([0, 1, 2, 5], "0-2,5"),
        ([5, 0, 1, 1, 2], "0-2,5"),
        ([3], "3"),
        ([0, 2, 4], "0,2,4"),
        ([], ""),
        (list(range(100_000)), "0-99999"),
        ([-2, -1, 0, 1, 3], "-2,-1,0-1,3"),
    ],
)
def test_format_ranges(ranks, text):
    assert format_ranges(ranks) == text


def test_render():
    stacks = [
        *(rs(r, STEP, HELPER, host=f"n{r // 2 + 1}") for r in (0, 1, 2, 5)),
        rs(3, LOAD, host="n2", method="faulthandler"),
        bad(4, "process exited"),
    ]
    assert render(collate(stacks)) == (
        "---- rank 3 (1 rank on n2, faulthandler) ----\n"
        "Thread MainThread\n"
        "  /job/train.py:100 in <module>\n"
        "  /job/data.py:40 in load_batch\n"
        "---- rank 4 (1 rank on n2) ----\n"
        "  no stack: process exited\n"
        "---- ranks 0-2,5 (4 ranks on n[1-3]) ----\n"
        "Thread MainThread (active)\n"
        "  /job/train.py:100 in <module>\n"
        "  /job/train.py:88 in step\n"
        f"  {TORCH}:2500 in all_reduce\n"
        "  (1 idle thread folded)\n"
    )


@pytest.mark.parametrize(
    ("hosts", "label"),
    [
        (["n1", "n2", "n10"], "n[1-2,10]"),
        (["gpu-a", "gpu-a"], "gpu-a"),
        (["a,b", "x[1"], "a,b,x[1"),
        (["node-1.example.com", "node-2.example.com"], "node-[1-2].example.com"),
    ],
)
def test_render_hostlist(hosts, label):
    stacks = [rs(rank, STEP, host=host) for rank, host in enumerate(hosts)]
    header = render(collate(stacks)).splitlines()[0]
    count = f"{len(hosts)} rank{'s' if len(hosts) > 1 else ''}"
    assert header == f"---- ranks {format_ranges(range(len(hosts)))} ({count} on {label}) ----"


def test_render_folds_the_agents_warm_start():
    """`agent stacks` and stacks-a<k>.txt show a warm rank's own frames: the agent's are one line."""
    assert render(collate([rs(0, WARM_STEP)])) == (
        "---- rank 0 (1 rank on n1) ----\n"
        "Thread MainThread (active)\n"
        "  (7 frames of the agent's warm start folded)\n"
        "  /job/train.py:100 in <module>\n"
        "  /job/train.py:88 in step\n"
        f"  {TORCH}:2500 in all_reduce\n"
    )


def test_render_idle_main_thread_and_colour():
    stacks = [rs(0, th(*STEP.frames, idle=True), HELPER, HELPER)]
    plain = render(collate(stacks))
    assert "Thread MainThread (idle)\n" in plain and "(2 idle threads folded)" in plain
    assert "\x1b[" not in plain
    coloured = render(collate(stacks), colour=True)
    assert "\x1b[1m---- rank 0" in coloured
    assert "\x1b[33m  /job/train.py:88 in step\x1b[0m" in coloured  # the key frame


def test_render_is_bounded():
    """Many distinct, deep, long-named stacks: cut at MAX_RENDER bytes with a note."""
    long = "f" * 500
    stacks = [
        rs(r, th(*(fr(long, f"/job/{r}.py", i + 1) for i in range(MAX_FRAMES)))) for r in range(300)
    ]
    text = render(collate(stacks))
    assert len(text.encode()) <= MAX_RENDER + 200
    assert text.endswith("group(s) not all shown\n")
    assert text.startswith("---- rank 0 ")


# --- the records ------------------------------------------------------------------------------


def test_json_round_trip():
    stack = rs(3, STEP, HELPER, host="n7")
    assert RankStack.from_json(json.loads(json.dumps(stack.to_json()))) == stack
    failed = bad(4, "process exited")
    assert RankStack.from_json(failed.to_json()) == failed


def record(**changes: object) -> dict:
    data = rs(1, STEP).to_json()
    data.update(changes)
    return data


@pytest.mark.parametrize(
    "data",
    [
        pytest.param([], id="not an object"),
        pytest.param(record(rank=True), id="bool rank"),
        pytest.param(record(rank="1"), id="str rank"),
        pytest.param(record(pid=2**70), id="huge pid"),
        pytest.param(record(host=None), id="no host"),
        pytest.param(record(error=3), id="error not str"),
        pytest.param(record(threads={}), id="threads not list"),
        pytest.param(record(threads=[1]), id="thread not object"),
        pytest.param(record(threads=[{"name": "a", "idle": 1, "frames": []}]), id="idle int"),
        pytest.param(record(threads=[{"name": "a", "frames": [["f", "x"]]}]), id="short frame"),
        pytest.param(record(threads=[{"name": "a", "frames": [["f", "x", 1.5]]}]), id="line"),
        pytest.param(record(threads=[{"name": "a", "frames": {}}]), id="frames not list"),
    ],
)
def test_from_json_rejects(data):
    with pytest.raises(ValueError):
        RankStack.from_json(data)


def test_from_json_bounds_what_it_keeps():
    frames = [[f"f{i}", "x" * 5000, i] for i in range(1000)]
    threads = [{"name": "n" * 9999, "idle": False, "frames": frames} for _ in range(200)]
    stack = RankStack.from_json(
        record(threads=threads, host="h" * 9999, method="gdb", error="a\nb" + "c" * 9999)
    )
    assert len(stack.threads) == MAX_THREADS and stack.method == "none"
    assert len(stack.threads[0].frames) == MAX_FRAMES
    assert stack.threads[0].frames[-1] == Frame("f999", "x" * MAX_TEXT, 999)
    assert len(stack.threads[0].name) == len(stack.host) == len(stack.error) == MAX_TEXT
    assert stack.error.startswith("a b")
