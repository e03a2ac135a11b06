"""What a run leaves on disk: the log dir, each agent's resolved config, ranks.json, summary.json."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from agent.errors import AgentError


def write_json(path: str, data: Any, **dump: Any) -> None:
    """Write-then-rename, so a reader never sees half a file (`agent logs --follow` polls them)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, **dump)
        f.write("\n")
    os.replace(tmp, path)


def prepare_log_dir(path: str) -> str:
    """Create it and prove we can write there, before anything starts."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".probe-{os.getpid()}")
        with open(probe, "w"):
            pass
        os.unlink(probe)
    except OSError as exc:
        raise AgentError(
            f"log dir {path!r} is not writable ({exc.strerror}); pass --log-dir DIR on a writable filesystem"
        ) from None
    return path


def write_config(log_dir: str, agent_index: int, config: Mapping[str, Any]) -> str:
    """Each agent writes its own copy (no two nodes write one file on a shared filesystem)."""
    path = os.path.abspath(os.path.join(log_dir, f"resolved-config.agent-{agent_index:05d}.json"))
    write_json(path, config, sort_keys=True, indent=1, ensure_ascii=False)
    return path


def write_ranks(log_dir: str, hosts: Sequence[str], nproc_per_node: int, per_task: bool) -> None:
    """ranks.json: which host runs which rank, for `agent logs` and for people."""
    if per_task:
        ranks = [{"rank": i, "host": host} for i, host in enumerate(hosts)]
    else:
        n = nproc_per_node
        ranks = [
            {"rank": node * n + local, "host": host, "node": node, "local_rank": local}
            for node, host in enumerate(hosts)
            for local in range(n)
        ]
    write_json(os.path.join(log_dir, "ranks.json"), {"ranks": ranks}, indent=1)


def write_summary(log_dir: str, summary: Mapping[str, Any]) -> str:
    path = os.path.join(log_dir, "summary.json")
    write_json(path, summary, indent=1)
    return path
