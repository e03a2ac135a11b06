"""Everything an agent decides before it starts a rank: options, shape, placement, log dir."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.binding import default_mode, plan_bindings
from agent.errors import AgentError
from agent.options import Options
from agent.payload import JobShape
from agent.plan import Placement
from agent.topology import Topology, count_gpus, select_gpus
from agent.world import World


@dataclass(frozen=True)
class NodeLayout:
    """This agent's share of the world: which ranks, where they run."""

    first_rank: int
    local_ranks: tuple[int, ...]
    local_world_size: int
    nproc_per_node: int  # the per-node count the shape was computed with
    world_size: int
    placements: tuple[Placement, ...]


def check_script(script: str, options: Options) -> None:
    if options.module:
        return
    if options.no_python:
        if shutil.which(script) is None:
            raise AgentError(f"program {script!r} not found or not executable (--no-python); check the path or PATH")
        return
    path = Path(script)
    if not path.exists():
        raise AgentError(f"script {script!r} not found (cwd {os.getcwd()}); pass the path of your training script")
    if path.is_dir():
        raise AgentError(f"script {script!r} is a directory; pass a .py file, or -m MODULE for a package")
    if not os.access(path, os.R_OK):
        raise AgentError(f"script {script!r} is not readable; fix its permissions (chmod a+r)")


def script_command(script: str, args: Sequence[str], extra: Sequence[str], options: Options) -> tuple[tuple[str, ...], int]:
    """The rank's argv and the index of the script in it."""
    if options.no_python:
        return (script, *args, *extra), 0
    if options.module:
        return (sys.executable, "-m", script, *args, *extra), 2
    return (sys.executable, script, *args, *extra), 1


def nproc_for(world: World, options: Options, env: Mapping[str, str], topology: Topology) -> int:
    if world.task is not None:
        return 1
    gpus = count_gpus(env, topology) if _has_gpus(env, topology) else 0
    wanted = options.nproc_per_node
    if wanted == "auto":
        return max(gpus, 1)
    if wanted == "gpu":
        if gpus == 0:
            raise AgentError("--nproc-per-node gpu: no GPU is visible (CUDA_VISIBLE_DEVICES, SLURM_GPUS_ON_NODE, sysfs); ask Slurm for GPUs (--gpus-per-node) or pass a number")
        return gpus
    count = int(wanted)
    if gpus and count > gpus:
        raise AgentError(
            f"--nproc-per-node {count}: only {gpus} GPU(s) visible on {world.host}; "
            "ask for more GPUs (--gpus-per-node) or start fewer ranks"
        )
    return count


def _has_gpus(env: Mapping[str, str], topology: Topology) -> bool:
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return bool(visible.strip()) and visible.strip() not in ("-1", "NoDevFiles")
    return bool(env.get("SLURM_GPUS_ON_NODE", "").strip("0 ")) or bool(topology.gpus)


def layout(world: World, options: Options, env: Mapping[str, str], topology: Topology) -> NodeLayout:
    nproc = nproc_for(world, options, env, topology)
    if world.task is not None:
        t = world.task
        first, local_ranks, local_world, world_size = t.rank, (t.local_rank,), t.local_world_size, t.world_size
    else:
        first, local_ranks = world.node_rank * nproc, tuple(range(nproc))
        local_world, world_size = nproc, world.nnodes * nproc
    placements = _placements(world, options, env, topology, local_ranks, local_world)
    return NodeLayout(first, local_ranks, local_world, nproc if world.task is None else local_world, world_size, placements)


def _placements(
    world: World, options: Options, env: Mapping[str, str], topology: Topology,
    local_ranks: Sequence[int], local_world: int,
) -> tuple[Placement, ...]:
    has_gpus = _has_gpus(env, topology)
    gpus = select_gpus(topology, world.visible_devices) if has_gpus and topology.gpus else ()
    mode = options.numa_binding
    ranks_gpus = [_gpu_of(gpus, lr, world) for lr in range(local_world)]
    if mode == "auto":
        mode = default_mode(topology, ranks_gpus)
    bindings = plan_bindings(topology, ranks_gpus, mode, options.numa_strict, nproc=local_world)
    placements = []
    for local_rank in local_ranks:
        gpu = ranks_gpus[local_rank] if local_rank < len(ranks_gpus) else None
        binding = bindings[local_rank] if local_rank < len(bindings) else None
        label = _gpu_label(has_gpus, local_rank, world)
        placements.append(
            Placement(
                gpu=label,
                pci=gpu.pci if gpu else None,
                numa_node=(binding.numa_node if binding else (gpu.numa_node if gpu else None)),
                cpus=tuple(sorted(binding.cpus)) if binding else None,
                mem_nodes=tuple(sorted(binding.mem_nodes)) if binding else None,
                strict=binding.strict if binding else False,
                omp_threads=binding.omp_threads if binding else None,
            )
        )
    return tuple(placements)


def _gpu_of(gpus: Sequence[Any], local_rank: int, world: World):
    if not gpus:
        return None
    if len(gpus) == 1:  # srun-only with --gpus-per-task=1: each task sees just its own GPU
        return gpus[0]
    return gpus[local_rank] if local_rank < len(gpus) else None


def _gpu_label(has_gpus: bool, local_rank: int, world: World) -> str | None:
    if not has_gpus:
        return None
    visible = world.visible_devices
    if visible is not None and len(visible) == 1:
        return "0"
    return str(local_rank)


def shape_of(world: World, lay: NodeLayout) -> JobShape:
    if world.task is None:
        return JobShape(lay.world_size, world.nnodes, lay.nproc_per_node)
    if lay.world_size == world.nnodes * lay.local_world_size:
        return JobShape(lay.world_size, world.nnodes, lay.local_world_size)
    return JobShape(lay.world_size, lay.world_size, 1)


def default_log_dir(world: World) -> str:
    if world.job_id:
        step = world.step_id
        return os.path.join("logs", world.job_id + (f".{step}" if step not in ("", "0") else ""))
    return os.path.join("logs", time.strftime("local-%Y%m%d-%H%M%S") + f"-{os.getpid()}")


def check_log_dir(path: str) -> None:
    """Fail fast on a log dir we could not create or write, without creating anything yet."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise AgentError(f"log dir {path!r}: {probe!r} is not a directory; pass --log-dir DIR")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise AgentError(f"log dir {path!r}: {probe!r} is not writable; pass --log-dir DIR on a writable filesystem")


def prepare_log_dir(path: str) -> str:
    """Create it and prove we can write there, before anything starts."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".probe-{os.getpid()}")
        with open(probe, "w"):
            pass
        os.unlink(probe)
    except OSError as exc:
        raise AgentError(f"log dir {path!r} is not writable ({exc.strerror}); pass --log-dir DIR on a writable filesystem") from None
    return path


def write_config(log_dir: str, agent_index: int, config: Mapping[str, Any]) -> str:
    """Each agent writes its own copy (no two nodes write one file on a shared filesystem)."""
    path = os.path.abspath(os.path.join(log_dir, f"resolved-config.agent-{agent_index:05d}.json"))
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(json.dumps(config, sort_keys=True, indent=1, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path
