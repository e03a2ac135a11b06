"""agent.serve.client against a fake node 0 agent: a thread serving agent.control.wire on a real
listening socket, found through a real connection file; signals go to a real client process."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from agent.control import connection, wire
from agent.control.wire import pack_bytes
from agent.errors import AgentError, ExitCode
from agent.node.trust import JobKeys
from agent.serve import client

SECRET = "s3cret-of-the-job"
REPO = Path(__file__).resolve().parents[1]
POOL = ThreadPoolExecutor(max_workers=4)
REQUEST = {"op": "run", "argv": ["train.py", "a.yml"], "cwd": "/work", "env": {"A": "1"}}
Script = Callable[[wire.Channel], None]


class FakeAgent:
    """Node 0's agent as far as a client can tell: its connection file and its endpoint."""

    def __init__(self, tmp_path: Path) -> None:
        self.home = tmp_path / "home"
        self.env = {
            "AGENT_SECRET": SECRET,
            "SLURM_JOB_ID": "4242",
            connection.STATE_ENV: str(tmp_path / "state"),
        }
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.path = connection.path_for(self.env, self.home, "4242")
        record = {"host": "127.0.0.1", "port": self.port, "job": "4242", "step": "0"}
        record |= {"pid": 4321, "hostname": "node-zero", "started": 1.0}
        connection.write(self.path, record)
        self.key = JobKeys.derive(SECRET.encode(), "4242", "0").client_key

    def serve(self, script: Script) -> Future:
        def run() -> None:
            conn, _ = self.listener.accept()
            channel = wire.accept(conn, self.key, 10.0)
            try:
                script(channel)
            finally:
                channel.close()

        return POOL.submit(run)

    def channel(self) -> wire.Channel:
        target = client.locate(self.env, self.home, None)
        return client.open_channel(target, self.env, self.home)


@pytest.fixture
def agent(tmp_path):
    fake = FakeAgent(tmp_path)
    yield fake
    fake.listener.close()


def test_client_key_extends_the_job_keys_without_changing_them():
    keys = JobKeys.derive(b"secret", "4242", "0")
    okm = HKDF(hashes.SHA256(), 64, salt=b"launch-agent/v1", info=b"4242\x000").derive(b"secret")
    assert keys.aead_key == okm[32:]  # the store's records still open after the upgrade
    assert len(keys.client_key) == 32 and keys.client_key not in (keys.aead_key, okm[:32])
    others = [
        JobKeys.derive(b"other", "4242", "0"),
        JobKeys.derive(b"secret", "4243", "0"),
        JobKeys.derive(b"secret", "4242", "1"),
    ]
    assert len({keys.client_key, *(k.client_key for k in others)}) == 4


def test_run_streams_output_exactly_and_returns_the_runs_code(agent):
    chunks = [(1, b"epoch 1\n"), (2, b"warn \xff\x00 raw\n"), (1, b"no newline"), (1, b"\r\n")]
    received: list[dict] = []

    def script(channel: wire.Channel) -> None:
        received.append(channel.recv(timeout=10))
        channel.send({"accepted": {"run": 3, "id": "8.0.r3", "log_dir": "/logs/8.0.r3"}})
        for fd, data in chunks:
            channel.send({"out": pack_bytes(data), "fd": fd})
        channel.send({"log": "node 1: 8 ranks started"})
        channel.send({"future-key": "ignored"})
        channel.send({"end": 7, "summary": "/logs/r3/summary.json"})

    done = agent.serve(script)
    before = signal.getsignal(signal.SIGINT)
    out, err = io.BytesIO(), io.BytesIO()
    assert client.run(agent.channel(), REQUEST, out, err) == 7
    done.result(timeout=10)
    assert received == [REQUEST]
    assert out.getvalue() == b"epoch 1\nno newline\r\n"
    assert err.getvalue() == (
        b"[agent] run 8.0.r3: logs in /logs/8.0.r3\n"
        b"warn \xff\x00 raw\n"
        b"node 1: 8 ranks started\n"
        b"summary: /logs/r3/summary.json\n"
    )
    assert signal.getsignal(signal.SIGINT) is before  # handlers only for the duration


def test_an_error_answer_is_printed_and_its_code_returned(agent):
    def script(channel: wire.Channel) -> None:
        channel.recv(timeout=10)
        channel.send({"error": "train.py: no such file on node 0 (cwd /work)", "code": 2})

    done = agent.serve(script)
    err = io.BytesIO()
    assert client.run(agent.channel(), REQUEST, io.BytesIO(), err) == 2
    assert err.getvalue() == b"agent: error: train.py: no such file on node 0 (cwd /work)\n"
    done.result(timeout=10)


