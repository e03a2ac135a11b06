"""Every rank's flight recorder, from the agent's side: where the probe goes, asking it, and the
typed record of its answer (agent.hang.probe.sitecustomize is the rank's side).

A rank's answer says, per process group it belongs to, the last collective it entered and
completed and the last few entries of torch's flight recorder (operation, sizes, state). The
agent asks its own ranks, all at once and bounded, when it dumps their stacks; node 0 collates
the answers (agent.hang.collectives). Answers come from the user's processes: parsed as
hostile, bounded, never raising.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.hang.probe.sitecustomize import DIR_ENV, MAX_ANSWER, socket_path

PROBE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe")
ASK_TIMEOUT = 1.0  # seconds for every rank of a node to answer (a rank holding the GIL cannot)
MAX_SEQ = 2**62


def probe_env(directory: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    """What a node's ranks need to start the probe: its directory first on PYTHONPATH (Python
    imports its sitecustomize at start-up) and where to listen. Idempotent."""
    if not directory:
        return {}
    path = environ.get("PYTHONPATH", "")
    if path == PROBE_DIR or path.startswith(PROBE_DIR + os.pathsep):
        return {DIR_ENV: directory}
    return {DIR_ENV: directory, "PYTHONPATH": PROBE_DIR + (os.pathsep + path if path else "")}


def with_probe(environ: Mapping[str, str], directory: str | None) -> dict[str, str]:
    """A node's or a run's environment for its ranks, with the probe listening in `directory`
    (the agent's private one; None: no probe). The warm interpreter is prepared with the same
    one: PYTHONPATH is what a zygote must share with the ranks it forks (agent.warm.command)."""
    return {**environ, **probe_env(directory, environ)}


NO_PROBE = "no probe (not a Python rank, or --no-flight-recorder)"


def ask(directory: str, pid: int, timeout: float = ASK_TIMEOUT) -> dict[str, Any]:
    """One rank's answer as JSON, or {"error": why} (no probe, a rank too busy to answer)."""
    deadline = time.monotonic() + timeout
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(socket_path(directory, pid))
            data = b""
            while not data.endswith(b"\n") and len(data) <= MAX_ANSWER:
                conn.settimeout(max(0.001, deadline - time.monotonic()))
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
    except FileNotFoundError:
        return {"error": NO_PROBE}
    except TimeoutError:
        return {"error": f"no answer within {timeout:g} s (holding the GIL?)"}
    except OSError as exc:
        return {"error": f"cannot reach its probe: {exc.strerror or exc}"}
    try:
        found = json.loads(data)
    except (ValueError, RecursionError):
        return {"error": "an answer that is not one"}
    return found if isinstance(found, dict) else {"error": "an answer that is not one"}


def ask_all(
    directory: str, ranks: Sequence[tuple[int, int]], timeout: float = ASK_TIMEOUT
) -> dict[int, dict[str, Any]]:
    """(rank, pid) → each rank's answer, asked at once (a thread each), within `timeout`. A
    rank with no probe's socket is answered so at once, without a thread: an agent whose ranks
    run no Python (or no probe) asks them every few seconds, and thousands of agents on one
    machine (the scale harness) spent 1.2 ms a second each starting threads for nothing."""
    found: dict[int, dict[str, Any]] = {}

    def one(rank: int, pid: int) -> None:
        found[rank] = ask(directory, pid, timeout)

    listening = []
    for rank, pid in ranks:
        if os.path.exists(socket_path(directory, pid)):
            listening.append((rank, pid))
        else:
            found[rank] = {"error": NO_PROBE}
    threads = [threading.Thread(target=one, args=item, daemon=True) for item in listening]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 0.5)
    return found


def forget(directory: str | None, pids: Sequence[int]) -> None:
    """The ranks' sockets end with their ranks."""
    for pid in pids if directory else ():
        with contextlib.suppress(OSError):
            os.unlink(socket_path(directory or "", pid))


@dataclass(frozen=True)
class Collective:
    seq: int
    op: str  # all_reduce, broadcast, ...
    shape: str  # "[4096, 1024] Float" ("" when the recorder did not say)
    created: float | None = None  # wall time the rank entered it (torch's time_created_ns)
    timeout: float | None = None  # seconds: its process group's timeout (torch's timeout_ms)


