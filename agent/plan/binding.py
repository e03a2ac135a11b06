"""Binding: each local rank's CPU set and memory nodes, planned from the topology (pure)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.errors import AgentError
from agent.plan.rank_set import format_ranges
from agent.plan.topology import Gpu, Topology

MODES = ("off", "node", "socket", "exclusive")
_FIX = "pass --numa-binding off to start unbound"


@dataclass(frozen=True)
class Binding:
    cpus: frozenset[int]
    mem_nodes: frozenset[int]  # strict: membind to all of them; else exactly one node, preferred
    strict: bool
    numa_node: int | None  # the GPU's node, for display; None for a rank without a GPU
    omp_threads: int  # physical cores in cpus // ranks given the very same set, at least 1


@dataclass(frozen=True)
class _Place:
    """A rank's CPU set before the memory policy is chosen; `what` names it in errors."""

    cpus: frozenset[int]
    what: str


def default_mode(topology: Topology, gpus: Sequence[Gpu | None] | None = None) -> str:
    """Binding by node when there are GPUs, the allowed CPUs span >1 NUMA node and every GPU's
    node has some of them (so the default never fails); else "off"."""
    present = topology.gpus if gpus is None else tuple(g for g in gpus if g is not None)
    nodes = {n for n, cpus in topology.numa_cpus.items() if cpus & topology.allowed_cpus}
    if not present or len(nodes) < 2:
        return "off"
    return "node" if all(g.numa_node in nodes for g in present) else "off"


def plan_bindings(
    topology: Topology,
    gpus: Sequence[Gpu | None],
    mode: str,
    strict: bool = False,
    nproc: int | None = None,
) -> tuple[Binding | None, ...]:
    """One Binding per local rank; rank i drives gpus[i] (None, or past the end: no GPU)."""
    if mode not in MODES:
        raise AgentError(f"unknown --numa-binding {mode!r}; valid: {', '.join(MODES)}")
    count = len(gpus) if nproc is None else nproc
    ranks: list[Gpu | None] = [*gpus[:count], *[None] * (count - len(gpus))]
    if mode == "off":
        return tuple(None for _ in ranks)
    for rank, gpu in enumerate(ranks):
        if gpu is not None and gpu.numa_node not in topology.numa_cpus:
            known = ", ".join(map(str, sorted(topology.numa_cpus)))
            raise AgentError(
                f"local rank {rank}: GPU {gpu.pci} is on NUMA node {gpu.numa_node}, which is not one "
                f"of this node's NUMA nodes ({known}); {_FIX}"
            )
    places = _PLANNERS[mode](topology, ranks)
    for rank, (gpu, place) in enumerate(zip(ranks, places, strict=True)):
        if not place.cpus:
            raise AgentError(f"local rank {rank}{_gpu_text(gpu)}: {place.what}; {_FIX}")
    sharing = Counter(p.cpus for p in places)
    return tuple(
        _binding(topology, g, p, strict, sharing[p.cpus])
        for g, p in zip(ranks, places, strict=True)
    )


def _gpu_text(gpu: Gpu | None) -> str:
    return f" (GPU {gpu.pci}, NUMA node {gpu.numa_node})" if gpu else " (no GPU)"


