"""A job's running record, judged (agent.history.liveness): still running, or killed before it
could write its summary. Real processes and real sockets: this test's own process, a child that
exits, a listening socket and a closed port."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from agent.history.liveness import (
    ENDED,
    KILLED,
    KILLED_WORDS,
    RUNNING,
    alive,
    answers,
    node0_record,
    state,
    unfinished,
)


def running(node0) -> dict:
    return {"job": {"run_id": "8.0"}, "status": "running", "node0": node0}


def gone_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def listening():
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return probe.getsockname()[1]  # closed again: nothing listens there


def test_a_record_with_a_verdict_is_ended_whatever_else_it_says():
    for summary in (
        {"status": "succeeded"},
        {"status": "failed", "node0": node0_record("h", "127.0.0.1", 1)},
        None,
        [],
        {},
    ):
        assert state(summary) == ENDED


def test_node_0_here_and_alive_is_running():
    assert state(running(node0_record("n1", "127.0.0.1", 0))) == RUNNING


def test_node_0_here_and_gone_is_killed():
    record = node0_record("n1", "127.0.0.1", 0)
    assert state(running({**record, "pid": gone_pid()})) == KILLED
    # The same pid, another process (started at another time): pids are used again.
    assert state(running({**record, "process_start": record["process_start"] - 1})) == KILLED
    # This machine was booted again since: its processes are all gone.
    assert state(running({**record, "boot": "another-boot"})) == KILLED


def test_a_zombie_is_not_alive():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    record = {**node0_record("n1", "127.0.0.1", 0), "pid": child.pid}
    with open(f"/proc/{child.pid}/stat", "rb") as f:
        stat = f.read()
    record["process_start"] = int(stat[stat.rindex(b")") + 2 :].split()[19])
    assert alive(record)
    child.stdin.close()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert not alive(record)
    child.wait()


def test_node_0_elsewhere_is_asked_at_its_endpoint(listening):
    elsewhere = {**node0_record("n9", "127.0.0.1", listening), "machine": "another-machine"}
    assert state(running(elsewhere)) == RUNNING
    assert state(running({**elsewhere, "port": free_port()})) == KILLED


@pytest.mark.parametrize(
    ("address", "port"),
    [(None, 80), ("", 80), ("127.0.0.1", 0), ("127.0.0.1", 70000), ("127.0.0.1", True)],
)
def test_an_endpoint_that_cannot_be_asked_does_not_answer(address, port):
    assert not answers(address, port, timeout=0.5)


def test_a_record_naming_no_agent_is_killed():
    for node0 in (None, "x", {}, {"machine": socket.gethostname(), "pid": "1"}):
        assert state(running(node0)) == KILLED


def test_the_line_a_log_dir_gets(tmp_path, listening):
    summary = tmp_path / "summary.json"
    assert unfinished(str(tmp_path)) is None  # no record
    summary.write_text(json.dumps(running(node0_record("n1", "127.0.0.1", 0))))
    state_, line = unfinished(str(tmp_path))
    assert state_ == RUNNING and line.startswith("job 8.0 is running (node 0's agent: pid ")
    dead = {**node0_record("n1", "127.0.0.1", 0), "pid": gone_pid()}
    summary.write_text(json.dumps(running(dead)))
    assert unfinished(str(tmp_path)) == (KILLED, f"job 8.0 {KILLED_WORDS}")
    summary.write_text(json.dumps({"job": {"run_id": "8.0\x1b[2J"}, "status": "running"}))
    assert unfinished(str(tmp_path)) == (KILLED, f"job 8.0\\x1b[2J {KILLED_WORDS}")
    summary.write_text(json.dumps({"status": "succeeded"}))
    assert unfinished(str(tmp_path)) is None


@pytest.mark.parametrize(
    ("record", "judged"),
    [
        ({"status": "running", "job": {"run_id": "9.1"}}, (KILLED, f"job 9.1 {KILLED_WORDS}")),
        ({"status": "failed", "attempts": "not a list"}, None),  # a verdict: not read further
        ({"status": ["running"]}, None),
        ({}, None),
    ],
)
def test_a_record_the_caller_read_is_judged_as_given(tmp_path, record, judged):
    """`agent logs --summary` reads summary.json once and hands it over: the file on disk (here
    another job's running record) is not read again."""
    other = {**running(node0_record("n1", "127.0.0.1", 0)), "job": {"run_id": "other"}}
    (tmp_path / "summary.json").write_text(json.dumps(other))
    assert unfinished(str(tmp_path), record) == judged
