"""world.py: real scheduler environments → World, and every refusal naming its variable."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from agent.errors import AgentError, ExitCode
from agent.world import (
    PORT_HIGH,
    PORT_LOW,
    Task,
    World,
    WorldFlags,
    derive_port,
    expand_nodelist,
    world_from_env,
)

REPO = Path(__file__).resolve().parent.parent

# `srun -N2 --ntasks-per-node=1 bash -c env`, task 0, on the local Slurm 22.05 cluster
# (shared/research/slurm-local/REPORT.md); task 1 differs in the five variables below.
SRUN_N2_TASK0 = {
    "SLURMD_NODENAME": "n1",
    "SLURM_CLUSTER_NAME": "local",
    "SLURM_CONF": "/etc/slurm/slurm.conf",
    "SLURM_CPUS_ON_NODE": "1",
    "SLURM_GTIDS": "0",
    "SLURM_JOBID": "13",
    "SLURM_JOB_CPUS_PER_NODE": "1(x2)",
    "SLURM_JOB_GID": "0",
    "SLURM_JOB_ID": "13",
    "SLURM_JOB_NAME": "bash",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_JOB_PARTITION": "debug",
    "SLURM_JOB_UID": "0",
    "SLURM_JOB_USER": "root",
    "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1",
    "SLURM_LOCALID": "0",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "0",
    "SLURM_NODELIST": "n[1-2]",
    "SLURM_NPROCS": "2",
    "SLURM_NTASKS": "2",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_PRIO_PROCESS": "0",
    "SLURM_PROCID": "0",
    "SLURM_SRUN_COMM_HOST": "127.0.0.1",
    "SLURM_SRUN_COMM_PORT": "34621",
    "SLURM_STEPID": "0",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_LAUNCHER_PORT": "34621",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_SUBMIT_DIR": "/root",
    "SLURM_SUBMIT_HOST": "vm",
    "SLURM_TASKS_PER_NODE": "1(x2)",
    "SLURM_TASK_PID": "16362",
    "SLURM_TOPOLOGY_ADDR": "n1",
    "SLURM_TOPOLOGY_ADDR_PATTERN": "node",
    "SLURM_UMASK": "0022",
    "SLURM_WORKING_CLUSTER": "local:127.0.0.1:6817:9728:109",
}
TASK1 = {
    "SLURMD_NODENAME": "n2",
    "SLURM_GTIDS": "1",
    "SLURM_NODEID": "1",
    "SLURM_PROCID": "1",
    "SLURM_TOPOLOGY_ADDR": "n2",
    "SLURM_TASK_PID": "16363",
}
GPU = {
    "CUDA_VISIBLE_DEVICES": "0,1",
    "GPU_DEVICE_ORDINAL": "0,1",
    "SLURM_GPUS_ON_NODE": "2",
    "SLURM_STEP_GPUS": "0,1",
}
# `srun -N2 --ntasks-per-node=2`, task 3 (seen on the same cluster).
SRUN_N2_PER_NODE_2_TASK3 = {
    "SLURMD_NODENAME": "n2",
    "SLURM_JOB_ID": "13",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_LOCALID": "1",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "1",
    "SLURM_NODELIST": "n[1-2]",
    "SLURM_NPROCS": "4",
    "SLURM_NTASKS": "4",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_PROCID": "3",
    "SLURM_STEPID": "0",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_TASKS_PER_NODE": "2(x2)",
}
# The script of `sbatch -N2 --ntasks-per-node=3`, before any srun: PROCID/NODEID but no step.
SBATCH_SCRIPT = {
    "SLURMD_NODENAME": "n1",
    "SLURM_JOB_ID": "12",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_LOCALID": "0",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "0",
    "SLURM_NODELIST": "n[1-2]",
    "SLURM_NPROCS": "6",
    "SLURM_NTASKS": "6",
    "SLURM_NTASKS_PER_NODE": "3",
    "SLURM_PROCID": "0",
    "SLURM_TASKS_PER_NODE": "3(x2)",
}
# In that script, `srun -N2 -n2` (task 1): SLURM_NTASKS_PER_NODE=3 is inherited from sbatch.
SBATCH_SRUN_N2 = {
    **SBATCH_SCRIPT,
    "SLURMD_NODENAME": "n2",
    "SLURM_NODEID": "1",
    "SLURM_PROCID": "1",
    "SLURM_NPROCS": "2",
    "SLURM_NTASKS": "2",
    "SLURM_STEPID": "0",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_TASKS_PER_NODE": "1(x2)",
}
# In that script, `srun -N2 --ntasks-per-node=1`: srun ignores the option (SLURM_NTASKS=6).
SBATCH_SRUN_IGNORED = {
    **SBATCH_SRUN_N2,
    "SLURM_NTASKS": "6",
    "SLURM_STEP_NUM_TASKS": "6",
    "SLURM_STEP_TASKS_PER_NODE": "3(x2)",
    "SLURM_TASKS_PER_NODE": "3(x2)",
}
# `salloc -N2`: the job-level set only.
SALLOC_SHELL = {
    "SLURM_JOB_ID": "21",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_NNODES": "2",
    "SLURM_NTASKS": "2",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_TASKS_PER_NODE": "1(x2)",
}
OMPI = {
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
    "OMPI_COMM_WORLD_NODE_RANK": "0",
    "MASTER_ADDR": "node-a",
}
OMPI_4_PER_NODE_RANK5 = {
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_RANK": "5",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    "OMPI_COMM_WORLD_NODE_RANK": "1",  # a rank among the node's jobs, not the node's index
    "MASTER_ADDR": "node-a",
}
K8S_POD1 = {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": "1"}


def env_of(base: Mapping[str, str], **changes: str | None) -> dict[str, str]:
    """`base` with `changes` applied; None removes the variable."""
    env = dict(base)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def fake_node(nodelist: str, nnodes: int, node_id: int, nodename: str) -> dict[str, str]:
    """The smallest env a per-node SLURM test agent needs."""
    return {
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_NNODES": str(nnodes),
        "SLURM_NODEID": str(node_id),
        "SLURMD_NODENAME": nodename,
    }


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("gpu[001-004,010]", ("gpu001", "gpu002", "gpu003", "gpu004", "gpu010")),
        (
            "nid-b24-[1-3,5],nid-b25-[1,4]",
            ("nid-b24-1", "nid-b24-2", "nid-b24-3", "nid-b24-5", "nid-b25-1", "nid-b25-4"),
        ),
        ("compute[042-043,045]", ("compute042", "compute043", "compute045")),
        ("127.0.0.[1-4]", ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4")),
        ("n[1-2]", ("n1", "n2")),
        ("login-7", ("login-7",)),
    ],
)
def test_expand_nodelist(text: str, hosts: tuple[str, ...]) -> None:
    assert expand_nodelist(text, "SLURM_STEP_NODELIST") == hosts


@pytest.mark.parametrize("text", ["", "  ", "n[1-2", "n[2-1]", "a[,b", "n1, n2"])
def test_expand_nodelist_refuses(text: str) -> None:
    with pytest.raises(AgentError) as err:
        expand_nodelist(text, "SLURM_JOB_NODELIST")
    assert "SLURM_JOB_NODELIST=" in err.value.message


SLURM_N2 = dict(
    source="slurm",
    job_id="13",
    step_id="0",
    nnodes=2,
    hosts=("n1", "n2"),
    master_addr="n1",
    master_port=None,
)


@pytest.mark.parametrize(
    ("env", "flags", "expected"),
    [
        (SRUN_N2_TASK0, WorldFlags(), World(**SLURM_N2, node_rank=0, host="n1")),
        (env_of(SRUN_N2_TASK0, **TASK1), WorldFlags(), World(**SLURM_N2, node_rank=1, host="n2")),
        (
            env_of(SRUN_N2_TASK0, **TASK1, **GPU),
            WorldFlags(),
            World(
                **SLURM_N2,
                node_rank=1,
                host="n2",
                gpus_on_node=2,
                visible_devices=("0", "1"),
            ),
        ),
        (
            fake_node("127.0.0.[1-4]", 4, 2, "127.0.0.3"),
            WorldFlags(),
            World(
                source="slurm",
                job_id="7",
                step_id="0",
                nnodes=4,
                node_rank=2,
                hosts=("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"),
                host="127.0.0.3",
                master_addr="127.0.0.1",
                master_port=None,
            ),
        ),
        (
            env_of(fake_node("gpu[001-004,010]", 5, 4, "gpu010"), CUDA_VISIBLE_DEVICES=""),
            WorldFlags(source="slurm", master_port=29500),
            World(
                source="slurm",
                job_id="7",
                step_id="0",
                nnodes=5,
                node_rank=4,
                hosts=("gpu001", "gpu002", "gpu003", "gpu004", "gpu010"),
                host="gpu010",
                master_addr="gpu001",
                master_port=29500,
                visible_devices=(),
            ),
        ),
    ],
)
def test_slurm_per_node(env: dict[str, str], flags: WorldFlags, expected: World) -> None:
    world = world_from_env(env, flags, hostname="vm")
    assert world == expected
    assert (world.agents, world.agent_index) == (world.nnodes, world.node_rank)


def test_slurm_ignores_ntasks_per_node_inherited_from_sbatch() -> None:
    world = world_from_env(SBATCH_SRUN_N2)
    assert (world.source, world.nnodes, world.node_rank, world.host) == ("slurm", 2, 1, "n2")


def test_slurm_falls_back_to_job_variables() -> None:
    env = env_of(fake_node("x", 1, 0, "compute042"), SLURM_STEP_NODELIST=None, SLURM_STEP_ID=None)
    env.update(SLURM_JOB_NODELIST="compute[042-043,045]", SLURM_NNODES="3", SLURM_STEPID="4")
    world = world_from_env(env)
    assert (world.hosts, world.step_id, world.master_addr) == (
        ("compute042", "compute043", "compute045"),
        "4",
        "compute042",
    )


def test_slurm_host_without_slurmd_nodename_is_the_nodelist_entry() -> None:
    env = env_of(env_of(SRUN_N2_TASK0, **TASK1), SLURMD_NODENAME=None)
    assert world_from_env(env, hostname="vm").host == "n2"


@pytest.mark.parametrize(
    ("env", "expected_task", "node_rank", "nnodes"),
    [
        (SRUN_N2_TASK0, Task(rank=0, local_rank=0, world_size=2, local_world_size=1), 0, 2),
        (SRUN_N2_PER_NODE_2_TASK3, Task(3, 1, 4, 2), 1, 2),
        (
            env_of(
                SRUN_N2_PER_NODE_2_TASK3,
                SLURM_STEP_NODELIST="gpu[001-004]",
                SLURM_STEP_NUM_NODES="4",
                SLURM_STEP_NUM_TASKS="8",
                SLURM_STEP_TASKS_PER_NODE="2(x4)",
                SLURMD_NODENAME="gpu003",
                SLURM_NODEID="2",
                SLURM_PROCID="5",
                SLURM_LOCALID="1",
            ),
            Task(5, 1, 8, 2),
            2,
            4,
        ),
        (  # `srun -N2 -n3`, task 2: SLURM_STEP_TASKS_PER_NODE=2,1
            env_of(
                SRUN_N2_PER_NODE_2_TASK3,
                SLURM_NTASKS_PER_NODE=None,
                SLURM_STEP_NUM_TASKS="3",
                SLURM_STEP_TASKS_PER_NODE="2,1",
                SLURM_PROCID="2",
                SLURM_LOCALID="0",
            ),
            Task(2, 0, 3, 1),
            1,
            2,
        ),
        (  # no layout variable at all: SLURM_NTASKS_PER_NODE
            env_of(
                SRUN_N2_PER_NODE_2_TASK3,
                SLURM_STEP_TASKS_PER_NODE=None,
                SLURM_TASKS_PER_NODE=None,
            ),
            Task(3, 1, 4, 2),
            1,
            2,
        ),
    ],
)
def test_slurm_task(env: dict[str, str], expected_task: Task, node_rank: int, nnodes: int) -> None:
    world = world_from_env(env, WorldFlags(source="slurm-task"))
    assert (world.source, world.task, world.node_rank, world.nnodes) == (
        "slurm-task",
        expected_task,
        node_rank,
        nnodes,
    )
    assert (world.agents, world.agent_index) == (expected_task.world_size, expected_task.rank)
    assert world.master_addr == world.hosts[0]


def test_mpi_per_node() -> None:
    world = world_from_env(OMPI, hostname="node-b")
    assert world == World(
        source="mpi",
        job_id="",
        step_id="",
        nnodes=2,
        node_rank=1,
        hosts=(),
        host="node-b",
        master_addr="node-a",
        master_port=None,
    )


def test_mpi_task_ignores_node_rank_variable() -> None:
    world = world_from_env(OMPI_4_PER_NODE_RANK5, WorldFlags(source="mpi-task"))
    assert (world.task, world.nnodes, world.node_rank) == (Task(5, 1, 8, 4), 2, 1)
    assert (world.agents, world.agent_index) == (8, 5)


def test_mpirun_inside_slurm_is_mpi() -> None:
    # mpirun starts its daemons with one srun task per node: the ranks inherit that step.
    env = {**env_of(SRUN_N2_TASK0, **TASK1), **OMPI}
    assert world_from_env(env).source == "mpi"


def test_mpi_master_addr_from_flag() -> None:
    env = env_of(OMPI, MASTER_ADDR=None, MASTER_PORT="29400")
    world = world_from_env(env, WorldFlags(source="mpi", master_addr="10.0.0.1"))
    assert (world.master_addr, world.master_port) == ("10.0.0.1", 29400)


def test_k8s_two_pods() -> None:
    world = world_from_env(env_of(K8S_POD1, TORCHELASTIC_RUN_ID="run-9"), hostname="job-worker-0")
    assert world == World(
        source="k8s",
        job_id="run-9",
        step_id="",
        nnodes=2,
        node_rank=1,
        hosts=(),
        host="job-worker-0",
        master_addr="job-master-0",
        master_port=23456,
    )


def test_explicit() -> None:
    flags = WorldFlags(nnodes=3, node_rank=2, master_addr="10.1.1.1", master_port=30000)
    world = world_from_env(SRUN_N2_TASK0, flags, hostname="ws")
    assert world == World(
        source="explicit",
        job_id="",
        step_id="",
        nnodes=3,
        node_rank=2,
        hosts=(),
        host="ws",
        master_addr="10.1.1.1",
        master_port=30000,
    )


@pytest.mark.parametrize(
    ("env", "flags"),
    [
        ({}, WorldFlags()),
        ({"CUDA_VISIBLE_DEVICES": "2, 3"}, WorldFlags()),
        (SALLOC_SHELL, WorldFlags(source="local")),
        (OMPI, WorldFlags(source="local")),
    ],
)
def test_local(env: dict[str, str], flags: WorldFlags) -> None:
    world = world_from_env(env, flags, hostname="ws")
    assert (world.source, world.nnodes, world.node_rank, world.hosts, world.host) == (
        "local",
        1,
        0,
        ("ws",),
        "ws",
    )
    assert (world.master_addr, world.task, world.agents, world.agent_index) == (
        "127.0.0.1",
        None,
        1,
        0,
    )
    expected_devices = ("2", "3") if env.get("CUDA_VISIBLE_DEVICES") else None
    assert world.visible_devices == expected_devices


def test_forced_slurm_master_addr_flag_overrides() -> None:
    world = world_from_env(SRUN_N2_TASK0, WorldFlags(source="slurm", master_addr="10.9.9.9"))
    assert (world.master_addr, world.hosts[0]) == ("10.9.9.9", "n1")


ERRORS = [
    # (id, env, flags, substrings the one-line message must contain)
    (
        "nodeid-out-of-range",
        env_of(SRUN_N2_TASK0, SLURM_NODEID="2"),
        WorldFlags(),
        ["SLURM_NODEID=2", "SLURM_STEP_NUM_NODES=2"],
    ),
    (
        "nodeid-out-of-range-job-vars",
        {**SALLOC_SHELL, "SLURM_STEP_ID": "0", "SLURM_NODEID": "5"},
        WorldFlags(),
        ["SLURM_NODEID=5", "SLURM_NNODES=2"],
    ),
    (
        "empty-nodelist",
        env_of(SRUN_N2_TASK0, SLURM_STEP_NODELIST=""),
        WorldFlags(),
        ["SLURM_STEP_NODELIST=''"],
    ),
    (
        "malformed-nodelist",
        env_of(SRUN_N2_TASK0, SLURM_STEP_NODELIST="n[1-2"),
        WorldFlags(),
        ["SLURM_STEP_NODELIST=n[1-2"],
    ),
    (
        "no-nodelist",
        env_of(
            SRUN_N2_TASK0, SLURM_STEP_NODELIST=None, SLURM_JOB_NODELIST=None, SLURM_NODELIST=None
        ),
        WorldFlags(),
        ["none of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, SLURM_NODELIST is set"],
    ),
    (
        "nnodes-vs-nodelist",
        env_of(SRUN_N2_TASK0, SLURM_STEP_NUM_NODES="3"),
        WorldFlags(),
        ["SLURM_STEP_NODELIST=n[1-2]", "SLURM_STEP_NUM_NODES=3"],
    ),
    (
        "two-tasks-per-node",
        SRUN_N2_PER_NODE_2_TASK3,
        WorldFlags(),
        ["SLURM_STEP_TASKS_PER_NODE=2(x2)", "--ntasks-per-node=1", "--world slurm-task"],
    ),
    (
        "ntasks-per-node-2-without-layout",
        env_of(fake_node("n[1-2]", 2, 0, "n1"), SLURM_NTASKS_PER_NODE="2"),
        WorldFlags(),
        ["SLURM_NTASKS_PER_NODE=2", "--ntasks-per-node=1", "--world slurm-task"],
    ),
    (
        "srun-ignored-ntasks-per-node-in-sbatch",
        SBATCH_SRUN_IGNORED,
        WorldFlags(),
        ["SLURM_STEP_TASKS_PER_NODE=3(x2)", "--ntasks=$SLURM_NNODES"],
    ),
    (
        "ntasks-vs-nnodes",
        env_of(fake_node("n[1-2]", 2, 0, "n1"), SLURM_NTASKS="3"),
        WorldFlags(),
        ["SLURM_NTASKS=3", "--world slurm-task"],
    ),
    (
        "nodeid-not-integer",
        env_of(SRUN_N2_TASK0, SLURM_NODEID="abc"),
        WorldFlags(),
        ["SLURM_NODEID=abc", "integer"],
    ),
    (
        "nodeid-negative",
        env_of(SRUN_N2_TASK0, SLURM_NODEID="-1"),
        WorldFlags(),
        ["SLURM_NODEID=-1"],
    ),
    (
        "nnodes-empty",
        env_of(SRUN_N2_TASK0, SLURM_STEP_NUM_NODES=""),
        WorldFlags(),
        ["SLURM_STEP_NUM_NODES=''"],
    ),
    (
        "nodeid-missing",
        env_of(SRUN_N2_TASK0, SLURM_NODEID=None),
        WorldFlags(),
        ["SLURM_NODEID is not set"],
    ),
    (
        "nodename-contradicts-nodelist",
        env_of(SRUN_N2_TASK0, SLURMD_NODENAME="n2"),
        WorldFlags(),
        ["SLURMD_NODENAME=n2", "SLURM_STEP_NODELIST=n[1-2]", "SLURM_NODEID=0"],
    ),
    (
        "gpus-on-node-not-integer",
        env_of(SRUN_N2_TASK0, SLURM_GPUS_ON_NODE="two"),
        WorldFlags(),
        ["SLURM_GPUS_ON_NODE=two"],
    ),
    (
        "salloc-shell",
        SALLOC_SHELL,
        WorldFlags(),
        ["SLURM_JOB_ID=21", "no job step", "srun --ntasks-per-node=1", "--world local"],
    ),
    (
        "sbatch-script",
        SBATCH_SCRIPT,
        WorldFlags(),
        ["SLURM_JOB_ID=12", "no job step"],
    ),
    (
        "forced-slurm-in-salloc-shell",
        SALLOC_SHELL,
        WorldFlags(source="slurm-task"),
        ["SLURM_JOB_ID=21", "no job step"],
    ),
    (
        "forced-slurm-without-slurm",
        {},
        WorldFlags(source="slurm"),
        ["SLURM_JOB_ID", "is set", "srun"],
    ),
    (
        "slurm-task-procid-out-of-range",
        env_of(SRUN_N2_PER_NODE_2_TASK3, SLURM_PROCID="4"),
        WorldFlags(source="slurm-task"),
        ["SLURM_PROCID=4", "SLURM_STEP_NUM_TASKS=4"],
    ),
    (
        "slurm-task-localid-out-of-range",
        env_of(SRUN_N2_PER_NODE_2_TASK3, SLURM_LOCALID="2"),
        WorldFlags(source="slurm-task"),
        ["SLURM_LOCALID=2", "SLURM_STEP_TASKS_PER_NODE=2(x2)"],
    ),
    (
        "slurm-task-layout-malformed",
        env_of(SRUN_N2_PER_NODE_2_TASK3, SLURM_STEP_TASKS_PER_NODE="2(x)"),
        WorldFlags(source="slurm-task"),
        ["SLURM_STEP_TASKS_PER_NODE='2(x)'"],
    ),
    (
        "slurm-task-layout-vs-nnodes",
        env_of(SRUN_N2_PER_NODE_2_TASK3, SLURM_STEP_TASKS_PER_NODE="2(x3)"),
        WorldFlags(source="slurm-task"),
        ["SLURM_STEP_TASKS_PER_NODE=2(x3)", "3 nodes"],
    ),
    (
        "slurm-task-layout-vs-ntasks",
        env_of(SRUN_N2_PER_NODE_2_TASK3, SLURM_STEP_NUM_TASKS="5"),
        WorldFlags(source="slurm-task"),
        ["SLURM_STEP_TASKS_PER_NODE=2(x2)", "SLURM_STEP_NUM_TASKS=5"],
    ),
    (
        "slurm-task-no-layout",
        env_of(
            SRUN_N2_PER_NODE_2_TASK3,
            SLURM_STEP_TASKS_PER_NODE=None,
            SLURM_TASKS_PER_NODE=None,
            SLURM_NTASKS_PER_NODE=None,
        ),
        WorldFlags(source="slurm-task"),
        ["SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "is set"],
    ),
    (
        "mpi-two-per-node",
        OMPI_4_PER_NODE_RANK5,
        WorldFlags(),
        ["OMPI_COMM_WORLD_LOCAL_SIZE=4", "--world mpi-task"],
    ),
    (
        "mpi-local-size-2",
        env_of(OMPI, OMPI_COMM_WORLD_LOCAL_SIZE="2"),
        WorldFlags(),
        ["OMPI_COMM_WORLD_LOCAL_SIZE=2", "--world mpi-task"],
    ),
    (
        "mpi-no-master",
        env_of(OMPI, MASTER_ADDR=None),
        WorldFlags(),
        ["OpenMPI does not say where node 0 is", "--master-addr", "MASTER_ADDR"],
    ),
    (
        "mpi-rank-out-of-range",
        env_of(OMPI, OMPI_COMM_WORLD_RANK="2"),
        WorldFlags(),
        ["OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=2"],
    ),
    (
        "mpi-task-uneven",
        env_of(OMPI_4_PER_NODE_RANK5, OMPI_COMM_WORLD_SIZE="7"),
        WorldFlags(source="mpi-task"),
        ["OMPI_COMM_WORLD_SIZE=7", "OMPI_COMM_WORLD_LOCAL_SIZE=4"],
    ),
    (
        "mpi-task-map-by-node",
        env_of(OMPI_4_PER_NODE_RANK5, OMPI_COMM_WORLD_LOCAL_RANK="2"),
        WorldFlags(source="mpi-task"),
        ["OMPI_COMM_WORLD_RANK=5", "OMPI_COMM_WORLD_LOCAL_RANK=2", "--map-by slot"],
    ),
    (
        "k8s-rank-out-of-range",
        env_of(K8S_POD1, RANK="2"),
        WorldFlags(),
        ["RANK=2", "WORLD_SIZE=2"],
    ),
    (
        "k8s-port-not-integer",
        env_of(K8S_POD1, MASTER_PORT="http"),
        WorldFlags(),
        ["MASTER_PORT=http"],
    ),
    (
        "k8s-port-out-of-range",
        env_of(K8S_POD1, MASTER_PORT="70000"),
        WorldFlags(),
        ["MASTER_PORT=70000"],
    ),
    (
        "k8s-forced-without-master",
        env_of(K8S_POD1, MASTER_ADDR=None),
        WorldFlags(source="k8s"),
        ["MASTER_ADDR is not set"],
    ),
    (
        "k8s-world-size-zero",
        env_of(K8S_POD1, WORLD_SIZE="0"),
        WorldFlags(),
        ["WORLD_SIZE=0", "positive"],
    ),
    ("explicit-no-nnodes", {}, WorldFlags(node_rank=0, master_addr="h"), ["--nnodes"]),
    ("explicit-no-node-rank", {}, WorldFlags(nnodes=2, master_addr="h"), ["--node-rank"]),
    ("explicit-no-master-addr", {}, WorldFlags(nnodes=2, node_rank=0), ["--master-addr"]),
    (
        "explicit-node-rank-out-of-range",
        {},
        WorldFlags(nnodes=2, node_rank=2, master_addr="h"),
        ["--node-rank=2", "--nnodes=2"],
    ),
    (
        "nnodes-flag-contradicts-slurm",
        SRUN_N2_TASK0,
        WorldFlags(source="slurm", nnodes=3),
        ["--nnodes=3", "slurm", "2"],
    ),
    (
        "node-rank-flag-contradicts-local",
        {},
        WorldFlags(source="local", node_rank=1),
        ["--node-rank=1", "local"],
    ),
    ("unknown-source", {}, WorldFlags(source="pbs"), ["--world=pbs", "slurm-task"]),
    ("nnodes-flag-zero", {}, WorldFlags(nnodes=0), ["--nnodes=0"]),
    ("port-flag-out-of-range", {}, WorldFlags(master_port=0), ["--master-port=0"]),
    ("master-addr-flag-empty", {}, WorldFlags(master_addr=" "), ["--master-addr"]),
]


@pytest.mark.parametrize(
    ("env", "flags", "needles"), [case[1:] for case in ERRORS], ids=[case[0] for case in ERRORS]
)
def test_refusals_name_the_variable(
    env: dict[str, str], flags: WorldFlags, needles: list[str]
) -> None:
    with pytest.raises(AgentError) as err:
        world_from_env(env, flags, hostname="vm")
    message = err.value.message
    assert err.value.code == ExitCode.USAGE
    assert "\n" not in message
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"


def test_derive_port_range_and_steps_differ() -> None:
    for job in ("1", "13", "987654321", "run-abc", ""):
        ports = [derive_port(job, str(step)) for step in range(200)]
        assert all(PORT_LOW <= port <= PORT_HIGH for port in ports)
        assert len(set(ports)) == len(ports)
    assert derive_port("13", "0") != derive_port("14", "0")
    assert derive_port("13", "batch") != derive_port("13", "extern")


def test_derive_port_is_stable_across_processes() -> None:
    code = "from agent.world import derive_port; print(derive_port('4242', '3'))"
    seen = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert seen == {str(derive_port("4242", "3"))}


def test_job_id_flag_names_a_job_the_scheduler_does_not():
    """Explicit worlds get a job identity of their own: store keys and derived port follow it."""
    flags = WorldFlags(nnodes=2, node_rank=1, master_addr="10.0.0.1", job_id="exp-7")
    assert world_from_env({}, flags).job_id == "exp-7"
    assert (
        world_from_env({}, WorldFlags(nnodes=2, node_rank=1, master_addr="10.0.0.1")).job_id == ""
    )


@pytest.mark.parametrize(
    ("env", "job_id", "message"),
    [
        (
            {
                "SLURM_JOB_ID": "5",
                "SLURM_STEP_ID": "0",
                "SLURM_NNODES": "1",
                "SLURM_NODEID": "0",
                "SLURM_STEP_NODELIST": "n1",
                "SLURMD_NODENAME": "n1",
                "SLURM_NTASKS": "1",
                "SLURM_STEP_TASKS_PER_NODE": "1",
                "SLURM_PROCID": "0",
            },
            "6",
            "contradicts the scheduler's job id 5",
        ),
        ({}, "a b", "--job-id='a b': use 1-64 letters"),
        ({}, "", "--job-id='': use 1-64 letters"),
    ],
)
def test_job_id_flag_is_checked(env, job_id, message):
    with pytest.raises(AgentError, match=message):
        world_from_env(env, WorldFlags(job_id=job_id))
