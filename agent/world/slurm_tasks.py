"""Slurm's compressed task layout ("2(x3),1": tasks on each node of a step) → one count per node."""

from __future__ import annotations

import hostlist

from agent.errors import AgentError


def expand_tasks_per_node(text: str, variable: str) -> tuple[int, ...]:
    """`2(x3),1` → (2, 2, 2, 1); AgentError naming `variable` and `text` when malformed or empty."""
    try:
        counts = tuple(hostlist.parse_slurm_tasks_per_node(text.strip()))
    except hostlist.BadHostlist as err:
        raise AgentError(
            f"{variable}={text!r} is not a Slurm task layout such as 2(x3),1 ({err}): "
            "srun sets it for every task of a job step; do not overwrite it in the job script"
        ) from None
    if not counts:
        raise AgentError(
            f"{variable}={text!r} lists no node: srun sets it for every task of a job step; "
            "do not overwrite it in the job script"
        )
    return counts
