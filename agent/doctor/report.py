"""The doctor's report: the facts as rich tables, then the default binding and suggestions."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from agent.doctor.advice import Advice
from agent.doctor.facts import Facts
from agent.plan.rank_set import format_ranges
from agent.run.leftovers import Holder


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def _tables(facts: Facts) -> list[Table]:
    topology = facts.topology
    gpus = _table("GPUs (PCI bus order)", "index", "PCI", "NUMA node", "local CPUs", "UUID")
    for i, g in enumerate(topology.gpus):
        gpus.add_row(str(i), g.pci, str(g.numa_node), format_ranges(g.local_cpus), g.uuid or "")
    nodes = _table("NUMA nodes", "node", "CPUs", "allowed", "GPUs")
    for node, cpus in topology.numa_cpus.items():
        here = ", ".join(g.pci for g in topology.gpus if g.numa_node == node)
        nodes.add_row(
            str(node), format_ranges(cpus), format_ranges(cpus & topology.allowed_cpus), here
        )
    nics = _table("Network interfaces", "name", "state", "physical", "IPv4")
    for n in facts.nics:
        nics.add_row(n.name, n.operstate, "yes" if n.physical else "no", ", ".join(n.ipv4))
    ports = _table("InfiniBand/RoCE ports", "port", "state", "link", "RoCE v2 IPv4 GID", "netdev")
    for p in facts.ib_ports:
        gid = p.roce_v2_ipv4
        shown = (f"{gid.index} ({gid.ipv4})", gid.ndev) if gid else ("-", "")
        ports.add_row(f"{p.device}:{p.port}", p.state, p.link_layer, *shown)
    return [t for t in (gpus, nodes, nics, ports) if t.row_count]


def holders_line(holders: Sequence[Holder]) -> str:
    """`GPU holders now: pid 412 (D state, user bob) holds /dev/nvidia0: python train.py; ...`"""
    if not holders:
        return "GPU holders now: none"
    return "GPU holders now: " + "; ".join(h.line() for h in holders[:20])


def render(facts: Facts, advice: Advice, console: Console, holders: Sequence[Holder] = ()) -> None:
    allowed = facts.topology.allowed_cpus
    for table in _tables(facts):
        console.print(table)
    console.print(f"Allowed CPUs: {format_ranges(allowed)} ({len(allowed)})")
    console.print(f"Default --numa-binding here: {advice.mode}")
    for rank, (gpu, b) in enumerate(advice.ranks):
        if b is not None:
            where = f"CPUs {format_ranges(b.cpus)}, memory node {format_ranges(b.mem_nodes)}"
            console.print(f"  local rank {rank} ({gpu.pci if gpu else 'no GPU'}): {where}")
    lines = [f"  {name}={value}" for name, value in facts.env]
    lines = (
        ["Environment in force:", *lines]
        if lines
        else ["Environment: no NCCL_/OMP_/CUDA_/KMP_ set"]
    )
    for s in advice.suggestions:
        lines.append(f"Suggest: {'export ' if '=' in s.setting else ''}{s.setting}  # {s.why}")
    lines += [f"Note: {note}" for note in advice.notes]
    lines.append(holders_line(holders))
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
