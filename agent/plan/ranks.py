"""World + options + payload + placement → what every rank of this node runs (pure)."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agent.errors import AgentError
from agent.plan.log_dir import LogDir
from agent.plan.rank_set import RankSet

# agent.pause.hook.HOOK and agent.pause.post_mortem.MODULE, named here as text: what runs inside
# a rank is not imported by the plan (tests/test_ranks_debug.py holds the names to the modules).
BREAKPOINT_HOOK = "agent.pause.hook.pause"
POST_MORTEM_MODULE = "agent.pause.post_mortem"


@dataclass(frozen=True)
class Placement:
    """Where one local rank runs: its GPU and its CPU/memory binding (None: unbound)."""

    gpu: str | None = None  # the CUDA index the rank should use, as the rank sees it
    pci: str | None = None
    numa_node: int | None = None
    cpus: tuple[int, ...] | None = None
    mem_nodes: tuple[int, ...] | None = None
    strict: bool = False
    omp_threads: int | None = None


@dataclass(frozen=True)
class Launch:
    """Everything about the job that is the same for every rank."""

    job_id: str
    step_id: str
    world_size: int
    nnodes: int
    master_addr: str
    master_port: int
    attempt: int
    max_restarts: int
    log_dir: str
    config_file: str
    command: tuple[str, ...]  # script argv before per-rank parts (python, script, args...)
    script_at: int = 1  # index of the script (or module name) in command
    extra_env: Mapping[str, str] = field(default_factory=dict)  # from the config payload
    deepspeed: bool = False
    rank_prefix: str | None = None
    prefix_ranks: RankSet | None = None  # None: every rank
    agent_store: bool = True  # False where rank 0 hosts the store (a one-shot one-agent job)
    pdb_timeout: float | None = None  # --pdb: seconds a failed rank stays paused (None: off)
    flight_recorder: bool = True  # torch's recorder on in every rank (--no-flight-recorder)


@dataclass(frozen=True)
class RankSpec:
    rank: int
    local_rank: int
    local_world_size: int
    node_rank: int
    host: str
    placement: Placement
    argv: tuple[str, ...]
    env: Mapping[str, str]  # added to the agent's environment
    out_path: str
    err_path: str
    error_file: str


def script_command(
    script: str, args: Sequence[str], extra: Sequence[str], *, module: bool, no_python: bool
) -> tuple[tuple[str, ...], int]:
    """The rank's argv and the index of the script in it."""
    if no_python:
        return (script, *args, *extra), 0
    if module:
        return (sys.executable, "-m", script, *args, *extra), 2
    return (sys.executable, script, *args, *extra), 1


def rank_env(
    launch: Launch,
    rank: int,
    local_rank: int,
    local_world_size: int,
    node_rank: int,
    placement: Placement,
    error_file: str,
    inherited: Mapping[str, str],
) -> dict[str, str]:
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(launch.world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "GROUP_RANK": str(node_rank),
        "NODE_RANK": str(node_rank),
        "GROUP_WORLD_SIZE": str(launch.nnodes),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(launch.world_size),
        "ROLE_NAME": "default",
        "MASTER_ADDR": launch.master_addr,
        "MASTER_PORT": str(launch.master_port),
        # Ranks join the agent's store instead of rank 0 binding MASTER_PORT (torch honours this);
        # a one-shot one-agent job hosts no TCPStore (it would cost the agent a torch import):
        # rank 0 does. A resident one hosts it once its torch is in (agent.node.ranks_store).
        "TORCHELASTIC_USE_AGENT_STORE": str(launch.agent_store),
        "TORCHELASTIC_RESTART_COUNT": str(launch.attempt),
        "TORCHELASTIC_MAX_RESTARTS": str(launch.max_restarts),
        "TORCHELASTIC_RUN_ID": launch.job_id or "local",
        "TORCHELASTIC_ERROR_FILE": error_file,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "AGENT_CONFIG": launch.config_file,
        "AGENT_LOG_DIR": launch.log_dir,
        "AGENT_ATTEMPT": str(launch.attempt),
        "LAUNCH_AGENT_JOB": f"{launch.job_id or 'local'}.{launch.step_id or '0'}",
    }
    defaults = {
        "PYTHONUNBUFFERED": "1",
        # A lost DNS query must cost 1 s, not 5-10 s, when c10d reverse-resolves the store.
        "RES_OPTIONS": "timeout:1 attempts:1",
        "OMP_NUM_THREADS": str(placement.omp_threads or 1),
        # breakpoint() pauses the rank for `agent debug` instead of reading EOF from /dev/null
        "PYTHONBREAKPOINT": BREAKPOINT_HOOK,
    }
    if launch.pdb_timeout is not None:
        env["AGENT_DEBUG_TIMEOUT"] = f"{launch.pdb_timeout:g}"
    for key, value in defaults.items():
        if key not in inherited:
            env[key] = value
    if launch.flight_recorder:
        env.update(flight_recorder(launch.log_dir, launch.attempt, inherited, buffer_variable()))
    env.update(launch.extra_env)
    return env


