"""Apply a rank's CPU and memory binding to the calling process before exec; read one back."""

from __future__ import annotations

import os
from collections.abc import Iterable
from types import ModuleType

# Imports stay this small (no agent.topology, no dataclasses): this runs once per rank, pre-exec.
from agent.errors import AgentError

_NO_LIBNUMA = (
    "py-libnuma/libnuma unavailable: CPUs bound, memory left to the kernel's local first touch"
)


def _parse_list(text: str) -> frozenset[int]:
    """A kernel list ("0-3,8"); agent.topology.parse_cpulist, duplicated to keep imports cheap."""
    found: set[int] = set()
    for part in filter(None, text.strip().split(",")):
        first, _, last = part.partition("-")
        found.update(range(int(first), int(last or first) + 1))
    return frozenset(found)


def _status_field(pid: int | str, field: str) -> str:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return line.split(":", 1)[1].strip()
    return ""


def _policy(pid: int | str) -> str:
    try:
        with open(f"/proc/{pid}/numa_maps") as maps:
            fields = maps.readline().split()
    except OSError:  # kernel without NUMA support, or not our process
        return "unknown"
    return fields[1] if len(fields) > 1 else "default"


def read_binding(pid: int) -> tuple[frozenset[int], str]:
    """(Cpus_allowed_list, policy token of numa_maps' first line: "bind:0", "prefer:0", "default")."""
    return _parse_list(_status_field(pid, "Cpus_allowed_list")), _policy(pid)


def _check_cpus(cpus: frozenset[int]) -> None:
    # Membership in our own affinity is the real range check: CPU ids may have holes, so
    # os.cpu_count() is not an upper bound; and sched_setaffinity would silently drop the rest.
    if not cpus:
        raise AgentError("cannot bind to an empty CPU set; pass --numa-binding off")
    allowed = os.sched_getaffinity(0)
    bad = sorted(c for c in cpus if c not in allowed)
    if bad:
        raise AgentError(
            f"cannot bind to CPUs {bad}: this process may use CPUs {sorted(allowed)}; "
            "pass --numa-binding off"
        )


def _libnuma() -> ModuleType | None:
    try:
        import numa  # py-libnuma: import fails with OSError/AttributeError when libnuma is missing
    except (ImportError, OSError, AttributeError):
        return None
    return numa if numa.info.numa_available() else None


def _check_nodes(nodes: frozenset[int], numa: ModuleType) -> None:
    """py-libnuma segfaults on an out-of-range node and never raises, so check everything first."""
    max_node = numa.info.get_max_node()
    mems = _parse_list(_status_field("self", "Mems_allowed_list"))
    bad = sorted(n for n in nodes if not 0 <= n <= max_node or n not in mems)
    if bad:
        raise AgentError(
            f"cannot bind memory to NUMA node(s) {bad}: this process may use nodes {sorted(mems)} "
            f"(highest node {max_node}); pass --numa-binding off"
        )


def _verify(nodes: frozenset[int], strict: bool) -> list[str]:
    """The set_* calls only print to stderr on failure: read the policy back from numa_maps."""
    token = _policy("self")
    kind, _, listed = token.partition(":")
    expected_kind, expected = ("bind", nodes) if strict else ("prefer", frozenset({min(nodes)}))
    if token == "unknown" or (kind == expected_kind and _parse_list(listed) == expected):
        return []
    wanted = ",".join(map(str, sorted(expected)))
    message = f"memory policy is {token!r}, not {expected_kind}:{wanted}"
    if strict:
        raise AgentError(message)
    return [message]


def apply_binding(cpus: Iterable[int], mem_nodes: Iterable[int], strict: bool) -> list[str]:
    """Bind the calling thread (so the whole program it execs): CPU affinity, then membind (strict)
    or the preferred node; return warnings. Raises AgentError for CPUs/nodes out of reach."""
    cpu_set, nodes = frozenset(cpus), frozenset(mem_nodes)
    _check_cpus(cpu_set)
    os.sched_setaffinity(0, cpu_set)
    if not nodes:
        return []
    numa = _libnuma()
    if numa is None:
        return [_NO_LIBNUMA]
    _check_nodes(nodes, numa)
    warnings = []
    if strict:
        numa.memory.set_membind_nodes(*sorted(nodes))
    else:
        numa.schedule.set_preferred_node(min(nodes))
        if len(nodes) > 1:
            warnings.append(
                f"preferred policy takes one node: preferring {min(nodes)} of {sorted(nodes)}"
            )
    return warnings + _verify(nodes, strict)
