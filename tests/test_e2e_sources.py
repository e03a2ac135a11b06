"""Worlds that are not Slurm, end to end: RunAI/Kubeflow pods and OpenMPI, simulated on loopback.

No SLURM_* here: each agent gets the env its scheduler would set, and the ranks' env dumps
(tests/fixtures/rank.py --env-out) show the world the agents built from it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from cluster import FIXTURE, Agent, Cluster, base_env

pytestmark = pytest.mark.e2e


@dataclass
class Pods(Cluster):
    """Agents started with a scheduler env of our choosing; cleanup kills only their trees."""

    def start_agent(self, env: dict[str, str], args: list[str]) -> Pods:
        index = len(self.agents)
        full = {**base_env(self.tmp), **env}
        out, err = (
            self.tmp / f"agent-{self.job}-{index}.out",
            self.tmp / f"agent-{self.job}-{index}.err",
        )
        argv = [sys.executable, "-m", "agent", "--log-dir", str(self.log_dir), *args]
        with open(out, "wb") as o, open(err, "wb") as e:
            proc = subprocess.Popen(
                argv,
                env=full,
                stdout=o,
                stderr=e,
                stdin=subprocess.DEVNULL,
                cwd=self.tmp,
                start_new_session=True,
            )
        self.agents.append(Agent(index, proc, out, err))
        return self

    def kill(self) -> None:
        # Not the base class's marker scan: without a job id every such job's marker is "local.0".
        for agent in self.agents:
            if agent.proc.poll() is None:
                _kill_tree(agent.proc.pid)
                agent.proc.wait()


def _kill_tree(pid: int) -> None:
    try:
        tree = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        tree = []
    os.killpg(pid, signal.SIGKILL)
    for proc in tree:
        try:
            proc.kill()
        except psutil.Error:
            pass


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[Callable[[int], Pods]]:
    made: list[Pods] = []

    def make(count: int) -> Pods:
        made.append(Pods(tmp_path, count))
        return made[-1]

    yield make
    for group in made:
        group.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_envs(directory: Path, world: int) -> dict[int, dict[str, str]]:
    return {r: json.loads((directory / f"env-{r}.json").read_text())["env"] for r in range(world)}


def assert_world(envs: dict[int, dict[str, str]], world: int, local_world: int) -> None:
    assert sorted(envs) == list(range(world))
    for rank, env in envs.items():
        assert env["RANK"] == str(rank), (rank, env["RANK"])
        assert env["WORLD_SIZE"] == str(world)
        assert env["LOCAL_RANK"] == str(rank % local_world)
        assert env["LOCAL_WORLD_SIZE"] == str(local_world)
        assert env["GROUP_RANK"] == env["NODE_RANK"] == str(rank // local_world)
        assert env["MASTER_ADDR"] == "127.0.0.1"


def test_runai_pods_expand_pod_world_into_rank_world(pods, tmp_path: Path) -> None:
    """RunAI/Kubeflow: WORLD_SIZE=2 pods, RANK=pod index; 3 ranks per pod → 6 ranks."""
    port = free_port()  # the pod-level MASTER_PORT: where node 0's agent hosts its store
    group = pods(2)
    for pod in range(2):
        env = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": "2",
            "RANK": str(pod),
        }
        group.start_agent(env, ["--nproc-per-node", "3", FIXTURE, "--env-out", str(tmp_path)])
    assert group.wait(120) == [0, 0], group.dump()
    envs = rank_envs(tmp_path, 6)
    assert_world(envs, world=6, local_world=3)
    # The pod-level pair never reaches a rank unchanged: every rank sees the rank world instead.
    assert all(env["WORLD_SIZE"] != "2" for env in envs.values())
    assert [env["RANK"] for env in envs.values()] != ["0", "0", "0", "1", "1", "1"]
    summary = group.summary()
    assert summary["job"]["source"] == "k8s" and summary["status"] == "succeeded"


def _mpi_env(size: int, rank: int, local_size: int, port: int) -> dict[str, str]:
    return {
        "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % local_size),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


@pytest.mark.parametrize(
    ("world_flag", "agents", "local_size", "nproc"),
    [
        ("mpi", 2, 1, ["--nproc-per-node", "2"]),  # mpirun --map-by ppr:1:node: one agent per node
        ("mpi-task", 4, 2, []),  # mpirun -np 4, two per node: one agent per rank
    ],
    ids=["per-node", "per-rank"],
)
def test_openmpi_worlds(
    pods, tmp_path: Path, world_flag: str, agents: int, local_size: int, nproc: list[str]
) -> None:
    """2 nodes x 2 ranks either way: RANK, LOCAL_RANK and GROUP_RANK follow OMPI_COMM_WORLD_*."""
    port = free_port()
    group = pods(agents)
    for rank in range(agents):
        group.start_agent(
            _mpi_env(agents, rank, local_size, port),
            ["--world", world_flag, *nproc, FIXTURE, "--env-out", str(tmp_path)],
        )
    assert group.wait(120) == [0] * agents, group.dump()
    envs = rank_envs(tmp_path, 4)
    assert_world(envs, world=4, local_world=2)
    if world_flag == "mpi-task":
        assert all(env["RANK"] == env["OMPI_COMM_WORLD_RANK"] for env in envs.values())
    assert group.summary()["job"]["source"] == world_flag
