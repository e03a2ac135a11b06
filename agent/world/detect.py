"""Scheduler environment → World, in the order agent.world's docstring gives; the job step's
port, derived alike on every node."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import replace

from agent.errors import AgentError
from agent.world import others as world_others
from agent.world import slurm as world_slurm
from agent.world.env import DIGITS, lookup
from agent.world.types import World, WorldFlags

SOURCES = ("auto", "slurm", "slurm-task", "k8s", "mpi", "mpi-task", "explicit", "local")
# Below Linux's default ephemeral range (32768-60999): a derived port must not collide with the
# source port of some random outgoing connection on node 0.
PORT_LOW, PORT_HIGH = 20000, 32767

_NO_FLAGS = WorldFlags()
_JOB_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def world_from_env(
    env: Mapping[str, str], flags: WorldFlags = _NO_FLAGS, hostname: str = "localhost"
) -> World:
    """The World of this agent; AgentError naming the variable when the env is missing or contradictory."""
    _check_flags(flags)
    source = _detect(env, flags) if flags.source == "auto" else flags.source
    world = _PARSERS[source](env, flags, hostname)
    return _apply_flags(world, flags)


def derive_port(job_id: str, step_id: str) -> int:
    """A port in PORT_LOW..PORT_HIGH that every agent of one job step computes alike."""
    span = PORT_HIGH - PORT_LOW + 1
    # Numeric steps are added, not hashed: steps of one job then never collide (below `span`).
    step = int(step_id) if DIGITS.fullmatch(step_id) else _digest(step_id)
    return PORT_LOW + (_digest(job_id) + step) % span


def _digest(text: str) -> int:
    # Not hash(): PYTHONHASHSEED differs between processes and nodes.
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


# --- detection and flags -------------------------------------------------------------------


def _detect(env: Mapping[str, str], flags: WorldFlags) -> str:
    if (flags.nnodes, flags.node_rank, flags.master_addr) != (None, None, None):
        return "explicit"
    # Before Slurm: mpirun inside an allocation starts its daemons with srun, so its ranks
    # inherit a one-task-per-node step's SLURM_* that describe the daemons, not the ranks.
    if "OMPI_COMM_WORLD_SIZE" in env:
        return "mpi"
    if lookup(env, "SLURM_JOB_ID", "SLURM_JOBID"):
        # Not SLURM_PROCID: an sbatch script has SLURM_PROCID=0 and SLURM_NODEID=0 but no step.
        world_slurm.slurm_step(env)
        return "slurm"
    if all(name in env for name in ("MASTER_ADDR", "WORLD_SIZE", "RANK")):
        return "k8s"
    return "local"


def _check_flags(flags: WorldFlags) -> None:
    if flags.source not in SOURCES:
        raise AgentError(f"--world={flags.source}: pass one of {', '.join(SOURCES)}")
    if flags.nnodes is not None and flags.nnodes < 1:
        raise AgentError(f"--nnodes={flags.nnodes}: pass the number of nodes, at least 1")
    if flags.node_rank is not None and flags.node_rank < 0:
        raise AgentError(f"--node-rank={flags.node_rank}: pass this node's index, from 0")
    if flags.master_addr is not None and not flags.master_addr.strip():
        raise AgentError("--master-addr is empty: pass node 0's host name or IP address")
    if flags.master_port is not None and not 1 <= flags.master_port <= 65535:
        raise AgentError(f"--master-port={flags.master_port}: pass a TCP port in 1..65535")
    if flags.job_id is not None and not _JOB_ID.fullmatch(flags.job_id):
        raise AgentError(f"--job-id={flags.job_id!r}: use 1-64 letters, digits, '.', '_' or '-'")


def _apply_flags(world: World, flags: WorldFlags) -> World:
    """--master-addr/--master-port override the env; --nnodes/--node-rank must agree with it."""
    for flag, given, found in (
        ("--nnodes", flags.nnodes, world.nnodes),
        ("--node-rank", flags.node_rank, world.node_rank),
    ):
        if given is not None and given != found:
            raise AgentError(
                f"{flag}={given} contradicts --world {world.source}, which says {found}: "
                f"drop {flag}, or pass --world explicit"
            )
    if flags.job_id is not None and world.job_id and flags.job_id != world.job_id:
        raise AgentError(
            f"--job-id={flags.job_id} contradicts the scheduler's job id {world.job_id}: drop --job-id"
        )
    return replace(
        world,
        job_id=flags.job_id or world.job_id,
        master_addr=flags.master_addr or world.master_addr,
        master_port=flags.master_port if flags.master_port is not None else world.master_port,
    )


_PARSERS = {
    "slurm": world_slurm.from_slurm,
    "slurm-task": world_slurm.from_slurm_task,
    "mpi": world_others.from_mpi,
    "mpi-task": world_others.from_mpi_task,
    "k8s": world_others.from_k8s,
    "explicit": world_others.from_explicit,
    "local": world_others.from_local,
}
