"""A stop for preemption: the record and its words (agent.run.preemption, pure), what the
checkpoint dir holds after the signal and the record the next job reads there
(agent.run.checkpoint_dir), and the history's line (agent.history.record)."""

from __future__ import annotations

import json
import os
import queue
import signal

import pytest

from agent.history import store
from agent.history.record import from_summary
from agent.history.view import job_facts, job_rows
from agent.node.result import Result
from agent.node.signals import ARRIVALS_KEPT, Signals
from agent.run.checkpoint_dir import MARKER, newest_after, previous_stop, read_marker, write_marker
from agent.run.preemption import Written, furthest_step, judge_stop, previous_stop_line
from agent.run.summary import build_summary, render_report

T = 1_700_000_000.0
RANKS = [
    {"rank": 0, "how": "exit code 0", "state": "succeeded", "end": T + 3},
    {"rank": 1, "how": "exit code 0", "state": "succeeded", "end": T + 4},
    {"rank": 2, "how": "killed by SIGKILL", "end": T + 9},
    {"rank": -1, "how": "did not exit (agent lost)"},  # a node's own record: no rank
]


@pytest.mark.parametrize(
    ("step", "written", "line"),
    [
        (40, Written("ckpt/step-40", T + 2, 3),
         "stopped for preemption at step 40; checkpoint written: ckpt/step-40"),
        (40, None, "stopped for preemption at step 40; no checkpoint written after the signal"),
        (None, None, "stopped for preemption; no checkpoint written after the signal"),
        (None, Written("ckpt/last.pt", T + 1, 1),
         "stopped for preemption; checkpoint written: ckpt/last.pt"),
    ],
)  # fmt: skip
def test_the_line_says_the_step_and_what_was_written(step, written, line):
    stop = judge_stop("SIGUSR2", T, step, "ckpt", written, RANKS)
    assert stop.line() == line
    assert stop.saved is (written is not None)
    data = stop.to_json()
    assert data["line"] == line and data["step"] == step and data["signal"] == "SIGUSR2"
    assert data["exits"] == {"exit code 0": "0-1", "killed by SIGKILL": "2"}
    assert data["last_exit"] == T + 9
    assert json.loads(json.dumps(data)) == data
    assert "SIGUSR2 at " in stop.details() and "the last 9.0 s after it" in stop.details()


def test_exits_are_ranges_and_bounded():
    ranks = [{"rank": r, "how": f"exit code {r % 30}"} for r in range(3000)]
    stop = judge_stop("SIGTERM", T, None, "d", None, ranks)
    assert len(stop.exits) == 20
    assert stop.last_exit is None and "none ran" not in stop.details()
    assert judge_stop("SIGTERM", T, None, "d", None, []).details().endswith("ranks none ran")


@pytest.mark.parametrize(
    ("results", "step"),
    [([{}, {"step": 7}, {"step": 9}], 9), ([{}, {"step": True}, {"step": "9"}], None), ([], None)],
)
def test_furthest_step_from_the_nodes_results(results, step):
    """Each node's result as read from the store (a step of the wrong type is none)."""
    assert furthest_step([Result.from_json(r) for r in results]) == step


def test_report_and_history_carry_the_line():
    stop = judge_stop("SIGUSR2", T, 12, "ckpt", None, RANKS[:2])
    summary = build_summary({"id": "8", "step": "0"}, [{"attempt": 0, "ranks": RANKS[:2]}], 0)
    summary["preemption"] = stop.to_json()
    report = render_report(summary).splitlines()
    assert report[1] == "stopped for preemption at step 12; no checkpoint written after the signal"
    assert from_summary(summary, T).stop == report[1]
    assert from_summary({**summary, "preemption": {"line": 5}}, T).stop is None
    assert from_summary({k: v for k, v in summary.items() if k != "preemption"}, T).stop is None


def test_newest_after_names_the_top_entry_of_the_newest_file(tmp_path):
    old = tmp_path / "step-10"
    old.mkdir()
    (old / "shard-0.pt").write_text("x")
    os.utime(old / "shard-0.pt", (T - 5, T - 5))
    assert newest_after(str(tmp_path), T) is None  # written before the signal: not after it
    new = tmp_path / "step-20" / "model"
    new.mkdir(parents=True)
    for i, when in enumerate((T + 1, T + 3)):
        (new / f"shard-{i}.pt").write_text("x")
        os.utime(new / f"shard-{i}.pt", (when, when))
    (tmp_path / MARKER).write_text("{}")  # the agent's own record is no checkpoint
    found = newest_after(str(tmp_path), T, shown="ckpt")
    assert found == Written("ckpt/step-20", T + 3, 2)
    assert newest_after(str(tmp_path / "absent"), T) is None


