"""The flight-recorder probe placed in every Python rank (agent.hang.recorder asks it).

Ranks start with this directory first on PYTHONPATH, so Python imports this file as the
`sitecustomize` module at start-up, before the user's script; it then imports the next
`sitecustomize` on the path (the one it shadows), so a site's own customisation still runs.
Warm ranks call `start` from agent.warm.rank_start instead.

The probe is one daemon thread blocked in accept() on a unix socket in the agent's private
0700 directory, `fr-<pid>.sock`; each connection gets one JSON line: per process group, the
last collective this rank entered and completed, and the last few entries of torch's flight
recorder. It uses only the standard library and torch only if the rank imported
torch.distributed itself (it never imports torch: a rank that does not use it pays nothing but
the thread). It starts only in the rank's own process (AGENT_PROBE_PID, set by the exec wrapper),
never in the rank's children that inherit the environment.
"""

from __future__ import annotations

import os
import sys

# Everything else is imported where it is used: this module runs in every Python process that
# inherits the ranks' PYTHONPATH (their children too), most of which start no probe.

DIR_ENV = "AGENT_PROBE_DIR"  # the agent's private directory (its sockets)
PID_ENV = "AGENT_PROBE_PID"  # the rank's own pid: its children do not start a probe
TAIL = 4  # flight-recorder entries per process group that travel
MAX_GROUPS = 64
MAX_ANSWER = 256 << 10  # bytes of one answer


def socket_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"fr-{pid}.sock")


def start(directory: str) -> None:
    """Listen for the agent on this process's socket (a thread of its own)."""
    import contextlib
    import socket
    import threading

    path = socket_path(directory, os.getpid())
    with contextlib.suppress(OSError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(4)
    except OSError:
        listener.close()
        return
    threading.Thread(target=_serve, args=(listener,), name="agent-probe", daemon=True).start()


def _serve(listener) -> None:  # a listening unix socket
    import contextlib
    import json

    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with contextlib.suppress(Exception), conn:
            conn.settimeout(5.0)
            conn.sendall(json.dumps(answer()).encode()[:MAX_ANSWER] + b"\n")


def answer() -> dict:
    """This rank's collectives now; {"torch": False} where torch.distributed is not in use."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not getattr(dist, "is_available", lambda: False)():
        return {"torch": False}
    try:
        if not dist.is_initialized():
            return {"torch": True, "initialised": False}
        return {"torch": True, "initialised": True, "groups": _groups(dist)}
    except Exception as exc:  # a torch that differs from the one we know: say so, bounded
        return {"torch": True, "error": f"{type(exc).__name__}: {exc}"[:300]}


# The pending collectives' entries of the last full dump, by the status they were read under:
# a rank waiting in a collective is asked again and again (its node's watch, `agent stacks`).
_entries_seen: tuple[str, dict] | None = None


# torch keeps two recorders: NCCL's process groups record in NCCL's own (the CUDA build's
# `_dump_nccl_trace_json`), every other backend in the generic one (`_dump_fr_trace_json`).
# Read only the generic one and a rank stuck in an NCCL collective shows none (seen on an H200).
RECORDERS = ("_dump_nccl_trace_json", "_dump_fr_trace_json")


def _groups(dist) -> list[dict]:
    import json

    global _entries_seen
    c10d = dist.distributed_c10d
    native = sys.modules["torch"]._C._distributed_c10d
    dumps = [d for d in (getattr(native, name, None) for name in RECORDERS) if d is not None]
    # The groups' counters alone cost ~10 µs; the entries ~5-20 ms for 200 of them, and only the
    # pending ones are read (collectives.py, overdue.py): a rank with none pending skips them,
    # a rank whose counters did not move since the last dump reuses its entries.
    status: dict = {}
    owner: dict = {}  # group name -> the recorder that saw its collectives (the most entered)
    for index, dump in enumerate(dumps):
        for name, counters in (json.loads(dump(False, False)).get("pg_status") or {}).items():
            if isinstance(counters, dict) and (
                name not in status
                or _int(counters.get("last_enqueued_collective"))
                > _int(status[name].get("last_enqueued_collective"))
            ):
                status[name], owner[name] = counters, index
    seen = json.dumps(status, sort_keys=True)
    if _entries_seen is not None and _entries_seen[0] == seen:
        entries = _entries_seen[1]
    else:
        entries = {}
        for index, dump in enumerate(dumps):
            if not any(
                owner[name] == index
                and _int(s.get("last_enqueued_collective"))
                > _int(s.get("last_completed_collective"))
                for name, s in status.items()
            ):
                continue
            for entry in json.loads(dump(True, False)).get("entries") or ():
                group = str((entry.get("process_group") or ("", ""))[0])
                if owner.get(group) == index:
                    entries.setdefault(group, []).append(entry)
        entries = {name: found[-TAIL:] for name, found in entries.items()}
        _entries_seen = (seen, entries)
    found = []
    world = c10d._world  # the groups this rank belongs to, with their members' global ranks
    for pg, members in list(world.pg_group_ranks.items())[:MAX_GROUPS]:
        name = str(c10d._get_process_group_name(pg))
        mine = entries.get(name, [])
        state = status.get(name) or {}
        found.append(
            {
                "name": name,
                "desc": str(
                    getattr(pg, "group_desc", "") or (mine[-1]["process_group"][1] if mine else "")
                ),
                "ranks": sorted(members)[:65536],
                "entered": _int(state.get("last_enqueued_collective")),
                "completed": _int(state.get("last_completed_collective")),
                "last": [
                    {
                        "seq": e.get("collective_seq_id"),
                        "op": str(e.get("profiling_name", "")).rpartition(":")[2],
                        "sizes": e.get("input_sizes"),
                        "dtypes": e.get("input_dtypes"),
                        "state": e.get("state"),
                        "timeout_ms": e.get("timeout_ms"),
                        "created_ns": e.get("time_created_ns"),
                    }
                    for e in mine[-TAIL:]
                ],
            }
        )
    return found


def _int(value) -> int:
    """torch writes the counters as text ("300"); absent or -1 (never started) reads as 0."""
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def _chain() -> None:
    """Import the sitecustomize this one shadows, if there is one further down the path."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":
    directory = os.environ.get(DIR_ENV)
    if directory and os.environ.get(PID_ENV) == str(os.getpid()):
        start(directory)
    _chain()
