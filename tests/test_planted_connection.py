"""Without a job id, `agent run|status|down` take the state dir's only connection file: that file
is trusted no more than with a job id. A state dir another user owns or may write, or a file
another user owns or may write, is refused in one line (exit 2, as README's Trust says) and
nothing is sent to the address the file names: a listener of the test's counts connections."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import pytest
from cluster import REPO

from agent.control import connection
from agent.errors import ExitCode

NOBODY = 65534


def planted(state, port: int) -> None:
    record = {"host": "127.0.0.1", "port": port, "job": "local", "step": "0", "pid": 4242,
              "hostname": "elsewhere", "started": 1.0}  # fmt: skip
    connection.write(state / "serve-local.json", record)


def listening() -> tuple[socket.socket, list[socket.socket]]:
    """A port that would receive the client's handshake: every connection it gets is kept."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                seen.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return listener, seen


def untrusted_dir(state) -> None:
    os.chmod(state, 0o777)


def dir_of_nobody(state) -> None:
    os.chown(state, NOBODY, NOBODY)


def file_of_nobody(state) -> None:
    os.chown(state / "serve-local.json", NOBODY, NOBODY)


def file_writable_by_others(state) -> None:
    os.chmod(state / "serve-local.json", 0o666)


CASES = {
    untrusted_dir: "is writable by others",
    dir_of_nobody: "belongs to",
    file_of_nobody: "belongs to uid 65534",
    file_writable_by_others: "is writable by others (mode 666)",
}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to uid 65534")
@pytest.mark.parametrize("command", [["status"], ["down"], ["run", "train.py"]])
@pytest.mark.parametrize("plant", list(CASES), ids=lambda f: f.__name__)
def test_a_planted_connection_file_is_refused_without_a_job_id(tmp_path, command, plant):
    state = tmp_path / "state"
    listener, seen = listening()
    planted(state, listener.getsockname()[1])
    plant(state)
    # no job id: the state dir's only file is taken
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO),
           "AGENT_SECRET": "s", connection.STATE_ENV: str(state)}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "agent", *command],
        capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    listener.close()
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert done.stderr.count("\n") == 1 and CASES[plant] in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not seen, "the client connected to the address a planted file names"


def test_the_users_own_file_is_still_found_without_a_job_id(tmp_path):
    state = tmp_path / "state"
    planted(state, 1)
    env = {connection.STATE_ENV: str(state)}
    assert connection.find(env, tmp_path, None) == state / "serve-local.json"
