"""Which GPUs a node's ranks see: CUDA_VISIBLE_DEVICES resolved against the topology (pure)."""

from __future__ import annotations

from collections.abc import Sequence

from agent.errors import AgentError
from agent.plan.topology import Gpu, NvmlLike, Topology, normalize_pci
from agent.world.env import parse_visible

__all__ = [
    "HIDE_ALL",
    "gpu_count",
    "parse_visible",
    "select_gpus",
]

HIDE_ALL = ("-1", "NoDevFiles")  # CUDA_VISIBLE_DEVICES values that hide every GPU


def _by_uuid(token: str, nvml: NvmlLike | None, topology: Topology, shown: str) -> Gpu:
    if nvml is None:
        raise AgentError(
            f"CUDA_VISIBLE_DEVICES={shown}: {token!r} is a UUID and NVML is not available to map it "
            "to a PCI address; install nvidia-ml-py (launch-agent[nvml]), use indices, "
            "or pass --numa-binding off"
        )
    uuids = nvml.uuids()
    legacy_mig = token.startswith("MIG-GPU-")  # MIG-GPU-<uuid>/<gi>/<ci>: look up the parent GPU
    wanted = token[4:].split("/")[0] if legacy_mig else token
    matches = [u for u in uuids if u == wanted] or [u for u in uuids if u.startswith(wanted)]
    if len(matches) != 1:
        why = "matches no GPU or MIG device" if not matches else "matches several devices"
        raise AgentError(f"CUDA_VISIBLE_DEVICES={shown}: {token!r} {why} that NVML reports")
    pci = normalize_pci(uuids[matches[0]])
    found = [g for g in topology.gpus if g.pci == pci]
    if not found:
        raise AgentError(
            f"CUDA_VISIBLE_DEVICES={shown}: {token!r} is at {pci}, which sysfs does not list as a GPU"
        )
    return found[0]


def _by_token(token: str, topology: Topology, nvml: NvmlLike | None, shown: str) -> Gpu:
    if token.isdigit():
        index, count = int(token), len(topology.gpus)
        if index >= count:
            has = (
                f"{count} NVIDIA GPU(s), 0..{count - 1} in PCI bus order"
                if count
                else "no NVIDIA GPU"
            )
            raise AgentError(
                f"CUDA_VISIBLE_DEVICES={shown}: index {index} is out of range; this node has {has}"
            )
        return topology.gpus[index]
    if token.startswith(("GPU-", "MIG-")):
        return _by_uuid(token, nvml, topology, shown)
    raise AgentError(
        f"CUDA_VISIBLE_DEVICES={shown}: {token!r} is neither an index nor a GPU-/MIG- UUID"
    )


def select_gpus(
    topology: Topology, visible: Sequence[str] | None, nvml: NvmlLike | None = None
) -> tuple[Gpu, ...]:
    """The GPUs the children see, in CUDA index order. CUDA would silently stop at a bad token;
    we raise instead, except for the "-1"/"NoDevFiles" idiom, which hides every GPU."""
    if visible is None:
        return topology.gpus
    tokens = [t.strip() for t in visible if t.strip()]
    if not tokens or tokens[0] in HIDE_ALL:
        return ()
    shown = ",".join(tokens)
    gpus = tuple(_by_token(t, topology, nvml, shown) for t in tokens)
    repeated = {g.pci for g in gpus if gpus.count(g) > 1}
    if repeated:
        twice = ", ".join(sorted(repeated))
        raise AgentError(f"CUDA_VISIBLE_DEVICES={shown} names GPU {twice} twice")
    return gpus


def gpu_count(visible: Sequence[str] | None, slurm_gpus: int | None, topology: Topology) -> int:
    """GPUs the children will see: CUDA_VISIBLE_DEVICES, else SLURM_GPUS_ON_NODE, else sysfs
    (the first two as the World parsed them)."""
    if visible is not None:
        return 0 if not visible or visible[0] in HIDE_ALL else len(visible)
    if slurm_gpus is not None:
        return slurm_gpus
    return len(topology.gpus)
