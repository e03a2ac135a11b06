"""agent.control.connection: the per-job file that tells clients where node 0's agent listens."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
from cluster import REPO

from agent.control import connection, wire
from agent.errors import AgentError, ExitCode

RECORD = {
    "host": "10.0.0.7",
    "port": 29517,
    "job": "4242",
    "step": "0",
    "pid": 31337,
    "hostname": "gpu-node-07",
    "started": 1700000000.5,
}


def error_of(call, *args) -> AgentError:
    with pytest.raises(AgentError) as excinfo:
        call(*args)
    assert "\n" not in excinfo.value.message
    return excinfo.value


def test_write_then_read_round_trip_private_and_atomic(tmp_path):
    home = tmp_path / "home"
    path = connection.path_for({}, home, "4242")
    assert path == home / ".cache" / "launch-agent" / "serve-4242.json"
    old_umask = os.umask(0)  # the modes must not depend on the caller's umask
    try:
        connection.write(path, RECORD)
    finally:
        os.umask(old_umask)
    assert connection.read(path) == RECORD
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    connection.write(path, {**RECORD, "port": 29518, "extra": [1]})  # replaced in place
    assert connection.read(path)["port"] == 29518
    assert sorted(p.name for p in path.parent.iterdir()) == ["serve-4242.json"]  # no temp left


def test_the_state_dir_follows_agent_state_dir(tmp_path):
    env = {connection.STATE_ENV: str(tmp_path / "state")}
    assert connection.path_for(env, tmp_path, "7") == tmp_path / "state" / "serve-7.json"
    assert connection.state_dir({connection.STATE_ENV: ""}, tmp_path) == (
        tmp_path / ".cache" / "launch-agent"
    )


def test_write_refuses_incomplete_records_and_unwritable_dirs(tmp_path):
    assert (
        "pid is missing"
        in error_of(
            connection.write, tmp_path / "x.json", {k: v for k, v in RECORD.items() if k != "pid"}
        ).message
    )
    blocker = tmp_path / "file"
    blocker.write_text("")
    message = error_of(connection.write, blocker / "serve-1.json", RECORD).message
    assert str(blocker) in message and connection.STATE_ENV in message


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"{not json", "not JSON"),
        (b"\xff\xfe\x00", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b"x" * (connection.MAX_BYTES + 1), "over"),
        (json.dumps({**RECORD, "port": "29517"}).encode(), "port is not int"),
        (json.dumps({**RECORD, "port": True}).encode(), "port is not int"),
        (json.dumps({**RECORD, "port": 0}).encode(), "out of range"),
        (json.dumps({**RECORD, "port": 65536}).encode(), "out of range"),
        (json.dumps({**RECORD, "pid": 1.5}).encode(), "pid is not int"),
        (json.dumps({**RECORD, "host": ""}).encode(), "host is empty"),
        (json.dumps({**RECORD, "host": "a" * 64 + ".x"}).encode(), "not a host name"),
        (json.dumps({**RECORD, "host": "\udcff"}).encode(), "not a host name"),
        (json.dumps({**RECORD, "started": "today"}).encode(), "started is not int or float"),
        (json.dumps({k: v for k, v in RECORD.items() if k != "job"}).encode(), "job is missing"),
    ],
)
def test_a_damaged_file_is_one_line_naming_it_and_the_fix(tmp_path, content, problem):
    path = tmp_path / "serve-4242.json"
    path.write_bytes(content)
    error = error_of(connection.read, path)
    assert error.code == ExitCode.RENDEZVOUS and problem in error.message
    assert str(path) in error.message and "agent serve" in error.message


def test_reading_a_directory_or_a_missing_file_is_an_error(tmp_path):
    unreadable = error_of(connection.read, tmp_path)
    assert unreadable.code == ExitCode.RENDEZVOUS and "cannot read it" in unreadable.message
    missing = error_of(connection.read, tmp_path / "gone.json")
    assert missing.code == ExitCode.RENDEZVOUS and "does not exist" in missing.message


@pytest.mark.parametrize(
    ("job_id", "accepted"),
    [
        ("4242", True),
        ("4242_7", True),
        ("a.b-c", True),
        ("x" * 128, True),
        ("x" * 129, False),
        ("", False),
        ("a/b", False),
        ("/etc/passwd", False),
        ("..", False),
        ("../4242", False),
        ("a\\b", False),
        ("42\x0042", False),
        ("42\n42", False),
    ],
)
def test_job_ids_that_could_leave_the_state_dir_are_refused(tmp_path, job_id, accepted):
    if accepted:
        path = connection.path_for({}, tmp_path, job_id)
        assert path.parent == tmp_path / ".cache" / "launch-agent"
        assert path.name == f"serve-{job_id}.json"
    else:
        error = error_of(connection.path_for, {}, tmp_path, job_id)
        assert error.code == ExitCode.USAGE and "cannot name a connection file" in error.message


@pytest.mark.parametrize(
    ("env", "explicit", "expected", "code", "words"),
    [
        ({"SLURM_JOB_ID": "11"}, None, "serve-11.json", None, None),
        ({"AGENT_JOB_ID": "12"}, None, "serve-12.json", None, None),
        ({"SLURM_JOB_ID": "11", "AGENT_JOB_ID": "12"}, None, "serve-11.json", None, None),
        ({"SLURM_JOB_ID": "13"}, "given.json", "given.json", None, None),
        ({}, "given.json", "given.json", None, None),
        ({}, None, None, ExitCode.USAGE, "(serve-11.json, serve-12.json, serve-13.json)"),
        ({"SLURM_JOB_ID": ""}, None, None, ExitCode.USAGE, ": pass --serve FILE"),
        ({"SLURM_JOB_ID": "99"}, None, None, ExitCode.RENDEZVOUS, "no resident agents for job 99"),
        ({}, "absent.json", None, ExitCode.RENDEZVOUS, "--serve"),
    ],
)
def test_find(tmp_path, env, explicit, expected, code, words):
    state = tmp_path / "state"
    env = {**env, connection.STATE_ENV: str(state)}
    for job in ("11", "12", "13"):
        connection.write(state / f"serve-{job}.json", {**RECORD, "job": job})
    connection.write(tmp_path / "given.json", RECORD)
    given = None if explicit is None else str(tmp_path / explicit)
    if code is None:
        found = connection.find(env, tmp_path, given)
        assert found.name == expected and found.is_file()
        return
    error = error_of(connection.find, env, tmp_path, given)
    assert error.code == code and words in error.message
    if code == ExitCode.RENDEZVOUS:
        assert "python -m agent serve" in error.message


def test_without_a_job_id_the_only_file_of_the_state_dir_is_found(tmp_path):
    state = tmp_path / "state"
    env = {connection.STATE_ENV: str(state)}
    error = error_of(connection.find, env, tmp_path, None)
    assert error.code == ExitCode.RENDEZVOUS and str(state) in error.message
    assert "python -m agent serve &" in error.message
    state.mkdir()
    (state / ".serve-local.json.1.ab").write_text("{}")  # a half-written one is not a file yet
    only = state / "serve-local.json"
    connection.write(only, RECORD)
    assert connection.find(env, tmp_path, None) == only
    connection.write(state / "serve-77.json", RECORD)
    error = error_of(connection.find, env, tmp_path, None)
    assert error.code == ExitCode.USAGE
    assert "(serve-77.json, serve-local.json): pass --serve FILE" in error.message


@pytest.mark.parametrize(
    ("env", "others", "expected"),
    [
        ({}, (), "`python -m agent run|status|down`"),
        ({"STATE": ""}, (), "`AGENT_STATE_DIR={state} python -m agent run|status|down`"),
        ({}, ("serve-9.json",), "`python -m agent run|status|down --serve {path}`"),
        ({"AGENT_JOB_ID": "9"}, (), "`python -m agent run|status|down --serve {path}`"),
    ],
)
def test_serve_names_the_client_command_that_finds_its_file(tmp_path, env, others, expected):
    state = tmp_path / "state"
    environ = {k: v for k, v in env.items() if k != "STATE"}
    if "STATE" in env:
        environ[connection.STATE_ENV] = str(state)
    path = connection.path_for(environ, tmp_path, "local")
    for name in (path.name, *others):
        connection.write(path.parent / name, RECORD)
    said = connection.client_command(environ, tmp_path, path)
    assert said == expected.format(state=state, path=path)
    if "--serve" not in said:  # the command as said finds the file from a fresh shell
        shell = {connection.STATE_ENV: str(state)} if "STATE" in env else {}
        assert connection.find(shell, tmp_path, None) == path


def test_inside_slurm_serve_names_the_plain_command_and_the_file(tmp_path):
    environ = {"SLURM_JOB_ID": "5", connection.STATE_ENV: str(tmp_path)}
    path = connection.path_for(environ, tmp_path, "5")
    connection.write(path, RECORD)
    said = connection.client_command(environ, tmp_path, path)
    assert said.startswith(f"`AGENT_STATE_DIR={tmp_path} python -m agent run|status|down` (")
    assert f"`--serve {path}`" in said
    assert connection.find(environ, tmp_path, None) == path


def test_remove_deletes_only_the_file_of_the_same_agent(tmp_path):
    path = tmp_path / "serve-1.json"
    connection.write(path, RECORD)
    connection.remove(path, RECORD["pid"] + 1)  # a newer serve wrote it: it stays
    assert connection.read(path) == RECORD
    connection.remove(path, RECORD["pid"])
    assert not path.exists()
    connection.remove(path, RECORD["pid"])  # already gone: no error
    path.write_text("garbage")
    connection.remove(path, RECORD["pid"])  # not ours to judge: left alone
    assert path.read_text() == "garbage"


HOSTS_IDNA_CANNOT_ENCODE = ["a" * 64 + ".x", "\udcff", "é" * 64]


@pytest.mark.parametrize("host", HOSTS_IDNA_CANNOT_ENCODE)
def test_connecting_to_a_host_idna_cannot_encode_is_an_unknown_host(host):
    with pytest.raises(wire.WireError) as excinfo:
        wire.connect(host, 29517, b"k" * 32, 1.0)
    assert excinfo.value.seen == "unknown host" and "not a host name" in excinfo.value.message


@pytest.mark.parametrize("host", HOSTS_IDNA_CANNOT_ENCODE)
@pytest.mark.parametrize("command", ["status", "stacks", "debug"])
def test_a_file_naming_such_a_host_is_one_line_from_the_cli(tmp_path, host, command):
    """The connection file (`status --serve FILE`) and a run's control.json (`stacks LOG_DIR`,
    `debug LOG_DIR`), as a user meets them: one line and exit 3, no UnicodeError traceback."""
    logs = tmp_path / "logs"
    logs.mkdir()
    record = json.dumps({**RECORD, "host": host, "run": 0})
    (tmp_path / "serve-4242.json").write_text(record)
    (logs / "control.json").write_text(record)
    argv = ["status", "--serve", str(tmp_path / "serve-4242.json")] if command == "status" else [
        command, str(logs)
    ]  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO),
           "AGENT_SECRET": "s"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "agent", *argv], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == ExitCode.RENDEZVOUS, done.stderr
    assert done.stderr.count("\n") == 1 and "not a host name" in done.stderr, done.stderr
