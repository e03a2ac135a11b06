"""`python -m agent exec`: parsing and ports (pure), one node in-process, 4 loopback nodes end to end."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from torch.distributed import TCPStore

from agent import remote
from agent.errors import AgentError
from agent.node.trust import JobKeys
from agent.remote.collate import NodeOutput
from agent.world import PORT_HIGH, PORT_LOW, World, WorldFlags, derive_port

REPO = Path(__file__).resolve().parents[1]
_JOBS = itertools.count()


# --- pure ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "command", "timeout"),
    [
        (["--", "nvidia-smi", "-L"], ("nvidia-smi", "-L"), None),
        (
            ["--timeout", "5", "--", "sh", "-c", "echo --timeout"],
            ("sh", "-c", "echo --timeout"),
            5.0,
        ),
        (["hostname", "--fqdn"], ("hostname", "--fqdn"), None),
        (["--", "--weird-program"], ("--weird-program",), None),
    ],
)
def test_parse_command(argv, command, timeout) -> None:
    parsed = remote.parse(argv)
    assert (parsed.argv, parsed.timeout) == (command, timeout)


def test_parse_world_flags() -> None:
    parsed = remote.parse(
        [
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--master-addr",
            "h0",
            "--master-port",
            "4242",
            "--",
            "true",
        ]
    )
    assert parsed.flags == WorldFlags("auto", 2, 1, "h0", 4242)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([], "needs a command"),
        (["--"], "needs a command"),
        (["--timeout", "0", "--", "true"], "--timeout"),
        (["--bogus", "--", "true"], "--bogus"),
        (["--nnodes", "x", "--", "true"], "--nnodes"),
    ],
)
def test_parse_refuses(argv, needle) -> None:
    with pytest.raises(AgentError) as err:
        remote.parse(argv)
    assert needle in err.value.message and "\n" not in err.value.message


def _world(job: str = "12", step: str = "0", port: int | None = None) -> World:
    return World("slurm", job, step, 2, 0, ("a", "b"), "a", "a", port)


def test_exec_port_keeps_clear_of_the_agents_port() -> None:
    agent_port = derive_port("12", "0")
    port = remote.exec_port(_world(), WorldFlags())
    assert PORT_LOW <= port <= PORT_HIGH
    assert port not in {derive_port("12", str(step)) for step in range(100)}
    assert abs(port - agent_port) == (PORT_HIGH - PORT_LOW + 1) // 2
    assert remote.exec_port(_world(), WorldFlags(master_port=4242)) == 4242
    assert PORT_LOW <= remote.exec_port(_world(port=29500), WorldFlags()) <= PORT_HIGH


@pytest.mark.parametrize(
    ("result", "status"),
    [
        (NodeOutput(1, "n", "", 0), 0),
        (NodeOutput(1, "n", "", 3), 3),
        (NodeOutput(1, "n", "", 300), 255),
        (NodeOutput(1, "n", "", -9), 137),
        (NodeOutput(1, "n", "", -15, timed_out=True), 124),
        (NodeOutput(1, "n", "", None), 1),
    ],
)
def test_exit_status(result, status) -> None:
    assert remote.exit_status(result) == status


def test_verdict() -> None:
    ok, bad, gone = (
        NodeOutput(0, "a", "", 0),
        NodeOutput(1, "b", "", 2),
        NodeOutput(2, "c", "", None),
    )
    forged = NodeOutput(
        3, "d", "", None, missing="store tampering suspected at la/x/exec/result/3", tampered=True
    )
    assert [remote.verdict(r) for r in ([ok], [ok, bad], [ok, bad, gone], [ok, gone, forged])] == [
        0,
        1,
        3,
        4,
    ]


# --- one node, in process ------------------------------------------------------------------


def test_single_node_runs_and_collates(capsys) -> None:
    code = remote.main(
        ["--world", "local", "--", "sh", "-c", "echo out; echo err >&2"], _clean_env()
    )
    captured = capsys.readouterr()
    assert code == 0
    assert "(exit 0)\n----------------\nout\nerr\n" in captured.out


def test_single_node_timeout_kills_the_command_group(capsys) -> None:
    start = time.monotonic()
    code = remote.main(
        ["--world", "local", "--timeout", "0.5", "--", "sh", "-c", "echo started; sleep 30 & wait"],
        _clean_env(),
    )
    captured = capsys.readouterr()
    assert time.monotonic() - start < 10
    assert code == 1
    assert "(timed out, killed)" in captured.out and "started" in captured.out
    assert "failed on" in captured.err


def test_missing_program_is_a_node_result(capsys) -> None:
    code = remote.main(["--world", "local", "--", "no-such-program-xyz"], _clean_env())
    captured = capsys.readouterr()
    assert code == 1
    assert "(exit 127)" in captured.out and "cannot run 'no-such-program-xyz'" in captured.out


# --- loopback nodes, end to end ------------------------------------------------------------


def _clean_env() -> dict[str, str]:
    drop = ("SLURM_", "OMPI_", "MASTER_", "WORLD_SIZE", "RANK", "TORCHELASTIC_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["AGENT_SECRET"] = "test-exec-secret"
    return env


def _fake_node(job: str, nnodes: int, node: int) -> dict[str, str]:
    """tests/test_world.py's fake_node, with a job id of our own."""
    return {
        "SLURM_JOB_ID": job,
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NODELIST": f"127.0.0.[1-{nnodes}]",
        "SLURM_NNODES": str(nnodes),
        "SLURM_NODEID": str(node),
        "SLURMD_NODENAME": f"127.0.0.{node + 1}",
    }


