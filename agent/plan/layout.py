"""This node's share of the world (pure): how many ranks, which global ranks, where each runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.errors import AgentError
from agent.plan.binding import default_mode, plan_bindings
from agent.plan.gpus import gpu_count, select_gpus
from agent.plan.options import Options
from agent.plan.payload import JobShape
from agent.plan.ranks import Placement
from agent.plan.topology import Topology
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


def nproc_for(world: World, options: Options, topology: Topology) -> int:
    if world.task is not None:
        return 1
    gpus = gpu_count(world.visible_devices, world.gpus_on_node, topology)
    wanted = options.nproc_per_node
    if wanted == "auto":
        return max(gpus, 1)
    if wanted == "gpu":
        if gpus == 0:
            raise AgentError(
                "--nproc-per-node gpu: no GPU is visible (CUDA_VISIBLE_DEVICES, SLURM_GPUS_ON_NODE, sysfs); ask Slurm for GPUs (--gpus-per-node) or pass a number"
            )
        return gpus
    count = int(wanted)
    if gpus and count > gpus:
        raise AgentError(
            f"--nproc-per-node {count}: only {gpus} GPU(s) visible on {world.host}; "
            "ask for more GPUs (--gpus-per-node) or start fewer ranks"
        )
    return count


def _has_gpus(world: World, topology: Topology) -> bool:
    return gpu_count(world.visible_devices, world.gpus_on_node, topology) > 0


def layout(world: World, options: Options, topology: Topology) -> NodeLayout:
    nproc = nproc_for(world, options, topology)
    local_ranks: tuple[int, ...]
    if world.task is not None:
        t = world.task
        first, local_ranks, local_world, world_size = (
            t.rank,
            (t.local_rank,),
            t.local_world_size,
            t.world_size,
        )
    else:
        first, local_ranks = world.node_rank * nproc, tuple(range(nproc))
        local_world, world_size = nproc, world.nnodes * nproc
    placements = _placements(world, options, topology, local_ranks, local_world)
    return NodeLayout(
        first,
        local_ranks,
        local_world,
        nproc if world.task is None else local_world,
        world_size,
        placements,
    )


def _placements(
    world: World,
    options: Options,
    topology: Topology,
    local_ranks: Sequence[int],
    local_world: int,
) -> tuple[Placement, ...]:
    has_gpus = _has_gpus(world, topology)
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
