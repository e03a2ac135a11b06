"""What the user is told is true: each hint names a command that works, as real processes."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest
from cluster import FIXTURE, base_env, wait_for
from serving import Serving

pytestmark = pytest.mark.e2e


def _client(argv: list[str], env: dict[str, str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_serve_outside_slurm_names_the_client_command_that_works(tmp_path):
    env = base_env(tmp_path)  # no SLURM_*, no job id: the local world
    env.pop("AGENT_JOB_ID", None)
    err = tmp_path / "serve.err"
    with open(err, "wb") as e:
        serve = subprocess.Popen(
            [sys.executable, "-m", "agent", "serve", "--cold"], env=env, cwd=tmp_path,
            stdout=subprocess.DEVNULL, stderr=e, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    try:
        said = re.compile(r"clients: `([^`]+)`")
        wait_for(lambda: said.search(err.read_text()), 90, "serve to name its clients")
        hint = said.search(err.read_text()).group(1)
        assert "--serve" not in hint, hint
        words = shlex.split(hint)
        assert words[-1] == "run|status|down", hint
        assigns = [w for w in words if "=" in w and not w.startswith("-")]
        settings = dict(w.split("=", 1) for w in assigns)
        command = [sys.executable if w == "python" else w for w in words if w not in assigns]
        shell = {k: v for k, v in env.items() if k != "AGENT_STATE_DIR"} | settings
        status = _client([*command[:-1], "status"], shell, tmp_path)
        assert status.returncode == 0, status.stderr
        assert "1 resident agent" in status.stdout, status.stdout
        down = _client([*command[:-1], "down"], shell, tmp_path)
        assert down.returncode == 0 and "stopped 1 resident agent" in down.stdout, down.stderr
        assert serve.wait(60) == 0, err.read_text()
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()


def test_an_exclude_naming_no_host_of_the_job_is_one_warning_and_the_job_runs(cluster_factory):
    cluster = cluster_factory(2).start(["--exclude", "nosuch[1-3]", FIXTURE])
    assert cluster.wait(120) == [0, 0], cluster.dump()
    node0 = cluster.agents[0].stderr()
    warned = [line for line in node0.splitlines() if "--exclude" in line]
    assert len(warned) == 1, node0
    assert warned[0].endswith(
        "--exclude 'nosuch[1-3]' names no host of this job (its hosts: 127.0.0.[1-2]); "
        "excluding none"
    ), warned
    assert "excluding" not in cluster.agents[1].stderr()


def test_every_resident_nodes_teardown_reason_reaches_the_client(tmp_path):
    serving = Serving(tmp_path, 2, ("--preload", "none"))
    try:
        serving.start().ready()
        result = serving.call("run", FIXTURE, "--on", "0", "--exit", "3", "--others-wait")
        assert result.returncode == 1, result.stderr + serving.dump()
        log_dir = result.stderr.split("logs in ", 1)[1].split()[0]
        with open(f"{log_dir}/agent-00001.log") as file:
            own = [line for line in file if "tearing down" in line]
        assert own, serving.dump()  # node 1 said why in its own log ...
        relayed = [line for line in result.stderr.splitlines() if "tearing down" in line]
        assert any(line.startswith("[agent 127.0.0.2 r0.a0] ") for line in relayed), result.stderr
        said = own[-1].split(" r0.a0 ", 1)[1].strip()  # after the time, level and stage
        assert f"[agent 127.0.0.2 r0.a0] {said}" in relayed, (own, result.stderr)  # ... relayed
        # and not twice where srun shares the client's terminal: not on node 1's stderr too
        assert "tearing down" not in serving.agents[1].stderr(), serving.dump()
        assert serving.call("down").returncode == 0
        assert serving.wait(60) == [0, 0], serving.dump()
    finally:
        serving.kill()


SCOPE_NAME = re.compile(r"\((?:m|r\d+)(?:[/.][\w/]*)?\)")


def test_no_internal_scope_names_and_join_only_while_joining(tmp_path):
    serving = Serving(tmp_path, 2, ("--preload", "none"))
    try:
        serving.start().ready()
        runs = [serving.call("run", FIXTURE) for _ in range(2)]
        assert [r.returncode for r in runs] == [0, 0], runs[-1].stderr + serving.dump()
        assert serving.call("down").returncode == 0
        assert serving.wait(60) == [0, 0], serving.dump()
        told = [*(r.stderr for r in runs), *(a.stderr() for a in serving.agents)]
        lines = "\n".join(told).splitlines()
        assert not [line for line in lines if SCOPE_NAME.search(line)], "\n".join(told)
        # the first node at each run's barrier waits for the other: it says for what, truly
        # (every line the agents' terminal and the client's show: once each, not node 0's twice)
        waits = [line for line in lines if "more agent(s)" in line]
        assert len([w for w in waits if w.endswith("1 more agent(s) to prepare the run")]) == 2
        for agent in serving.agents:  # joining happens once, before node 0 serves
            text = agent.stderr()
            for line in text.splitlines():
                if line.endswith("to join"):
                    assert " r" not in line.split("]")[0], line  # before any run's stage
    finally:
        serving.kill()


def test_serve_and_run_in_one_terminal_print_each_node_0_line_once(tmp_path):
    """`srun ... serve &` then `agent run` in that shell: the agents' output and the client's
    share one terminal, where node 0's messages were printed by both."""
    serving = Serving(tmp_path, 2, ("--preload", "none"))
    try:
        serving.start().ready()
        result = serving.call("run", "--nproc-per-node", "1", FIXTURE, "--stdout", "rank says hi")
        assert result.returncode == 0, result.stderr + serving.dump()
        assert serving.call("down").returncode == 0
        assert serving.wait(60) == [0, 0], serving.dump()
        agents = "".join(a.stdout() + a.stderr() for a in serving.agents)
        terminal = agents + result.stdout + result.stderr
        for line in (
            "127.0.0.1:0: rank says hi",
            "attempt 0: starting ranks 0 on 127.0.0.1",
            "job succeeded (exit 0) after 1 attempt(s)",
        ):
            assert terminal.count(line) == 1, terminal
        log_dir = result.stderr.split("logs in ", 1)[1].split()[0]
        with open(f"{log_dir}/agent-00000.log") as file:  # node 0's own record keeps them
            assert "attempt 0: starting ranks 0 on 127.0.0.1" in file.read()
    finally:
        serving.kill()
