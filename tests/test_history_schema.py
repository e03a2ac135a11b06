"""The history database carries its version (PRAGMA user_version) and the store migrates an
older one: tests/fixtures/history-v0.sql is a database exactly as the agent wrote it before
versions were kept (made by tests/fixtures/history_v0.py with that agent's own code)."""

from __future__ import annotations

import os
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest
from fixtures.history_v0 import FINISHED, NOW, RUNNING

from agent.history import store
from agent.history.record import from_summary

FIXTURE = Path(__file__).parent / "fixtures" / "history-v0.sql"


def _database(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    path = state / store.FILE_NAME
    con = sqlite3.connect(path)
    con.executescript(FIXTURE.read_text())
    con.close()
    return path


def _append(path: Path, summary: dict) -> Path | None:
    environ = {"AGENT_STATE_DIR": str(path.parent), "TMPDIR": str(path.parent.parent / "tmp")}
    warnings: list[str] = []
    where = store.append(
        from_summary(summary, NOW), environ, path.parent, os.getuid(), warnings.append
    )
    assert warnings == []
    return where


def test_todays_database_is_read_as_it_is(tmp_path):
    path = _database(tmp_path)
    assert store.version_of(path) == 0
    jobs = store.read(path, match=lambda record: True)
    assert [(s.record.run_id, s.run, s.record.status) for s in jobs] == [
        ("77.0", 0, "failed"), ("78.0", 0, "running"), ("77.0", 1, "succeeded"),
    ]  # fmt: skip
    first = jobs[0].record
    # every column read back as it was written: by the code of the time, which counted the
    # ranks a lost node took with it once (today's counts them by the node's planned range)
    today = from_summary(FINISHED, NOW)
    then = (replace(today.attempts[0], ranks=2), *today.attempts[1:])
    assert first == replace(today, attempts=then)
    assert [a.failure_class for a in first.attempts] == ["infrastructure", "program"]
    assert jobs[1].record.node0 is not None and jobs[1].record.node0["pid"] == 4242


def test_todays_database_is_migrated_at_the_next_append(tmp_path):
    """The running record of job 78 ends: its final record takes the old row's place (the same
    run number), the database is marked with this version, and every old row reads the same."""
    path = _database(tmp_path)
    before = store.read(path, match=lambda record: True)
    final = {**RUNNING, "status": "succeeded", "exit_code": 0, "node0": None}
    assert _append(path, final) == path
    assert store.version_of(path) == store.VERSION >= 1
    after = store.read(path, match=lambda record: True)
    assert [s.record for s in after if s.record.run_id != "78.0"] == [
        s.record for s in before if s.record.run_id != "78.0"
    ]
    (ended,) = [s for s in after if s.record.run_id == "78.0"]
    assert (ended.run, ended.record.status, ended.record.exit_code) == (0, "succeeded", 0)
    # appended again: nothing to migrate, nothing changes but the new row
    assert _append(path, FINISHED) == path
    assert [s.run for s in store.read(path, "77")] == [0, 1, 2]


def test_a_database_of_a_newer_version_keeps_its_version_and_gets_the_columns_we_write(tmp_path):
    """A newer agent's database: its version stays; a column this agent writes that it lacks is
    added (adding a column breaks no reader), so the job is recorded there, not elsewhere."""
    path = _database(tmp_path)
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA user_version = {store.VERSION + 1}")
    con.commit()
    con.close()
    assert _append(path, FINISHED) == path
    assert store.version_of(path) == store.VERSION + 1
    assert len(store.read(path)) == 4


@pytest.mark.parametrize("missing", [True, False])
def test_no_database_is_version_0_and_a_new_one_is_current(tmp_path, missing):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    path = state / store.FILE_NAME
    assert store.version_of(path) == 0
    if not missing:
        _append(path, FINISHED)
        assert store.version_of(path) == store.VERSION


def test_an_older_database_without_the_added_columns_is_migrated_too(tmp_path):
    """The schema before run ids, node 0's record, the budgets and the failure classes (as
    tests/test_history.py builds it): version 0 too, brought to this version at its append."""
    from test_history import OLD_SCHEMA

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    path = state / store.FILE_NAME
    con = sqlite3.connect(path)
    for statement in OLD_SCHEMA:
        con.execute(statement)
    con.commit()
    con.close()
    assert store.version_of(path) == 0
    assert _append(path, FINISHED) == path
    assert store.version_of(path) == store.VERSION
    old, new = store.read(path, match=lambda record: True)
    assert (old.record.run_id, old.record.cause, old.record.max_restarts) == (
        "70.0",
        "it broke",
        None,
    )
    assert new.record == from_summary(FINISHED, NOW)
