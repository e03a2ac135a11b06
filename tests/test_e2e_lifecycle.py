"""The node lifecycle answers in every phase: signals, setup errors and lost reporters end every
agent within seconds; a taken node index is refused; one set of agents executes several runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from cluster import FIXTURE, REPO, base_env, slurm_env, wait_for

from agent.node.store_client import StoreClient
from agent.node.trust import JobKeys
from agent.world import derive_port

pytestmark = pytest.mark.e2e


def _waiting(agent) -> bool:
    return "more agent(s) to join" in agent.stderr()


def _exited_within(cluster, seconds: float) -> list[int]:
    start = time.monotonic()
    codes = cluster.wait(seconds + 30)
    assert time.monotonic() - start < seconds, (
        f"took {time.monotonic() - start:.1f}s\n{cluster.dump()}"
    )
    return codes


def test_one_set_of_agents_executes_two_runs_back_to_back(tmp_path):
    """Two runs over one store and one membership: each has its own log dir, summary, exit code."""
    job = "4242"
    procs = []
    for node in range(2):
        env = base_env(tmp_path)
        env.update(slurm_env(job, 2, node))
        argv = [
            sys.executable,
            str(REPO / "tests" / "fixtures" / "two_runs.py"),
            str(tmp_path / "a"),
            str(tmp_path / "b"),
        ]
        procs.append(
            subprocess.Popen(
                argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        )
    outputs = [p.communicate(timeout=120) for p in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
        assert json.loads(out.decode().strip().splitlines()[-1]) == [0, 1], err.decode()
    first = json.loads((tmp_path / "a" / "summary.json").read_text())
    second = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert (first["status"], first["exit_code"]) == ("succeeded", 0)
    assert (second["status"], second["exit_code"]) == ("failed", 1)
    assert second["root_cause"]["rank"] == 1 and second["root_cause"]["returncode"] == 7
    assert (tmp_path / "a" / "rank-00001.out").read_text() == "run A\n"
    assert (tmp_path / "b" / "rank-00001.out").read_text() == "run B\n"
    assert [
        r["host"] for r in json.loads((tmp_path / "b" / "ranks.json").read_text())["ranks"]
    ] == [
        "127.0.0.1",
        "127.0.0.2",
    ]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_stop_signal_while_waiting_for_a_missing_node(cluster_factory, signum):
    """An agent waiting at the rendezvous ends with 128+N at once and wakes the others."""
    cluster = cluster_factory(3).start([FIXTURE], nodes=[0, 1])
    for agent in cluster.agents:
        wait_for(lambda a=agent: _waiting(a), 60, f"agent {agent.node} to wait at the rendezvous")
    os.kill(cluster.agents[1].proc.pid, signum)
    codes = _exited_within(cluster, 20.0)
    assert codes == [3, 128 + signum], cluster.dump()
    name = signal.Signals(signum).name
    assert f"node 1 (127.0.0.2) could not join: agent received {name}" in cluster.agents[0].stderr()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_stop_signal_to_node_zero_while_it_waits(cluster_factory, signum):
    cluster = cluster_factory(2).start([FIXTURE], nodes=[0])
    wait_for(lambda: _waiting(cluster.agents[0]), 60, "node 0 to wait at the rendezvous")
    os.kill(cluster.agents[0].proc.pid, signum)
    assert _exited_within(cluster, 20.0) == [128 + signum], cluster.dump()


def test_config_error_on_node_zero_ends_every_agent(cluster_factory, tmp_path):
    """Node 0 cannot parse a config: it exits 2 naming the file, the others exit 3 naming node 0."""
    bad = tmp_path / "bad.yml"
    bad.write_text("model: [1, 2\n")
    cluster = cluster_factory(2).start([FIXTURE, str(bad)])
    codes = _exited_within(cluster, 10.0)
    assert codes == [2, 3], cluster.dump()
    assert "bad.yml" in cluster.agents[0].stderr()
    assert "node 0 (127.0.0.1) could not join" in cluster.agents[1].stderr()
    assert "bad.yml" in cluster.agents[1].stderr()


def test_missing_script_on_node_one_ends_every_agent(cluster_factory, tmp_path):
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    (here / "train.py").write_text("print('hi')\n")
    cluster = cluster_factory(2)
    cluster.start(["train.py"], nodes=[0], cwd=here).start(["train.py"], nodes=[1], cwd=there)
    codes = _exited_within(cluster, 10.0)
    assert codes == [3, 2], cluster.dump()
    assert "script 'train.py' not found" in cluster.agents[1].stderr()
    assert (
        "node 1 (127.0.0.2) could not join: script 'train.py' not found"
        in cluster.agents[0].stderr()
    )
    assert not list(cluster.log_dir.glob("rank-*")), "no rank may start"


def test_second_agent_with_a_taken_node_index_is_refused(cluster_factory, tmp_path):
    """A stray agent claiming node 1 of a running job is refused; the job is untouched."""
    done = tmp_path / "done"
    cluster = cluster_factory(2).start(
        [FIXTURE, "--stdout", "real", "--ready-to", str(tmp_path), "--until-file", str(done)]
    )
    wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == 2, 60, "both ranks to start")
    stray = cluster_factory(2, job=cluster.job).start([FIXTURE, "--stdout", "stray"], nodes=[1])
    assert stray.wait(30) == [3], stray.dump()
    assert "node 1 (127.0.0.2) is already taken" in stray.agents[0].stderr()
    done.touch()
    assert cluster.wait(60) == [0, 0], cluster.dump()
    for rank in (0, 1):
        assert cluster.rank_file(rank).read_text() == "real\n"
    assert cluster.summary()["status"] == "succeeded"


def test_failure_reporter_dying_mid_report_still_ends_the_job(cluster_factory, tmp_path):
    """A reporter that took its sequence number and died before writing its record: node 0
    still declares the node lost, tears the job down and names the root cause."""
    cluster = cluster_factory(2).start(
        ["--heartbeat-timeout", "2", FIXTURE, "--ready-to", str(tmp_path), "--others-wait"]
    )
    wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == 2, 60, "both ranks to start")
    port = derive_port(cluster.job, cluster.step)
    store = StoreClient.connect("127.0.0.1", port, 10)
    keys = JobKeys.derive(base_env(tmp_path)["AGENT_SECRET"].encode(), cluster.job, cluster.step)
    store.add(keys.namespace + "r0/a0/fail-seq", 1)  # the number the dead reporter took
    os.killpg(cluster.agents[1].proc.pid, signal.SIGKILL)
    codes = _exited_within(cluster, 15.0)
    assert codes[0] == 3, cluster.dump()
    cause = cluster.summary()["root_cause"]
    assert cause["kind"] == "lost" and cause["node_rank"] == 1, cause
    said = cluster.agents[0].stderr()  # the report names the node once (issue 34)
    assert "root cause: node 1 (127.0.0.2) lost: its agent stopped answering" in said, said
    assert "failure elsewhere (node 1 (127.0.0.2) lost: its agent stopped answering" in said, said