FR_BUFFER = "TORCH_FR_BUFFER_SIZE"
# Entries torch's flight recorder keeps per rank unless the user says otherwise: enough for the
# last collectives of every group; a dump of 2,000 costs a rank ~0.2 s of CPU when asked (the
# probe, agent.hang.recorder), of 200 ~5 ms.
FR_ENTRIES = 200
OLD_FR_BUFFER = "TORCH_NCCL_TRACE_BUFFER_SIZE"


def flight_recorder(
    log_dir: str, attempt: int, inherited: Mapping[str, str], buffer_var: str = FR_BUFFER
) -> dict[str, str]:
    """NCCL's flight recorder on, so a collective that times out leaves its last collectives in
    the log dir (torch writes TORCH_NCCL_DEBUG_INFO_TEMP_FILE + rank); whatever the user set
    wins. Costs nothing without NCCL. `buffer_var`: the name this torch reads (`buffer_variable`)."""
    env: dict[str, str] = {}
    if not {FR_BUFFER, OLD_FR_BUFFER} & set(inherited):
        env[buffer_var] = str(FR_ENTRIES)
    if "TORCH_NCCL_DUMP_ON_TIMEOUT" not in inherited:
        env["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"
    if "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in inherited:
        env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = LogDir(log_dir).nccl_trace_prefix(attempt)
    return env


@functools.cache
def buffer_variable() -> str:
    """torch 2.7 renamed the buffer size to TORCH_FR_BUFFER_SIZE and warns in every rank about
    the old name; older torch reads only the old one."""
    version = torch_version()
    try:
        major, minor = (int(part) for part in (version or "").split(".")[:2])
    except ValueError:
        return FR_BUFFER
    return FR_BUFFER if (major, minor) >= (2, 7) else OLD_FR_BUFFER


TORCH_VERSION = re.compile(r"""^__version__\s*(?::\s*\w+\s*)?=\s*['"]([^'"]+)['"]""", re.M)


def torch_version() -> str | None:
    """The installed torch's version, read from torch/version.py as text: neither torch nor
    importlib.metadata is imported for it (the metadata's imports alone are ~50 ms, and its
    version() a few ms more, on every agent's start); None when no torch is found. It may carry
    the build's local tag (2.14.1+cu130) where pip's metadata says 2.14.1."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):  # a torch module without a spec (a stand-in)
        return None
    for root in (spec.submodule_search_locations or ()) if spec is not None else ():
        try:
            with open(os.path.join(root, "version.py"), encoding="utf-8") as f:
                version = version_in(f.read(1 << 16))
        except (OSError, UnicodeDecodeError):
            continue
        if version:
            return version
    return None


def version_in(text: str) -> str | None:
    """`__version__` as a version.py file assigns it (None where it does not)."""
    found = TORCH_VERSION.search(text)
    return found.group(1) if found else None


def rank_argv(launch: Launch, rank: int, local_rank: int, node_rank: int) -> tuple[str, ...]:
    command = list(launch.command)
    if launch.deepspeed:
        # DeepSpeed's launcher passes it first, before the script's own arguments.
        command.insert(launch.script_at + 1, f"--local_rank={local_rank}")
    if launch.pdb_timeout is not None and launch.script_at > 0:  # not with --no-python
        command[1:1] = ["-m", POST_MORTEM_MODULE]
    if launch.rank_prefix and (launch.prefix_ranks is None or rank in launch.prefix_ranks):
        try:
            text = launch.rank_prefix.format(rank=rank, local_rank=local_rank, node=node_rank)
        except (KeyError, IndexError, ValueError) as exc:
            raise AgentError(
                f"--rank-prefix {launch.rank_prefix!r}: bad placeholder {exc}; use {{rank}}, {{local_rank}}, {{node}}"
            ) from None
        command = shlex.split(text) + command
    return tuple(command)


def node_ranks(
    launch: Launch,
    node_rank: int,
    host: str,
    first_rank: int,
    local_ranks: Sequence[int],
    local_world_size: int,
    placements: Sequence[Placement],
    inherited: Mapping[str, str],
) -> tuple[RankSpec, ...]:
    """The ranks one agent runs: per-node mode passes all local ranks, per-task mode one."""
    specs = []
    for offset, local_rank in enumerate(local_ranks):
        rank = first_rank + offset
        out, err, error_file = LogDir(launch.log_dir).rank_files(rank, launch.attempt)
        placement = placements[offset]
        specs.append(
            RankSpec(
                rank=rank,
                local_rank=local_rank,
                local_world_size=local_world_size,
                node_rank=node_rank,
                host=host,
                placement=placement,
                argv=rank_argv(launch, rank, local_rank, node_rank),
                env=rank_env(
                    launch,
                    rank,
                    local_rank,
                    local_world_size,
                    node_rank,
                    placement,
                    error_file,
                    inherited,
                ),
                out_path=out,
                err_path=err,
                error_file=error_file,
            )
        )
    return tuple(specs)
