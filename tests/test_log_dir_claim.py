"""A log dir holds one job: node 0 claims it before the plan goes out, and a directory that holds
another job's files is never written into (agent.run.outputs.claim_log_dir: the next free name)."""

from __future__ import annotations

import os
import threading

import pytest

from agent.errors import AgentError
from agent.plan.log_dir import job_files
from agent.plan.run_id import copied
from agent.run.outputs import claim_log_dir


@pytest.mark.parametrize(
    ("names", "found"),
    [
        ([], []),
        (["notes.txt", "data", "rank.py"], []),  # the user's own files: not a job's
        (["rank-00003.out"], ["rank-00003.out"]),
        (["rank-00003.r1.err", "x"], ["rank-00003.r1.err"]),
        (["agent-00000.log", "summary.json"], ["agent-00000.log", "summary.json"]),
        (["resolved-config.agent-00001.json"], ["resolved-config.agent-00001.json"]),
        (
            ["ranks.json", "control.json", "metrics.prom"],
            ["control.json", "metrics.prom", "ranks.json"],
        ),
        (["stacks-a0.txt", "nccl-trace.a0.rank-3"], ["nccl-trace.a0.rank-3", "stacks-a0.txt"]),
        ([".summary-reserve"], [".summary-reserve"]),  # claimed by a job that just started
        (["summary.json.bak", "rank-x.out", "agent.log"], []),
    ],
)
def test_which_entries_are_a_jobs_files(names, found):
    assert job_files(names) == found


def test_the_names_tried_in_turn():
    assert [copied("logs/8.0", k) for k in (1, 2, 3)] == ["logs/8.0", "logs/8.0-2", "logs/8.0-3"]


def test_a_new_or_empty_dir_or_one_of_the_users_own_files_is_used(tmp_path):
    fresh = tmp_path / "fresh"
    assert claim_log_dir(str(fresh)) == (str(fresh), 1, None)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert claim_log_dir(str(empty)) == (str(empty), 1, None)
    own = tmp_path / "own"
    own.mkdir()
    (own / "notes.txt").write_text("mine")
    assert claim_log_dir(str(own)) == (str(own), 1, None)
    assert (own / "notes.txt").read_text() == "mine"


def test_another_jobs_dir_is_never_written_into(tmp_path):
    first = tmp_path / "logs"
    first.mkdir()
    (first / "rank-00000.out").write_text("job one\n")
    (tmp_path / "logs-2").mkdir()
    (tmp_path / "logs-2" / "summary.json").write_text("{}")
    where, copy, note = claim_log_dir(str(first))
    assert (where, copy) == (str(tmp_path / "logs-3"), 3)
    assert (
        note
        == f"log dir {first} holds another job's files (rank-00000.out): this job's logs go to {where}"
    )
    assert sorted(os.listdir(first)) == ["rank-00000.out"]
    # Claimed at once: the next job asking for the same name goes further on.
    assert claim_log_dir(str(first))[0] == str(tmp_path / "logs-4")


def test_two_jobs_claiming_one_name_at_once_get_two_dirs(tmp_path):
    wanted = str(tmp_path / "logs")
    got: list[str] = []
    start = threading.Barrier(8)

    def claim() -> None:
        start.wait()
        got.append(claim_log_dir(wanted)[0])

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(got) == sorted([wanted] + [f"{wanted}-{k}" for k in range(2, 9)])


def test_a_dir_that_cannot_be_written_is_one_line(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(AgentError, match="not writable"):
        claim_log_dir(str(locked / "logs"))
