"""One id for a job or run everywhere (agent.plan.run_id, pure): the log dir's name, the
history's id, the `agent run` client's words and what logs/stacks/debug/history take."""

from __future__ import annotations

import os
import sqlite3
import time

import pytest

from agent import history
from agent.history import store
from agent.history.record import from_summary
from agent.plan.run_id import copied, local_job, named_by, run_id


@pytest.mark.parametrize(
    ("job", "step", "run", "copy", "text"),
    [
        ("8", "0", None, 1, "8.0"),  # a one-shot job: job 8, step 0
        ("8", "3", None, 1, "8.3"),
        ("8", "0", 3, 1, "8.0.r3"),  # run 3 of the resident agents serving in step 0
        ("8", "0", 0, 1, "8.0.r0"),
        ("8", "0", None, 2, "8.0-2"),  # the second job whose log dir would be logs/8.0
        ("8", "0", 3, 4, "8.0.r3-4"),
        ("torch-run-7", "", None, 1, "torch-run-7"),  # a job id without steps (k8s, --job-id)
        ("local-20250102-030405-42", "", None, 1, "local-20250102-030405-42"),
        ("local-20250102-030405-42", "", 1, 1, "local-20250102-030405-42.r1"),
    ],
)
def test_the_id_of_a_job_or_run(job, step, run, copy, text):
    assert run_id(job, step, run, copy) == text


def test_copies_of_a_name():
    assert [copied("logs/8.0", k) for k in (1, 2, 3)] == ["logs/8.0", "logs/8.0-2", "logs/8.0-3"]
    assert copied("logs/mine/", 2) == "logs/mine-2"


def test_a_local_job_is_named_by_when_and_which_process():
    when = time.mktime((2025, 1, 2, 3, 4, 5, 0, 0, -1))
    assert local_job(when, 42) == "local-20250102-030405-42"


@pytest.mark.parametrize(
    ("query", "found", "named"),
    [
        ("8.0", "8.0", True),
        ("8", "8.0", True),  # a job id names each of its steps ...
        ("8", "8.1.r2", True),  # ... and runs
        ("8.0", "8.0.r3", True),  # a serving step names its runs
        ("8.0.r3", "8.0.r3", True),
        ("8.0.r3", "8.0.r31", False),
        ("8.0", "8.0-2", False),  # another job that wanted the same log dir
        ("8", "80.0", False),
        ("8.0.r3", "8.0", False),
        ("", "8.0", False),
    ],
)
def test_which_jobs_an_id_names(query, found, named):
    assert named_by(query, found) is named


def _summary(**job) -> dict:
    return {"job": {"id": "8", "step": "0", **job}, "exit_code": 0, "attempts": []}


@pytest.mark.parametrize(
    ("typed", "named"),
    [
        ("8.0.r3", True),
        ("8.0", True),
        ("8", True),
        ("8.0.r3-2", False),
        ("/work/logs/8.0.r3", True),  # its log dir by path ...
        ("/work/logs/8.0.r3/", True),
        ("8.0.r3", True),  # ... and by name (here the same as the id)
        ("/other/logs/8.0.r3", False),
    ],
)
def test_what_agent_history_takes_for_a_run(typed, named):
    record = from_summary(_summary(run_id="8.0.r3", log_dir="/work/logs/8.0.r3"), 0.0)
    assert history.names(typed, record) is named


def test_a_job_in_a_log_dir_of_its_own_name_is_found_by_that_name():
    record = from_summary(_summary(run_id="8.0", log_dir="/work/runs/mine-2"), 0.0)
    assert history.names("mine-2", record) and not history.names("mine", record)


def test_a_summary_of_an_older_version_gets_the_id_its_job_and_step_make():
    assert from_summary(_summary(), 0.0).run_id == "8.0"
    assert from_summary({"job": {"id": "9"}}, 0.0).run_id == "9"


OLD_SCHEMA = """CREATE TABLE jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, run INTEGER NOT NULL,
    step TEXT, command TEXT, start_time REAL, end_time REAL, nodes INTEGER, ranks INTEGER,
    spares_used TEXT, exit_code INTEGER, status TEXT, cause TEXT, restarts INTEGER,
    stragglers TEXT, log_dir TEXT)"""


def test_a_database_of_an_older_version_is_read_and_then_extended(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    path = state / store.FILE_NAME
    con = sqlite3.connect(path)
    con.execute(OLD_SCHEMA)
    con.execute(
        "INSERT INTO jobs (job_id, run, step, start_time, end_time, exit_code, status, log_dir) "
        "VALUES ('5', 0, '1', 1.0, 2.0, 0, 'succeeded', '/l/5.1')"
    )
    con.commit()
    con.close()
    (old,) = store.read(path)
    assert old.record.run_id == "5.1"  # its job and step
    environ = {"AGENT_STATE_DIR": str(state), "TMPDIR": str(tmp_path / "tmp")}
    new = from_summary(_summary(run_id="8.0.r3", log_dir="/l/8.0.r3"), 3.0)
    assert store.append(new, environ, tmp_path, os.getuid(), pytest.fail) == path
    assert [s.record.run_id for s in store.read(path)] == ["5.1", "8.0.r3"]


def test_agent_logs_stacks_and_debug_find_a_log_dir_by_its_id(tmp_path, monkeypatch):
    state = tmp_path / "state"
    elsewhere = tmp_path / "runs" / "mine"
    elsewhere.mkdir(parents=True)
    environ = {
        "AGENT_STATE_DIR": str(state),
        "TMPDIR": str(tmp_path / "tmp"),
        "HOME": "/nonexistent",
    }
    record = from_summary(_summary(run_id="8.0.r3", log_dir=str(elsewhere)), 3.0)
    store.append(record, environ, tmp_path, os.getuid(), pytest.fail)
    here = tmp_path / "cwd"
    (here / "logs" / "9.0").mkdir(parents=True)
    monkeypatch.chdir(here)
    assert history.log_dir_of("8.0.r3", environ) == str(elsewhere)  # the history's
    assert history.log_dir_of("mine", environ) == str(elsewhere)  # its name
    assert history.log_dir_of("9.0", environ) == os.path.join("logs", "9.0")  # logs/ID here
    assert history.log_dir_of(str(elsewhere), environ) == str(elsewhere)  # a dir: itself
    assert history.log_dir_of("8.0", environ) == "8.0"  # a parent names no one log dir
    assert history.log_dir_of("nope", environ) == "nope"