def _run_nodes(
    nnodes: int, started: int, per_node: dict[int, dict[str, str]], argv: list[str]
) -> list[subprocess.CompletedProcess]:
    job = f"{os.getpid()}{next(_JOBS)}{time.time_ns() % 100000}"
    procs = []
    for node in range(started):
        env = {**_clean_env(), **_fake_node(job, nnodes, node), **per_node.get(node, {})}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "agent", "exec", *argv],
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results


_SAY = ["--", "sh", "-c", 'echo "hello from $WHO"; exit "${CODE:-0}"']


@pytest.mark.e2e
def test_four_nodes_identical_output_is_grouped() -> None:
    per_node = {i: {"WHO": "the same node"} for i in range(3)} | {3: {"WHO": "the odd one"}}
    nodes = _run_nodes(4, 4, per_node, _SAY)
    lead = nodes[0]
    assert [n.returncode for n in nodes] == [0, 0, 0, 0], [n.stderr for n in nodes]
    assert lead.stdout == (
        "----------------\n127.0.0.[1-3] (exit 0)\n----------------\nhello from the same node\n"
        "----------------\n127.0.0.4 (exit 0)\n----------------\nhello from the odd one\n"
    )
    assert all(n.stdout == "" and n.stderr == "" for n in nodes[1:])


@pytest.mark.e2e
def test_a_failing_node_is_named_and_fails_the_job() -> None:
    nodes = _run_nodes(3, 3, {0: {"WHO": "x"}, 1: {"WHO": "x", "CODE": "3"}, 2: {"WHO": "x"}}, _SAY)
    assert [n.returncode for n in nodes] == [1, 3, 0], [n.stderr for n in nodes]
    assert "127.0.0.[1,3] (exit 0)" in nodes[0].stdout
    assert "127.0.0.2 (exit 3)" in nodes[0].stdout
    assert nodes[0].stderr.strip().splitlines()[-1] == "agent: exec: failed on 127.0.0.2 (exit 3)"
    assert "Traceback" not in "".join(n.stderr for n in nodes)


@pytest.mark.e2e
def test_a_node_that_never_joins_is_named() -> None:
    nodes = _run_nodes(2, 1, {0: {"WHO": "x"}}, ["--rdzv-timeout", "1", *_SAY])
    lead = nodes[0]
    assert lead.returncode == 3, lead.stderr
    assert "127.0.0.1 (exit 0)" in lead.stdout
    assert "127.0.0.2 (no result: never joined within 1s)" in lead.stdout
    assert "failed on 127.0.0.2 (no result: never joined within 1s)" in lead.stderr


