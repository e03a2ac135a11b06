"""Node 0's answers to `agent debug`, for one-shot jobs and resident agents alike.

Requests ({"op": "debug", "action": ...}, optionally "run": the run of LOG_DIR's control.json):
- "list" → {"paused": [records]}: every node's paused ranks (agent.pause.desk).
- "command" {"ranks": [r] | "all", "line"} → {"answers": {"<rank>:<pid>": {"output", "state"}},
  "held": {"<rank>:<pid>": client}}: one pdb line on every paused process of those ranks (a
  rank's forked workers included), processes another client holds left out.
- "attach" {"rank", "pid"?, "client"} → {"attached": record, "output"}; then, on the same
  connection, {"line"} or {"take"} → {"output", "state"} until the client leaves ({"detach"} or
  closing it). A rank with several paused processes needs the pid (refused naming them). One
  client per process: a second is refused with the first one's name; a client that goes away
  (Ctrl-D, Ctrl-], killed) leaves the process paused and free.
A pdb line over agent.pause.frames.MAX_LINE characters is refused with one line (`-c`: an error;
a session: that line as the output, pdb still at its prompt): it never reaches the rank.
"""

from __future__ import annotations

import threading
from typing import Any

from agent.control import wire
from agent.pause.desk import PauseDesk
from agent.pause.link import BUSY, GONE, PROMPT
from agent.pause.paused import Paused, answer_key, label, line_refused, several
from agent.plan.rank_set import format_ranges
from agent.run.node_run import Session

ATTACHED_WAIT = 5.0  # seconds a line waits for pdb's next prompt before the client asks again
COMMAND_WAIT = 10.0  # the same for `-c CMD`
TAKE_WAIT = 2.0


