"""Scheduler environment → World: how many agents there are, which one this is, where node 0 is.

Auto-detection (`--world auto`), first match wins; a forced `--world SOURCE` ignores the others:
1. any of --nnodes / --node-rank / --master-addr    → explicit
2. OMPI_COMM_WORLD_SIZE                             → mpi    (LOCAL_SIZE > 1: error, see mpi-task)
3. SLURM_JOB_ID and SLURM_STEP_ID                   → slurm  (>1 task per node: error, see slurm-task)
4. SLURM_JOB_ID without a step (sbatch, salloc)     → error: run the agent under srun
5. MASTER_ADDR, WORLD_SIZE and RANK                 → k8s    (pod-level WORLD_SIZE and RANK)
6. none of the above                                → local
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import NamedTuple, TypeVar

import hostlist

from agent.errors import AgentError
from agent.slurm_tasks import expand_tasks_per_node

SOURCES = ("auto", "slurm", "slurm-task", "k8s", "mpi", "mpi-task", "explicit", "local")
# Below Linux's default ephemeral range (32768-60999): a derived port must not collide with the
# source port of some random outgoing connection on node 0.
PORT_LOW, PORT_HIGH = 20000, 32767

_T = TypeVar("_T")
_DIGITS = re.compile(r"[0-9]+")
_SLURM_FIX = (
    "srun sets SLURM_* for every task of a job step: run the agent as an srun task and keep "
    "them as srun set them (no overwriting, no apptainer --cleanenv)"
)
_SRUN = "run under `srun --ntasks-per-node=1 python -m agent …`, or pass --world local"
_SLURM_PER_NODE = (
    "one agent per node needs `srun --ntasks-per-node=1 --ntasks=$SLURM_NNODES`; "
    "for one srun task per rank pass --world slurm-task"
)
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


@dataclass(frozen=True)
class Task:
    """Per-task modes (srun-only / mpirun one-per-rank): this agent runs exactly one rank chosen by the scheduler."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int


@dataclass(frozen=True)
class WorldFlags:
    """The CLI's say on the world; every field optional."""

    source: str = "auto"
    nnodes: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None


@dataclass(frozen=True)
class World:
    """Where this agent sits in the job: node count and index, hosts, node 0's address."""

    source: str
    job_id: str
    step_id: str
    nnodes: int
    node_rank: int
    hosts: tuple[str, ...]  # one per node (slurm, local); () where only node 0's address is known
    host: str  # this node's name in logs: the Slurm node name, else the hostname argument
    master_addr: str
    master_port: int | None  # None: nothing fixed it, so the caller derives one (derive_port)
    task: Task | None = None
    gpus_on_node: int | None = None
    visible_devices: tuple[str, ...] | None = None

    @property
    def agents(self) -> int:
        return self.task.world_size if self.task else self.nnodes

    @property
    def agent_index(self) -> int:
        return self.task.rank if self.task else self.node_rank


class _Int(NamedTuple):
    """An integer and the variable (or flag) it came from, printed as `NAME=value` in errors."""

    name: str
    value: int

    def __str__(self) -> str:
        return f"{self.name}={self.value}"


_NO_FLAGS = WorldFlags()


def world_from_env(
    env: Mapping[str, str], flags: WorldFlags = _NO_FLAGS, hostname: str = "localhost"
) -> World:
    """The World of this agent; AgentError naming the variable when the env is missing or contradictory."""
    _check_flags(flags)
    source = _detect(env, flags) if flags.source == "auto" else flags.source
    world = _PARSERS[source](env, flags, hostname)
    return _apply_flags(world, flags)


def expand_nodelist(text: str, variable: str) -> tuple[str, ...]:
    """`gpu[001-002],cpu7` → ("gpu001", "gpu002", "cpu7"); AgentError naming `variable` when bad or empty."""
    try:
        hosts = tuple(hostlist.expand_hostlist(text.strip()))
    except hostlist.BadHostlist as err:
        raise AgentError(
            f"{_show(variable, text)} is not a Slurm hostlist such as gpu[001-004,010] ({err}): "
            f"{_SLURM_FIX}"
        ) from None
    if not hosts:
        raise AgentError(f"{_show(variable, text)} names no host: {_SLURM_FIX}")
    if any(not host or any(c.isspace() for c in host) for host in hosts):
        raise AgentError(f"{_show(variable, text)} has a blank in a host name: {_SLURM_FIX}")
    return hosts