@pytest.mark.e2e
def test_interrupted_node_0_reports_what_it_has_and_kills_its_command(tmp_path) -> None:
    mark = tmp_path / "pid"
    env = {
        **_clean_env(),
        **_fake_node(f"{os.getpid()}{next(_JOBS)}{time.time_ns() % 100000}", 2, 0),
        "MARK": str(mark),
    }
    lead = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent",
            "exec",
            "--",
            "sh",
            "-c",
            'echo started; echo $$ > "$MARK.tmp"; mv "$MARK.tmp" "$MARK"; exec sleep 100',
        ],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not mark.exists():  # the command runs once the store is up; nothing to read before
        assert time.monotonic() < deadline and lead.poll() is None, lead.stderr
        time.sleep(0.05)
    command_pid = int(mark.read_text())
    lead.send_signal(signal.SIGTERM)
    out, err = lead.communicate(timeout=30)
    assert lead.returncode == 128 + signal.SIGTERM, err
    assert "127.0.0.1 (no result: interrupted)\n----------------\nstarted\n" in out
    assert "127.0.0.2 (no result: never joined)" in out
    assert "Traceback" not in err
    with pytest.raises(ProcessLookupError):
        os.kill(command_pid, 0)


# --- an outsider on the exec store (torch's own client) -----------------------------------


def _outsider_on(job: str, nnodes: int = 2) -> tuple[TCPStore, str]:
    """torch's client on node 0's exec store once it is up, and the exec records' key prefix
    (what list_keys shows an outsider)."""
    world = World("slurm", job, "0", nnodes, 0, tuple(f"127.0.0.{i + 1}" for i in range(nnodes)),
                  "127.0.0.1", "127.0.0.1", None)  # fmt: skip
    port = remote.exec_port(world, WorldFlags())
    deadline = time.monotonic() + 60
    while True:
        try:
            store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5))
            break
        except (RuntimeError, ValueError):  # node 0's store is not up yet
            assert time.monotonic() < deadline, "node 0's exec store never came up"
    prefix = JobKeys.derive(b"test-exec-secret", job, "0").namespace + "exec/"
    return store, prefix


def _start_node(job: str, nnodes: int, node: int, argv: list[str], **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "agent", "exec", *argv],
        env={**_clean_env(), **_fake_node(job, nnodes, node), **env},
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


_UNTIL = ["--", "sh", "-c", 'while [ ! -e "$GO" ]; do sleep 0.05; done; echo "hello from $WHO"']


@pytest.mark.e2e
def test_garbage_over_a_nodes_result_is_waited_past(tmp_path) -> None:
    """X1: the outsider overwrites node 1's sealed result before node 0 reads it; node 0 waits
    past it (node 1 writes its own again) and reports the command's true exit 0."""
    job, go = f"{os.getpid()}{next(_JOBS)}{time.time_ns() % 100000}", tmp_path / "go"
    lead = _start_node(job, 2, 0, _UNTIL, GO=str(go), WHO="x")
    outsider, prefix = _outsider_on(job)
    node1 = _start_node(job, 2, 1, _UNTIL, GO=str(tmp_path), WHO="x")  # runs at once
    outsider.wait([prefix + "result/1"], timedelta(seconds=60))
    outsider.set(prefix + "result/1", b"garbage")
    go.touch()  # node 0's own command ends now, and node 0 reads the results
    out, err = lead.communicate(timeout=60)
    node1.communicate(timeout=60)
    assert lead.returncode == 0, err
    assert out == "----------------\n127.0.0.[1-2] (exit 0)\n----------------\nhello from x\n"
    assert node1.returncode == 0


@pytest.mark.e2e
def test_a_forged_join_of_a_node_that_never_started_is_not_one(tmp_path) -> None:
    """X2: a plain-JSON joined record for node 1, which never starts: node 0 names it as never
    joined (exit 3) instead of waiting for its result for ever."""
    job, go = f"{os.getpid()}{next(_JOBS)}{time.time_ns() % 100000}", tmp_path / "go"
    lead = _start_node(job, 2, 0, ["--rdzv-timeout", "2", *_UNTIL], GO=str(go), WHO="x")
    outsider, prefix = _outsider_on(job)
    outsider.set(prefix + "joined/1", b"1")
    go.touch()
    try:
        out, err = lead.communicate(timeout=30)  # a hang-catcher: it ends 2 s after the command
    finally:
        lead.kill()
    assert lead.returncode == 3, err
    assert "127.0.0.2 (no result: never joined within 2s)" in out