def _binding(
    topology: Topology, gpu: Gpu | None, place: _Place, strict: bool, sharing: int
) -> Binding:
    touched = frozenset(n for n, cpus in topology.numa_cpus.items() if cpus & place.cpus)
    preferred = gpu.numa_node if gpu else _main_node(topology, place.cpus)
    mem_nodes = (touched | {preferred}) if strict else frozenset({preferred})
    cores = {topology.core_of.get(c, (0, c)) for c in place.cpus}
    omp = max(1, len(cores) // sharing)
    return Binding(place.cpus, mem_nodes, strict, gpu.numa_node if gpu else None, omp)


def _main_node(topology: Topology, cpus: frozenset[int]) -> int:
    """The node holding most of a GPU-less rank's CPUs: the one to prefer."""
    overlap = {n: len(node_cpus & cpus) for n, node_cpus in topology.numa_cpus.items()}
    return max(sorted(overlap), key=overlap.__getitem__, default=0)


def _allowed(topology: Topology) -> str:
    return f"allowed CPUs: {format_ranges(topology.allowed_cpus) or 'none'}"


def _spread(keys: Sequence[int], count: int) -> list[int]:
    """Ranks without a GPU: contiguous blocks of ranks per node/socket, in order."""
    return [keys[j * len(keys) // count] for j in range(count)]


def _by_node(topology: Topology, ranks: Sequence[Gpu | None]) -> list[_Place]:
    allowed = topology.allowed_cpus
    usable = [n for n, cpus in sorted(topology.numa_cpus.items()) if cpus & allowed]
    cpu_only = iter(_spread(usable, sum(g is None for g in ranks)) if usable else [])
    places = []
    for gpu in ranks:
        node = gpu.numa_node if gpu else next(cpu_only, 0)
        what = f"none of NUMA node {node}'s CPUs is allowed ({_allowed(topology)})"
        places.append(_Place(topology.numa_cpus.get(node, frozenset()) & allowed, what))
    return places


def _socket_of_node(topology: Topology, node: int) -> int | None:
    packages = Counter(topology.core_of.get(c, (0, c))[0] for c in topology.numa_cpus[node])
    return packages.most_common(1)[0][0] if packages else None


def _by_socket(topology: Topology, ranks: Sequence[Gpu | None]) -> list[_Place]:
    allowed = topology.allowed_cpus
    usable = [s for s, cpus in sorted(topology.socket_cpus.items()) if cpus & allowed]
    cpu_only = iter(_spread(usable, sum(g is None for g in ranks)) if usable else [])
    places = []
    for gpu in ranks:
        socket = _socket_of_node(topology, gpu.numa_node) if gpu else next(cpu_only, None)
        if socket is None:
            places.append(_Place(frozenset(), "its NUMA node has no CPUs, so no socket"))
            continue
        what = f"none of socket {socket}'s CPUs is allowed ({_allowed(topology)})"
        cpus = topology.socket_cpus.get(socket, frozenset()) & allowed
        places.append(_Place(cpus, what))
    return places


def _exclusive(topology: Topology, ranks: Sequence[Gpu | None]) -> list[_Place]:
    """Ranks that share a NUMA node (or, without GPUs, the allowed CPUs) split it disjointly."""
    groups: dict[int | None, list[int]] = {}
    for rank, gpu in enumerate(ranks):
        groups.setdefault(gpu.numa_node if gpu else None, []).append(rank)
    places: list[_Place] = [_Place(frozenset(), "")] * len(ranks)
    for node, members in groups.items():
        allowed = topology.allowed_cpus
        pool = allowed if node is None else topology.numa_cpus[node] & allowed
        where = "this node" if node is None else f"NUMA node {node}"
        what = (
            f"{len(members)} ranks share the {len(pool)} allowed CPU(s) of {where}: "
            f"too few to split ({_allowed(topology)})"
        )
        for rank, cpus in zip(members, split_cpus(topology, pool, len(members)), strict=True):
            places[rank] = _Place(cpus, what)
    return places


def split_cpus(topology: Topology, cpus: frozenset[int], parts: int) -> list[frozenset[int]]:
    """Split evenly and contiguously: whole physical cores (with their hyperthread siblings) while
    there are at least as many cores as parts, else single hyperthreads. Sizes differ by <= 1 unit;
    a part is empty when there are fewer CPUs than parts."""
    node_of = {cpu: n for n, node_cpus in topology.numa_cpus.items() for cpu in node_cpus}
    by_core: dict[tuple[int, int, int], list[int]] = {}
    for cpu in sorted(cpus):
        package, core = topology.core_of.get(cpu, (0, cpu))
        by_core.setdefault((node_of.get(cpu, 0), package, core), []).append(cpu)
    cores = [by_core[key] for key in sorted(by_core)]
    units = cores if len(cores) >= parts else [[cpu] for core in cores for cpu in core]
    quotient, remainder = divmod(len(units), parts)
    result, start = [], 0
    for part in range(parts):
        size = quotient + (part < remainder)
        result.append(frozenset(cpu for unit in units[start : start + size] for cpu in unit))
        start += size
    return result


_PLANNERS: dict[str, Callable[[Topology, Sequence[Gpu | None]], list[_Place]]] = {
    "node": _by_node,
    "socket": _by_socket,
    "exclusive": _exclusive,
}