class DebugService:
    def __init__(self, session: Session) -> None:
        self.session = session
        self._owners: dict[tuple[int, int], str] = {}  # (rank, pid) → the client attached to it
        self._lock = threading.Lock()

    def handle(self, channel: wire.Channel, first: dict[str, Any]) -> None:
        pauses, error = self._desk(first)
        if pauses is None:
            channel.send(error)
            return
        action = first.get("action")
        if action == "list":
            channel.send({"paused": [p.to_json() for p in paused_ranks(pauses)]})
        elif action == "command":
            channel.send(self._command(pauses, first))
        elif action == "attach":
            self._attach(pauses, channel, first)
        else:
            channel.send({"error": f"unknown debug action {str(action)[:40]!r}", "code": 2})

    def _desk(self, message: dict[str, Any]) -> tuple[PauseDesk | None, dict[str, Any]]:
        pauses = self.session.pauses
        if pauses is None:
            return None, {
                "error": "no ranks are running right now (between attempts or runs)",
                "code": 2,
            }
        run = message.get("run")  # the run whose control.json the client read (None: any)
        if isinstance(run, int) and pauses.stage.run != run:
            return None, {
                "error": f"run {run} is over (run {pauses.stage.run} is running now)",
                "code": 2,
            }
        return pauses, {}

    def _command(self, pauses: PauseDesk, message: dict[str, Any]) -> dict[str, Any]:
        line = message.get("line")
        if not isinstance(line, str) or "\n" in line.rstrip("\n"):
            return {"error": "-c takes one pdb command", "code": 2}
        refused = line_refused(line)
        if refused is not None:
            return {"error": refused.removeprefix("[agent] "), "code": 2}
        paused = paused_ranks(pauses)
        ranks = {p.rank for p in paused}
        asked = message.get("ranks")
        wanted = ranks if asked == "all" else {r for r in _ints(asked) if r in ranks}
        if not wanted:
            return {"error": _not_paused(_ints(asked), ranks), "code": 2}
        processes = {(p.rank, p.pid) for p in paused if p.rank in wanted}  # each one of a rank
        with self._lock:
            held = {p: self._owners[p] for p in processes if p in self._owners}
        free = sorted(processes - set(held))
        answers: dict[str, Any] = {}
        if free:
            request = {
                "op": "send",
                "ranks": sorted({rank for rank, _ in free}),
                "procs": [list(p) for p in free],
                "line": line,
                "wait": COMMAND_WAIT,
            }
            answers = _merged(pauses.ask(request))
        named = several(processes)
        if asked != "all" and held and not free:
            process, owner = next(iter(held.items()))
            return {"error": f"{label([process], named)} is being debugged by {owner}", "code": 2}
        return {"answers": answers, "held": {answer_key(*p): owner for p, owner in held.items()}}

    def _attach(self, pauses: PauseDesk, channel: wire.Channel, first: dict[str, Any]) -> None:
        rank, client = first.get("rank"), str(first.get("client") or "another client")[:200]
        paused = paused_ranks(pauses)
        if not isinstance(rank, int) or rank not in {p.rank for p in paused}:
            asked = [rank] if isinstance(rank, int) else []
            channel.send({"error": _not_paused(asked, {p.rank for p in paused}), "code": 2})
            return
        found = [p for p in paused if p.rank == rank]
        pid = first.get("pid")
        chosen = [p for p in found if p.pid == pid] if isinstance(pid, int) else found
        if len(chosen) != 1:  # several processes of the rank paused, or not the one named
            pids = ", ".join(str(p.pid) for p in found)
            why = (
                f"no process {pid} of rank {rank} is paused"
                if chosen == []
                else (f"rank {rank} has {len(found)} paused processes")
            )
            channel.send({"error": f"{why} (pids {pids}): pass --pid PID", "code": 2})
            return
        where = chosen[0]
        process = (where.rank, where.pid)
        named = several((p.rank, p.pid) for p in paused)
        with self._lock:
            owner = self._owners.get(process)
            if owner is None:
                self._owners[process] = client
        if owner is not None:
            who = label([process], named)
            channel.send({"error": f"{who} is being debugged by {owner}", "code": 2})
            return
        try:
            # where pdb stopped first, as each client attaching sees it (not only the first)
            request = {"op": "take", "ranks": [rank], "procs": [list(process)], "wait": 0}
            request["banner"] = True
            answer = _merged(pauses.ask(request))
            output = str(answer.get(answer_key(*process), {}).get("output", ""))
            channel.send({"attached": where.to_json(), "output": output})
            self._session(pauses, channel, process)
        finally:
            with self._lock:
                self._owners.pop(process, None)

    def _session(self, pauses: PauseDesk, channel: wire.Channel, process: tuple[int, int]) -> None:
        rank = process[0]
        to = {"ranks": [rank], "procs": [list(process)]}  # this process, not its rank's others
        while True:
            try:
                message = channel.recv(None)
            except Exception:  # the client went away: the rank stays paused
                return
            if message is None or message.get("detach"):
                return
            line = message.get("line")
            refused = line_refused(line) if isinstance(line, str) else None
            if refused is not None:  # pdb still waits at its prompt: the client may try again
                channel.send({"output": refused + "\n", "state": PROMPT})
                continue
            if isinstance(line, str):
                request = {"op": "send", **to, "line": line, "wait": ATTACHED_WAIT}
            else:
                request = {"op": "take", **to, "wait": TAKE_WAIT}
            answer = _merged(pauses.ask(request)).get(answer_key(*process))
            if not isinstance(answer, dict):
                answer = {"output": "", "state": GONE}
            channel.send(
                {"output": str(answer.get("output", "")), "state": answer.get("state", BUSY)}
            )


def paused_ranks(pauses: PauseDesk | None) -> list[Paused]:
    """Every node's paused ranks, by rank (none between attempts)."""
    found: list[Paused] = []
    for answer in pauses.ask({"op": "list"}) if pauses is not None else ():
        items = answer.get("paused") if isinstance(answer, dict) else None
        for item in items[:65536] if isinstance(items, list) else []:
            try:
                found.append(Paused.from_json(item))
            except ValueError:
                continue
    return sorted(found, key=lambda p: (p.rank, p.pid))


def _merged(answers: list[dict[str, Any] | None]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for answer in answers:
        part = answer.get("answers") if isinstance(answer, dict) else None
        if isinstance(part, dict):
            merged.update(part)
    return merged


def _ints(value: object) -> list[int]:
    if not isinstance(value, list):
        return []
    return [r for r in value if isinstance(r, int) and not isinstance(r, bool)]


def _not_paused(asked: list[int], paused: set[int]) -> str:
    if not paused:
        return "no rank is paused now (ranks pause at breakpoint(), or with --pdb at an exception)"
    which = f"rank {asked[0]} is not paused" if asked else "none of those ranks is paused"
    return f"{which}; paused now: {format_ranges(sorted(paused))}"
