"""World sources beyond Slurm: OpenMPI (per node, per rank), Kubernetes pods, explicit flags, local."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TypeVar

from agent.errors import AgentError
from agent.world.env import (
    Int,
    below,
    lookup,
    master_addr,
    need_int,
    opt_int,
    port_from_env,
    visible_devices,
)
from agent.world.types import Task, World, WorldFlags

_T = TypeVar("_T")
MPI_LOCAL_SIZE = "OMPI_COMM_WORLD_LOCAL_SIZE"  # ranks of this mpirun on this node
_MPI_FIX = (
    "mpirun sets OMPI_* for every rank: run the agent under mpirun and keep them as it set them"
)
_MPI_PER_NODE = (
    "one agent per node needs `mpirun --map-by ppr:1:node`; "
    "for one mpirun rank per process pass --world mpi-task"
)
_K8S_FIX = (
    "the pod spec sets it (Kubeflow PyTorchJob, RunAI): fix the pod env, or pass --world local"
)
_EXPLICIT_FIX = "pass --nnodes N --node-rank I --master-addr HOST on every node"


_MPI_NO_MASTER = "OpenMPI does not say where node 0 is: pass --master-addr or export MASTER_ADDR"


def _mpi_base(env: Mapping[str, str], flags: WorldFlags, hostname: str) -> World:
    size = need_int(env, ("OMPI_COMM_WORLD_SIZE",), _MPI_FIX, low=1)
    rank = need_int(env, ("OMPI_COMM_WORLD_RANK",), _MPI_FIX)
    below(rank, size, _MPI_FIX)
    addr = master_addr(env, flags.master_addr, _MPI_NO_MASTER)
    return _peer_world("mpi", size, rank, hostname, addr, port_from_env(env, _MPI_FIX), env)


def from_mpi(env: Mapping[str, str], flags: WorldFlags, hostname: str) -> World:
    local_size = opt_int(env, (MPI_LOCAL_SIZE,), _MPI_FIX, low=1)
    if local_size is not None and local_size.value != 1:
        raise AgentError(f"{local_size}: {_MPI_PER_NODE}")
    return _mpi_base(env, flags, hostname)


def from_mpi_task(env: Mapping[str, str], flags: WorldFlags, hostname: str) -> World:
    world = _mpi_base(env, flags, hostname)
    size, rank = Int("OMPI_COMM_WORLD_SIZE", world.nnodes), world.node_rank
    local_size = need_int(env, (MPI_LOCAL_SIZE,), _MPI_FIX, low=1)
    local_rank = need_int(env, ("OMPI_COMM_WORLD_LOCAL_RANK",), _MPI_FIX)
    below(local_rank, local_size, _MPI_FIX)
    # OMPI_COMM_WORLD_NODE_RANK is a rank among all jobs on the node, not the node's index:
    # the index comes from rank // local_size, valid only when nodes are filled in rank order.
    if size.value % local_size.value:
        raise AgentError(
            f"{size} is not a multiple of {local_size}: mpi-task needs the same number of "
            "ranks on every node (`mpirun --map-by ppr:N:node`)"
        )
    if rank % local_size.value != local_rank.value:
        raise AgentError(
            f"OMPI_COMM_WORLD_RANK={rank} with {local_size} means local rank "
            f"{rank % local_size.value}, not {local_rank}: mpi-task needs each node's ranks "
            "consecutive: use `mpirun --map-by slot`, not by node"
        )
    task = Task(rank, local_rank.value, size.value, local_size.value)
    return replace(
        world,
        source="mpi-task",
        nnodes=size.value // local_size.value,
        node_rank=rank // local_size.value,
        task=task,
    )


def from_k8s(env: Mapping[str, str], flags: WorldFlags, hostname: str) -> World:
    world_size = need_int(env, ("WORLD_SIZE",), _K8S_FIX, low=1)
    rank = need_int(env, ("RANK",), _K8S_FIX)
    below(rank, world_size, _K8S_FIX)
    job = lookup(env, "TORCHELASTIC_RUN_ID", "JOB_ID")
    addr = master_addr(env, flags.master_addr, f"MASTER_ADDR is not set: {_K8S_FIX}")
    world = _peer_world("k8s", world_size, rank, hostname, addr, port_from_env(env, _K8S_FIX), env)
    return world if job is None else replace(world, job_id=job[1].strip())


def from_explicit(env: Mapping[str, str], flags: WorldFlags, hostname: str) -> World:
    nnodes = Int("--nnodes", _flag("--nnodes", flags.nnodes))
    node_rank = Int("--node-rank", _flag("--node-rank", flags.node_rank))
    addr = _flag("--master-addr", flags.master_addr)
    below(node_rank, nnodes, _EXPLICIT_FIX)
    return _peer_world("explicit", nnodes, node_rank, hostname, addr, None, env)


def _peer_world(
    source: str,
    nnodes: Int,
    node_rank: Int,
    hostname: str,
    addr: str,
    port: int | None,
    env: Mapping[str, str],
) -> World:
    """The sources that name node 0's address but not the other hosts (no job id either)."""
    return World(
        source=source,
        job_id="",
        step_id="",
        nnodes=nnodes.value,
        node_rank=node_rank.value,
        hosts=(),
        host=hostname,
        master_addr=addr,
        master_port=port,
        visible_devices=visible_devices(env),
    )


def _flag(name: str, value: _T | None) -> _T:
    if value is None:
        raise AgentError(f"--world explicit needs {name}: {_EXPLICIT_FIX}")
    return value


def from_local(env: Mapping[str, str], flags: WorldFlags, hostname: str) -> World:
    return World(
        source="local",
        job_id="",
        step_id="",
        nnodes=1,
        node_rank=0,
        hosts=(hostname,),
        host=hostname,
        master_addr="127.0.0.1",
        master_port=None,
        visible_devices=visible_devices(env),
    )
