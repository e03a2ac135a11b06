"""What to set for NCCL and how ranks would be bound here, from the node's facts (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agent.doctor.facts import Facts, IbPort, Nic
from agent.errors import AgentError
from agent.plan.binding import Binding, default_mode, plan_bindings
from agent.plan.topology import Gpu


@dataclass(frozen=True)
class Suggestion:
    setting: str  # "NCCL_IB_GID_INDEX=3", or a command such as "unset NCCL_IB_GID_INDEX"
    why: str


@dataclass(frozen=True)
class Advice:
    suggestions: tuple[Suggestion, ...]
    notes: tuple[str, ...]  # what was not found, warnings
    mode: str  # the default --numa-binding here
    ranks: tuple[tuple[Gpu | None, Binding | None], ...]  # that default, per local rank


def _hca_value(devices: Sequence[str], present: Sequence[str]) -> str:
    """NCCL_IB_HCA matches prefixes (mlx5_1 also takes mlx5_10): "=" for exact when that bites."""
    ambiguous = any(other != d and other.startswith(d) for d in devices for other in present)
    return ("=" if ambiguous else "") + ",".join(devices)


def _rdma_suggestions(ports: Sequence[IbPort]) -> list[Suggestion]:
    chosen = {
        p: g for p in ports if p.active and p.link_layer == "Ethernet" and (g := p.roce_v2_ipv4)
    }
    out = []
    if len({g.index for g in chosen.values()}) == 1:
        where = ", ".join(f"{p.device}:{p.port} ({g.ipv4})" for p, g in chosen.items())
        index = next(iter(chosen.values())).index
        out.append(Suggestion(f"NCCL_IB_GID_INDEX={index}", f"the RoCE v2 IPv4 GID on {where}"))
    elif chosen:
        where = ", ".join(f"{p.device}:{p.port}={g.index}" for p, g in chosen.items())
        why = f"RoCE v2 IPv4 GID indices differ ({where}); NCCL >= 2.21 picks one per device"
        out.append(Suggestion("unset NCCL_IB_GID_INDEX", why))
    usable = sorted(
        {p.device for p in ports if p.active and (p.link_layer != "Ethernet" or p in chosen)}
    )
    if usable:
        value = _hca_value(usable, sorted({p.device for p in ports}))
        why = "the HCAs with an ACTIVE InfiniBand port or a RoCE v2 IPv4 GID"
        out.append(Suggestion(f"NCCL_IB_HCA={value}", why))
    return out


def _socket_suggestion(nics: Sequence[Nic], ports: Sequence[IbPort]) -> list[Suggestion]:
    roce = sorted({g.ndev for p in ports if p.active and (g := p.roce_v2_ipv4) and g.ndev})
    up = [n for n in nics if n.physical and n.operstate in ("up", "unknown")]
    up.sort(key=lambda n: not n.ipv4)  # interfaces with an IPv4 address first
    if roce:
        name, why = ",".join(roce), "the netdev behind the RoCE GID"
    elif up:
        name, why = up[0].name, "the first physical interface that is up"
    else:
        return []
    return [Suggestion(f"NCCL_SOCKET_IFNAME={name}", f"{why} (also GLOO_SOCKET_IFNAME)")]


def _default_binding(
    facts: Facts,
) -> tuple[str, tuple[tuple[Gpu | None, Binding | None], ...], str]:
    gpus: tuple[Gpu | None, ...] = facts.selected or (None,)
    mode = default_mode(facts.topology, facts.selected)
    try:
        bindings = plan_bindings(facts.topology, gpus, mode)
    except AgentError as error:
        return mode, (), str(error)
    return mode, tuple(zip(gpus, bindings, strict=True)), ""


def _missing(facts: Facts) -> list[str]:
    root, topology = facts.root, facts.topology
    notes = []
    if not topology.gpus:
        notes.append(f"found no NVIDIA GPUs under {root / 'sys/bus/pci/devices'}")
    cpu_nodes = [n for n, cpus in topology.numa_cpus.items() if cpus]
    if len(cpu_nodes) < 2:
        notes.append(f"found {len(cpu_nodes)} NUMA node with CPUs: binding has nothing to choose")
    if not facts.ib_ports:
        where = root / "sys/class/infiniband"
        notes.append(f"found no InfiniBand/RoCE devices under {where}: NCCL will use TCP sockets")
    return notes


def advise(facts: Facts) -> Advice:
    """Pure: the suggestions, the default binding and what was not found."""
    env = dict(facts.env)
    found = _rdma_suggestions(facts.ib_ports) + _socket_suggestion(facts.nics, facts.ib_ports)
    suggestions = []
    for s in found:
        name = s.setting.split("=")[0].split()[-1]
        why = f"{s.why}; now {name}={env[name]}" if name in env else s.why
        suggestions.append(Suggestion(s.setting, why))
    mode, ranks, error = _default_binding(facts)
    notes = [*facts.topology.warnings, *_missing(facts), facts.selection_error, error]
    if not suggestions:
        notes.append("nothing to suggest for NCCL: its defaults fit what was found")
    return Advice(tuple(suggestions), tuple(n for n in notes if n), mode, ranks)