def test_a_connection_lost_mid_run_is_a_rendezvous_error(agent):
    def script(channel: wire.Channel) -> None:
        channel.recv(timeout=10)
        channel.send({"accepted": {"run": 5, "log_dir": "/logs/r5"}})
        channel.send({"out": pack_bytes(b"step 1\n"), "fd": 1})

    done = agent.serve(script)
    out = io.BytesIO()
    with pytest.raises(AgentError) as excinfo:
        client.run(agent.channel(), REQUEST, out, io.BytesIO())
    done.result(timeout=10)
    message = excinfo.value.message
    assert excinfo.value.code == ExitCode.RENDEZVOUS and "\n" not in message
    assert message.startswith("lost the resident agents (node 0's agent at 127.0.0.1:")
    assert "during run 5" in message and "/logs/r5" in message
    assert out.getvalue() == b"step 1\n"


class BrokenPipe(io.BytesIO):
    def write(self, data) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_stdout_does_not_abandon_the_run(agent):
    def script(channel: wire.Channel) -> None:
        channel.recv(timeout=10)
        for _ in range(3):
            channel.send({"out": pack_bytes(b"line\n"), "fd": 1})
        channel.send({"end": 0, "summary": None})

    done = agent.serve(script)
    err = io.BytesIO()
    assert client.run(agent.channel(), REQUEST, BrokenPipe(), err) == 0
    assert err.getvalue() == b""  # and no summary line for a null summary
    done.result(timeout=10)


def test_nothing_answering_names_the_file_and_who_wrote_it(agent):
    agent.listener.close()  # the agents are gone; their file stayed behind
    target = client.locate(agent.env, agent.home, None)
    assert (target.host, target.port, target.job, target.step) == (
        "127.0.0.1",
        agent.port,
        "4242",
        "0",
    )
    assert (target.path, target.pid, target.hostname) == (agent.path, 4321, "node-zero")
    with pytest.raises(AgentError) as excinfo:
        client.open_channel(target, agent.env, agent.home, timeout=5.0, retry_for=1.0)
    message = excinfo.value.message
    assert excinfo.value.code == ExitCode.RENDEZVOUS and "\n" not in message
    assert message.startswith(f"no resident agents answer at 127.0.0.1:{agent.port}")
    assert str(agent.path) in message and "pid 4321 on node-zero" in message
    assert "agent serve" in message and "remove the stale file" in message


def test_another_secret_in_the_shell_is_a_mismatch(agent):
    done = agent.serve(lambda channel: None)
    target = client.locate(agent.env, agent.home, None)
    with pytest.raises(AgentError) as excinfo:
        client.open_channel(target, {**agent.env, "AGENT_SECRET": "another"}, agent.home)
    assert excinfo.value.code == ExitCode.REFUSED and "secret mismatch" in excinfo.value.message
    with pytest.raises(wire.WireError):
        done.result(timeout=10)  # and the agent refused the connection


STATUS = {
    "job": "4242",
    "host": "node-zero",
    "nodes": [
        {"index": 0, "host": "node-zero", "state": "running", "warm": True, "preload": ["torch"]},
        {"index": 1, "host": "node-one", "state": "lost", "warm": False, "preload": []},
    ],
    "run": {"run": 2, "script": "train.py", "started": 1000.0, "log_dir": "/logs/r2"},
    "runs": 2,
}


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (
            STATUS,
            [
                "job 4242: 2 resident agents (1 running, 1 lost), node 0 on node-zero",
                "  node 0   node-zero            running  warm  preload: torch",
                "  node 1   node-one             lost     cold",
                "run 2: train.py, running for 3m12s, logs in /logs/r2",
                "runs so far: 2",
            ],
        ),
        ({}, ["job ?: 0 resident agents", "no run in progress"]),
        (
            {"job": {"x": 1}, "nodes": "many", "run": {"script": "t\x1b[2Jx.py"}, "runs": "2"},
            ["job ?: 0 resident agents", "run ?: t[2Jx.py"],
        ),
    ],
    ids=["full", "empty", "wrong-types"],
)
def test_status_renders_what_node_0_reports(agent, status, expected):
    def script(channel: wire.Channel) -> None:
        assert channel.recv(timeout=10) == {"op": "status"}
        channel.send({"status": status})

    done = agent.serve(script)
    out = io.StringIO()
    assert client.status(agent.channel(), out, now=lambda: 1192.0) == 0
    done.result(timeout=10)
    assert out.getvalue().splitlines() == expected


