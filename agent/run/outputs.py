"""What a run leaves on disk: the log dir, each agent's resolved config, ranks.json, summary.json."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from agent import history
from agent.errors import AgentError

log = logging.getLogger("agent")


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
        probe = os.path.join(path, f".probe-{os.getpid()}-{threading.get_ident()}")
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


def write_ranks(
    log_dir: str, seatings: Sequence[Mapping[str, Any]], nproc_per_node: int, per_task: bool
) -> None:
    """ranks.json: which host runs which rank now ("ranks", for `agent logs` and for people),
    and per attempt which hosts ran, waited as spares or were excluded ("attempts")."""
    last = seatings[-1]["nodes"] if seatings else []
    if per_task:
        ranks = [{"rank": n["ranks"][0], "host": n["host"]} for n in last]
    else:
        ranks = [
            {"rank": n["node"] * nproc_per_node + local, "host": n["host"], "node": n["node"],
             "local_rank": local}
            for n in last
            for local in range(nproc_per_node)
        ]  # fmt: skip
    data = {"ranks": ranks, "attempts": list(seatings)}
    try:
        write_json(os.path.join(log_dir, "ranks.json"), data, **_layout(len(ranks)))
    except OSError as exc:  # `agent logs` then names hosts from the agent logs instead
        log.error("cannot write ranks.json in %s (%s)", log_dir, exc.strerror or exc)


_RESERVE = ".summary-reserve"


def reserve_space(log_dir: str, size: int = 1 << 20) -> None:
    """Node 0 holds room for summary.json from the start: a log disk that fills up during the
    run must not also lose the verdict (the reserve is freed just before the summary is written)."""
    try:
        with open(os.path.join(log_dir, _RESERVE), "wb") as f:
            f.write(bytes(size))
    except OSError:
        pass  # already full: the summary will try anyway


def write_summary(log_dir: str, summary: Mapping[str, Any]) -> str | None:
    """summary.json, or None (logged) when the disk refuses even after freeing the reserve."""
    path = os.path.join(log_dir, "summary.json")
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(log_dir, _RESERVE))
    try:
        ranks = sum(len(a.get("ranks") or ()) for a in summary.get("attempts") or ())
        write_json(path, summary, **_layout(ranks))
    except OSError as exc:
        log.error("cannot write %s (%s)", path, exc.strerror or exc)
        return None
    finally:
        history.record_job(summary, os.environ)  # the user's job history; never raises
    return path


def _layout(entries: int) -> dict[str, Any]:
    """Indented for people up to a few thousand ranks; compact above (4x faster at 32K ranks:
    `agent logs --summary` is how people read those)."""
    return {"indent": 1} if entries <= 4096 else {"separators": (",", ":")}