@dataclass(frozen=True)
class GroupState:
    """One process group as one rank sees it."""

    name: str  # torch's group name: "0" for the world, then in creation order
    desc: str  # default_pg, or the user's group_desc
    ranks: tuple[int, ...]  # its members' global ranks
    entered: int  # the last collective this rank entered (0: none yet)
    completed: int
    last: tuple[Collective, ...]  # the recorder's last few, oldest first

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "desc": self.desc,
            "ranks": list(self.ranks),
            "entered": self.entered,
            "completed": self.completed,
            "last": [
                {
                    "seq": c.seq,
                    "op": c.op,
                    "shape": c.shape,
                    "created": c.created,
                    "timeout": c.timeout,
                }
                for c in self.last
            ],  # fmt: skip
        }

    def at(self, seq: int) -> Collective | None:
        return next((c for c in self.last if c.seq == seq), None)

    def label(self) -> str:
        if self.desc and self.desc not in ("undefined", "default_pg") or self.name == "0":
            return self.desc or "default_pg"
        if not self.ranks:  # a dump that does not list the members (gloo's)
            return f"group {self.name}"
        return f"group {self.name} (ranks {','.join(map(str, self.ranks[:16]))})"


@dataclass(frozen=True)
class RankRecorder:
    """What a rank's probe said: torch.distributed in use or not, and its groups."""

    torch: bool
    initialised: bool
    groups: tuple[GroupState, ...] = ()
    error: str | None = None  # why there is no answer, or what went wrong in the rank

    def to_json(self) -> dict[str, Any]:
        return {
            "torch": self.torch,
            "initialised": self.initialised,
            "groups": [g.to_json() for g in self.groups],
            "error": self.error,
        }

    @classmethod
    def from_json(cls, data: object) -> RankRecorder:
        if not isinstance(data, dict):
            return cls(False, False, (), "no answer")
        error = data.get("error")
        groups = data.get("groups")
        parsed = tuple(g for g in map(_group, groups[:64] if isinstance(groups, list) else []) if g)
        return cls(
            data.get("torch") is True,
            data.get("initialised") is True,
            parsed,
            str(error)[:300] if error is not None else None,
        )


def _group(data: object) -> GroupState | None:
    if not isinstance(data, dict):
        return None
    ranks = data.get("ranks")
    if not isinstance(ranks, list) or not all(_int(r) for r in ranks[:65536]):
        return None
    entered, completed = _int_or_none(data.get("entered")), _int_or_none(data.get("completed"))
    if entered is None or completed is None:
        return None
    last = data.get("last")
    collectives = tuple(
        c for c in map(_collective, last[:16] if isinstance(last, list) else []) if c
    )
    return GroupState(
        str(data.get("name", ""))[:64],
        str(data.get("desc", ""))[:64],
        tuple(ranks[:65536]),
        max(0, min(entered, MAX_SEQ)),
        max(0, min(completed, MAX_SEQ)),
        collectives,
    )


def _collective(data: object) -> Collective | None:
    if not isinstance(data, dict) or not _int(data.get("seq")):
        return None
    sizes, dtypes = data.get("sizes"), data.get("dtypes")
    shape = str(data["shape"])[:120] if isinstance(data.get("shape"), str) else ""
    if isinstance(sizes, list) and sizes:
        shape = ", ".join(str(s) for s in sizes[:4])[:80]
        if isinstance(dtypes, list) and dtypes:
            shape += " " + ",".join(sorted({str(d) for d in dtypes[:4]}))[:40]
    created, timeout = data.get("created"), data.get("timeout")
    if _number(data.get("created_ns")):  # the probe's and a dump's: torch's own units
        created = data["created_ns"] / 1e9
    if _number(data.get("timeout_ms")):
        timeout = data["timeout_ms"] / 1000
    return Collective(
        int(data["seq"]),
        str(data.get("op", ""))[:40],
        shape,
        _float_or_none(created),
        seconds if (seconds := _float_or_none(timeout)) is not None and seconds > 0 else None,
    )


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float_or_none(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