def test_newest_after_follows_no_symlink_and_stops_at_its_bound(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "new.pt").write_text("x")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "link").symlink_to(outside)
    (ckpt / "file-link.pt").symlink_to(outside / "new.pt")
    assert newest_after(str(ckpt), 0.0) is None
    for i in range(50):
        (ckpt / f"f{i}").write_text("x")
    found = newest_after(str(ckpt), 0.0, limit=10)
    assert found is not None and found.files <= 10


def test_the_marker_speaks_for_the_last_stop_only(tmp_path):
    directory = str(tmp_path / "ckpt")
    unsaved = judge_stop("SIGUSR2", T, 5, directory, None, RANKS)
    write_marker(directory, "8.0", unsaved)  # creates the dir
    line = previous_stop(directory)
    assert line == (
        "this job follows job 8.0, stopped for preemption at step 5; no checkpoint written "
        "after the signal: it resumes from an older checkpoint, or from the start"
    )
    saved = judge_stop("SIGUSR2", T, 5, directory, Written(f"{directory}/a", T + 1, 1), RANKS)
    write_marker(directory, "9.0", saved)
    assert read_marker(directory)["saved"] is True and previous_stop(directory) is None
    write_marker(directory, "9.0", unsaved)
    write_marker(directory, "10.0", None)  # a job that was not stopped: no older record stays
    assert read_marker(directory) is None and sorted(os.listdir(directory)) == []


@pytest.mark.parametrize(
    "text",
    ["", "[1]", '{"saved": false}', '{"saved": false, "job": 8, "line": "x"}', "{" * 100_000,
     '{"saved": "false", "job": "8", "line": "x"}'],
)  # fmt: skip
def test_an_odd_marker_says_nothing(tmp_path, text):
    (tmp_path / MARKER).write_text(text)
    assert previous_stop(str(tmp_path)) is None


def test_a_marker_that_is_no_regular_file_is_not_read(tmp_path):
    os.mkfifo(tmp_path / MARKER)  # a reader that opened it would wait forever
    assert read_marker(str(tmp_path)) is None
    assert previous_stop_line(None) is None


def test_the_history_keeps_the_line_and_shows_it(tmp_path):
    state = tmp_path / "state"
    stop = judge_stop("SIGUSR2", T, 3, "ckpt", Written("ckpt/a.pt", T + 1, 1), RANKS[:2])
    summary = build_summary(
        {"id": "9", "step": "0", "log_dir": "/l"}, [{"attempt": 0, "ranks": RANKS[:2]}], 0
    )
    summary["preemption"] = stop.to_json()
    environ = {"AGENT_STATE_DIR": str(state), "TMPDIR": str(tmp_path / "tmp")}
    warned: list[str] = []
    path = store.append(from_summary(summary, T), environ, tmp_path, os.getuid(), warned.append)
    assert path is not None and not warned
    (stored,) = store.read(path, match=lambda record: True)
    line = "stopped for preemption at step 3; checkpoint written: ckpt/a.pt"
    assert stored.record.stop == line
    assert f"  {line}" in job_facts(stored)
    (cells, _), *_ = job_rows([stored])
    assert line[:40] in " ".join(cells)  # a job with no root cause shows its stop there


def test_another_users_file_proves_nothing(tmp_path):
    (tmp_path / "last.pt").write_text("x")
    assert newest_after(str(tmp_path), 0.0, uid=os.getuid() + 1) is None
    assert newest_after(str(tmp_path), 0.0) is not None


def test_the_first_arrival_in_the_run_counts():
    signals = Signals(queue.SimpleQueue())
    assert signals.first_since(signal.SIGUSR2, 0.0) is None
    signals._handle(signal.SIGUSR2, None)  # what the installed handler does on arrival
    first = signals.first_since(signal.SIGUSR2, 0.0)
    assert first is not None and signals.first_since(signal.SIGUSR2, first + 3600) is None
    for _ in range(ARRIVALS_KEPT + 5):  # bounded, the latest kept
        signals._handle(signal.SIGUSR2, None)
    assert len(signals.arrived[signal.SIGUSR2]) == ARRIVALS_KEPT
    assert signals.first_since(signal.SIGUSR1, 0.0) is None
