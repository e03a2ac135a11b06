"""Which of a client's exported variables reach the ranks of a resident agent's run (pure).

`python -m agent run` behaves like `srun --export=ALL`: what the user exported in the shell
reaches every rank. What describes a node, a scheduler step or a rank comes from the node the
rank runs on, never from the client's shell (which may be on a login node, outside any step).
"""

from __future__ import annotations

from collections.abc import Mapping

from agent.world.shell import SCHEDULER_PREFIXES

NODE_PREFIXES = (
    *SCHEDULER_PREFIXES,
    "TORCHELASTIC_",
    "AGENT_",  # the launcher's own: AGENT_SECRET never travels, AGENT_STATE_DIR is the client's
)
NODE_NAMES = frozenset(
    {
        # GPUs belong to the node's step.
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
        # torchrun's contract: set per rank by the agent.
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "NODE_RANK",
        # The shell's own view of where it runs.
        "HOSTNAME",
        "HOST",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
    }
)
MAX_VALUE = 128 << 10  # bytes per variable; longer ones stay behind (with a warning)


def passes(name: str) -> bool:
    return name not in NODE_NAMES and not name.startswith(NODE_PREFIXES)


def client_env(environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The variables that travel to every rank, and the names of the oversized ones left out."""
    kept: dict[str, str] = {}
    dropped: list[str] = []
    for name, value in environ.items():
        if not passes(name):
            continue
        if len(name) + len(value) > MAX_VALUE:
            dropped.append(name)
            continue
        kept[name] = value
    return kept, dropped