def test_down_waits_for_the_agents_and_says_how_many_stopped(agent):
    def script(channel: wire.Channel) -> None:
        assert channel.recv(timeout=10) == {"op": "down"}
        channel.send({"log": "node 1 stopped"})
        channel.send({"down": {"agents": 4}})

    done = agent.serve(script)
    out = io.StringIO()
    assert client.down(agent.channel(), out) == 0
    done.result(timeout=10)
    assert out.getvalue() == "[agent] node 1 stopped\nstopped 4 resident agents\n"


@pytest.mark.parametrize(
    ("answer", "code", "words"),
    [
        ({"error": "a run is in progress", "code": 2}, ExitCode.USAGE, "a run is in progress"),
        (None, ExitCode.RENDEZVOUS, "closed the connection before answering `down`"),
    ],
)
def test_down_that_is_refused_or_unanswered_is_an_error(agent, answer, code, words):
    def script(channel: wire.Channel) -> None:
        channel.recv(timeout=10)
        if answer is not None:
            channel.send(answer)

    done = agent.serve(script)
    with pytest.raises(AgentError) as excinfo:
        client.down(agent.channel(), io.StringIO())
    done.result(timeout=10)
    assert excinfo.value.code == code and words in excinfo.value.message


CHILD = """
import os, sys
from pathlib import Path
from agent.serve import client
home = Path(os.environ["HOME"])
channel = client.open_channel(client.locate(os.environ, home, None), os.environ, home)
request = {"op": "run", "argv": ["train.py"], "cwd": "/", "env": {}}
sys.exit(client.run(channel, request, sys.stdout.buffer, sys.stderr.buffer))
"""


def start_child(agent: FakeAgent) -> subprocess.Popen:
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(agent.home), "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD],
        env={**env, **agent.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_is_forwarded_and_the_run_still_ends_normally(agent, signum, code):
    requested = threading.Event()
    received: list[dict] = []

    def script(channel: wire.Channel) -> None:
        received.append(channel.recv(timeout=30))
        requested.set()  # the client installs its handlers before it sends the request
        received.append(channel.recv(timeout=30))
        channel.send({"end": code, "summary": "/logs/r1/summary.json"})

    done = agent.serve(script)
    child = start_child(agent)
    try:
        assert requested.wait(30), "the client never sent its request"
        child.send_signal(signum)
        out, err = child.communicate(timeout=30)
    finally:
        child.kill()
    done.result(timeout=10)
    assert received[1] == {"op": "signal", "signal": signal.Signals(signum).name}
    assert child.returncode == code
    assert b"[agent] stopping the run on every node (Ctrl-C again to stop waiting)\n" in err
    assert b"summary: /logs/r1/summary.json\n" in err and b"Traceback" not in err


def test_a_second_ctrl_c_stops_waiting_at_once(agent):
    requested, forwarded, gone = threading.Event(), threading.Event(), threading.Event()
    received: list[dict | None] = []

    def script(channel: wire.Channel) -> None:
        received.append(channel.recv(timeout=30))
        requested.set()
        received.append(channel.recv(timeout=30))
        forwarded.set()
        received.append(channel.recv(timeout=30))  # never an end from us: the client leaves
        gone.set()

    done = agent.serve(script)
    child = start_child(agent)
    try:
        assert requested.wait(30)
        child.send_signal(signal.SIGINT)
        assert forwarded.wait(30)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=30)
    finally:
        child.kill()
    done.result(timeout=10)
    assert child.returncode == 130 and gone.is_set()
    assert received[1:] == [{"op": "signal", "signal": "SIGINT"}, None]
    assert b"stopped waiting" in err and b"Traceback" not in err


def test_a_run_client_imports_only_what_a_run_request_needs(tmp_path):
    """`agent run` starts at every edit-and-rerun: no torch, and none of what only the LOG_DIR
    clients use (history's sqlite3 and summary reader, the pdb terminal)."""
    code = (
        "import sys\n"
        "sys.argv = ['agent', 'run', 'train.py']\n"
        "from agent.__main__ import main\n"
        "print('exit', main())\n"
        "heavy = ('torch', 'sqlite3', 'agent.history', 'agent.serve.pdb_terminal')\n"
        "print(sorted(name for name in heavy if name in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "AGENT_STATE_DIR": str(tmp_path)},
    )
    assert done.stdout.splitlines() == [f"exit {int(ExitCode.RENDEZVOUS)}", "[]"], done.stderr