def derive_port(job_id: str, step_id: str) -> int:
    """A port in PORT_LOW..PORT_HIGH that every agent of one job step computes alike."""
    span = PORT_HIGH - PORT_LOW + 1
    # Numeric steps are added, not hashed: steps of one job then never collide (below `span`).
    step = int(step_id) if _DIGITS.fullmatch(step_id) else _digest(step_id)
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
    if _lookup(env, "SLURM_JOB_ID", "SLURM_JOBID"):
        # Not SLURM_PROCID: an sbatch script has SLURM_PROCID=0 and SLURM_NODEID=0 but no step.
        _slurm_step(env)
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
    return replace(
        world,
        master_addr=flags.master_addr or world.master_addr,
        master_port=flags.master_port if flags.master_port is not None else world.master_port,
    )


# --- env access ----------------------------------------------------------------------------


def _show(name: str, value: str) -> str:
    plain = value and not any(c.isspace() for c in value)
    return f"{name}={value}" if plain else f"{name}={value!r}"


def _lookup(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """The first of `names` that is set, with its value: Slurm spells some variables two ways."""
    for name in names:
        if name in env:
            return name, env[name]
    return None


def _require(env: Mapping[str, str], names: tuple[str, ...], fix: str) -> tuple[str, str]:
    found = _lookup(env, *names)
    if found is None:
        which = f"{names[0]} is not" if len(names) == 1 else f"none of {', '.join(names)} is"
        raise AgentError(f"{which} set: {fix}")
    return found


def _to_int(name: str, text: str, fix: str, low: int = 0) -> _Int:
    stripped = text.strip()
    if not _DIGITS.fullmatch(stripped) or int(stripped) < low:
        kind = "a positive" if low > 0 else "a non-negative"
        raise AgentError(f"{_show(name, text)} is not {kind} integer: {fix}")
    return _Int(name, int(stripped))


def _need_int(env: Mapping[str, str], names: tuple[str, ...], fix: str, low: int = 0) -> _Int:
    return _to_int(*_require(env, names, fix), fix, low)


def _opt_int(env: Mapping[str, str], names: tuple[str, ...], fix: str, low: int = 0) -> _Int | None:
    found = _lookup(env, *names)
    return None if found is None else _to_int(*found, fix, low)


def _below(index: _Int, size: _Int, fix: str) -> None:
    if index.value >= size.value:
        raise AgentError(f"{index} is out of range for {size}: {fix}")


def _visible_devices(env: Mapping[str, str]) -> tuple[str, ...] | None:
    text = env.get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return None
    return tuple(part.strip() for part in text.split(",")) if text.strip() else ()


def _port(env: Mapping[str, str], fix: str) -> int | None:
    port = _opt_int(env, ("MASTER_PORT",), fix, low=1)
    if port is not None and port.value > 65535:
        raise AgentError(f"{port} is not a TCP port (1..65535): {fix}")
    return None if port is None else port.value


def _master_addr(env: Mapping[str, str], flags: WorldFlags, missing: str) -> str:
    addr = flags.master_addr or env.get("MASTER_ADDR", "").strip()
    if not addr:
        raise AgentError(missing)
    return addr


# --- Slurm ---------------------------------------------------------------------------------


def _slurm_step(env: Mapping[str, str]) -> tuple[str, str]:
    job = _require(env, ("SLURM_JOB_ID", "SLURM_JOBID"), f"not a Slurm job step; {_SRUN}")
    step = _lookup(env, "SLURM_STEP_ID", "SLURM_STEPID")
    if step is None:
        raise AgentError(
            f"SLURM allocation {_show(*job)} but no job step (an sbatch script or salloc shell): "
            f"{_SRUN}"
        )
    return job[1].strip(), step[1].strip()


def _slurm_nodes(env: Mapping[str, str]) -> World:
    """The step's nodes and this node's place among them; the per-node and per-task checks come after."""
    job_id, step_id = _slurm_step(env)
    nodelist = _require(
        env, ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"), _SLURM_FIX
    )
    hosts = expand_nodelist(nodelist[1], nodelist[0])
    nnodes = _need_int(
        env, ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"), _SLURM_FIX, low=1
    )
    if len(hosts) != nnodes.value:
        raise AgentError(f"{_show(*nodelist)} has {len(hosts)} hosts but {nnodes}: {_SLURM_FIX}")
    node_id = _need_int(env, ("SLURM_NODEID",), _SLURM_FIX)
    _below(node_id, nnodes, _SLURM_FIX)
    gpus = _opt_int(env, ("SLURM_GPUS_ON_NODE",), _SLURM_FIX)
    return World(
        source="slurm",
        job_id=job_id,
        step_id=step_id,
        nnodes=nnodes.value,
        node_rank=node_id.value,
        hosts=hosts,
        host=_slurm_host(env, hosts, node_id, nodelist),
        master_addr=hosts[0],
        master_port=None,
        gpus_on_node=None if gpus is None else gpus.value,
        visible_devices=_visible_devices(env),
    )


def _slurm_host(
    env: Mapping[str, str], hosts: tuple[str, ...], node_id: _Int, nodelist: tuple[str, str]
) -> str:
    name = env.get("SLURMD_NODENAME", "").strip()
    expected = hosts[node_id.value]
    if name and name != expected:
        raise AgentError(
            f"SLURMD_NODENAME={name} but {_show(*nodelist)} puts {node_id} on {expected}: "
            f"{_SLURM_FIX}"
        )
    return expected


def _slurm_layout(env: Mapping[str, str], nnodes: int) -> tuple[str, tuple[int, ...]] | None:
    """This step's tasks on each node. Not SLURM_NTASKS_PER_NODE: a step inherits the sbatch's
    value (3 under `sbatch --ntasks-per-node=3`) even when it runs one task per node."""
    found = _lookup(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    if found is None:
        return None
    counts = expand_tasks_per_node(found[1], found[0])
    if len(counts) != nnodes:
        raise AgentError(
            f"{_show(*found)} describes {len(counts)} nodes, not {nnodes}: {_SLURM_FIX}"
        )
    return _show(*found), counts


def _from_slurm(env: Mapping[str, str], flags: WorldFlags, hostname: str) -> World:
    world = _slurm_nodes(env)
    layout = _slurm_layout(env, world.nnodes)
    if layout is None:  # a hand-made env: SLURM_NTASKS_PER_NODE is the only clue
        per_node = _opt_int(env, ("SLURM_NTASKS_PER_NODE",), _SLURM_FIX)
        if per_node is not None and per_node.value != 1:
            raise AgentError(f"{per_node}: {_SLURM_PER_NODE}")
    elif any(count != 1 for count in layout[1]):
        raise AgentError(f"{layout[0]}: {_SLURM_PER_NODE}")
    ntasks = _opt_int(env, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"), _SLURM_FIX)
    if ntasks is not None and ntasks.value != world.nnodes:
        raise AgentError(f"{ntasks} tasks on {world.nnodes} nodes: {_SLURM_PER_NODE}")
    return world


def _from_slurm_task(env: Mapping[str, str], flags: WorldFlags, hostname: str) -> World:
    world = _slurm_nodes(env)
    ntasks = _need_int(
        env, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"), _SLURM_FIX, low=1
    )
    rank = _need_int(env, ("SLURM_PROCID",), _SLURM_FIX)
    _below(rank, ntasks, _SLURM_FIX)
    local_size, layout = _slurm_local_size(env, world.nnodes, world.node_rank, ntasks)
    local_rank = _need_int(env, ("SLURM_LOCALID",), _SLURM_FIX)
    if local_rank.value >= local_size:
        raise AgentError(
            f"{local_rank} is out of range for the {local_size} tasks that {layout} puts on "
            f"node {world.node_rank}: {_SLURM_FIX}"
        )
    task = Task(rank.value, local_rank.value, ntasks.value, local_size)
    return replace(world, source="slurm-task", task=task)


def _slurm_local_size(
    env: Mapping[str, str], nnodes: int, node_rank: int, ntasks: _Int
) -> tuple[int, str]:
    """Tasks on this node, and the variable that says so."""
    layout = _slurm_layout(env, nnodes)
    if layout is not None:
        shown, counts = layout
        if sum(counts) != ntasks.value:
            raise AgentError(f"{shown} adds up to {sum(counts)} tasks, not {ntasks}: {_SLURM_FIX}")
        return counts[node_rank], shown
    names = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE")
    per_node = _need_int(env, names, _SLURM_FIX, low=1)
    return per_node.value, str(per_node)


# --- OpenMPI, Kubernetes, explicit, local --------------------------------------------------

_MPI_NO_MASTER = "OpenMPI does not say where node 0 is: pass --master-addr or export MASTER_ADDR"


def _mpi_base(env: Mapping[str, str], flags: WorldFlags, hostname: str) -> World:
    size = _need_int(env, ("OMPI_COMM_WORLD_SIZE",), _MPI_FIX, low=1)
    rank = _need_int(env, ("OMPI_COMM_WORLD_RANK",), _MPI_FIX)
    _below(rank, size, _MPI_FIX)
    return World(
        source="mpi",
        job_id="",
        step_id="",
        nnodes=size.value,
        node_rank=rank.value,
        hosts=(),
        host=hostname,
        master_addr=_master_addr(env, flags, _MPI_NO_MASTER),
        master_port=_port(env, _MPI_FIX),
        visible_devices=_visible_devices(env),
    )


def _from_mpi(env: Mapping[str, str], flags: WorldFlags, hostname: str) -> World:
    local_size = _opt_int(env, ("OMPI_COMM_WORLD_LOCAL_SIZE",), _MPI_FIX, low=1)
    if local_size is not None and local_size.value != 1:
        raise AgentError(f"{local_size}: {_MPI_PER_NODE}")
    return _mpi_base(env, flags, hostname)


def _from_mpi_task(env: Mapping[str, str], flags: WorldFlags, hostname: str) -> World:
    world = _mpi_base(env, flags, hostname)
    size, rank = _Int("OMPI_COMM_WORLD_SIZE", world.nnodes), world.node_rank
    local_size = _need_int(env, ("OMPI_COMM_WORLD_LOCAL_SIZE",), _MPI_FIX, low=1)
    local_rank = _need_int(env, ("OMPI_COMM_WORLD_LOCAL_RANK",), _MPI_FIX)
    _below(local_rank, local_size, _MPI_FIX)
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


def _from_k8s(env: Mapping[str, str], flags: WorldFlags, hostname: str) -> World:
    world_size = _need_int(env, ("WORLD_SIZE",), _K8S_FIX, low=1)
    rank = _need_int(env, ("RANK",), _K8S_FIX)
    _below(rank, world_size, _K8S_FIX)
    job = _lookup(env, "TORCHELASTIC_RUN_ID", "JOB_ID")
    return World(
        source="k8s",
        job_id="" if job is None else job[1].strip(),
        step_id="",
        nnodes=world_size.value,
        node_rank=rank.value,
        hosts=(),
        host=hostname,
        master_addr=_master_addr(env, flags, f"MASTER_ADDR is not set: {_K8S_FIX}"),
        master_port=_port(env, _K8S_FIX),
        visible_devices=_visible_devices(env),
    )


def _from_explicit(env: Mapping[str, str], flags: WorldFlags, hostname: str) -> World:
    nnodes = _Int("--nnodes", _flag("--nnodes", flags.nnodes))
    node_rank = _Int("--node-rank", _flag("--node-rank", flags.node_rank))
    master_addr = _flag("--master-addr", flags.master_addr)
    _below(node_rank, nnodes, _EXPLICIT_FIX)
    return World(
        source="explicit",
        job_id="",
        step_id="",
        nnodes=nnodes.value,
        node_rank=node_rank.value,
        hosts=(),
        host=hostname,
        master_addr=master_addr,
        master_port=None,
        visible_devices=_visible_devices(env),
    )


def _flag(name: str, value: _T | None) -> _T:
    if value is None:
        raise AgentError(f"--world explicit needs {name}: {_EXPLICIT_FIX}")
    return value


def _from_local(env: Mapping[str, str], flags: WorldFlags, hostname: str) -> World:
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
        visible_devices=_visible_devices(env),
    )


_PARSERS = {
    "slurm": _from_slurm,
    "slurm-task": _from_slurm_task,
    "mpi": _from_mpi,
    "mpi-task": _from_mpi_task,
    "k8s": _from_k8s,
    "explicit": _from_explicit,
    "local": _from_local,
}
