"""Node 0's answers to `agent debug`, for one-shot jobs and resident agents alike.

Requests ({"op": "debug", "action": ...}, optionally "run": the run of LOG_DIR's control.json):
- "list" → {"paused": [records]}: every node's paused ranks (agent.pause.desk).
- "command" {"ranks": [r] | "all", "line"} → {"answers": {rank: {"output", "state"}}, "held":
  {rank: client}}: one pdb line on each paused rank, ranks another client holds left out.
- "attach" {"rank", "client"} → {"attached": record, "output"}; then, on the same connection,
  {"line"} or {"take"} → {"output", "state"} until the client leaves ({"detach"} or closing it).
  One client per rank: a second is refused with the first one's name; a client that goes away
  (Ctrl-D, Ctrl-], killed) leaves the rank paused and free.
A pdb line over agent.pause.frames.MAX_LINE characters is refused with one line (`-c`: an error;
a session: that line as the output, pdb still at its prompt): it never reaches the rank.
"""

from __future__ import annotations

import threading
from typing import Any

from agent.control import wire
from agent.pause.desk import PauseDesk
from agent.pause.link import BUSY, GONE, PROMPT
from agent.pause.paused import Paused, line_refused
from agent.plan.rank_set import format_ranges
from agent.run.node_run import Session

ATTACHED_WAIT = 5.0  # seconds a line waits for pdb's next prompt before the client asks again
COMMAND_WAIT = 10.0  # the same for `-c CMD`
TAKE_WAIT = 2.0


class DebugService:
    def __init__(self, session: Session) -> None:
        self.session = session
        self._owners: dict[int, str] = {}  # rank → the client attached to it
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
        paused = {p.rank for p in paused_ranks(pauses)}
        asked = message.get("ranks")
        wanted = paused if asked == "all" else {r for r in _ints(asked) if r in paused}
        if not wanted:
            return {"error": _not_paused(_ints(asked), paused), "code": 2}
        with self._lock:
            held = {r: self._owners[r] for r in wanted if r in self._owners}
        ranks = sorted(wanted - set(held))
        answers: dict[str, Any] = {}
        if ranks:
            request = {"op": "send", "ranks": ranks, "line": line, "wait": COMMAND_WAIT}
            answers = _merged(pauses.ask(request))
        if asked != "all" and held and not ranks:
            rank, owner = next(iter(held.items()))
            return {"error": f"rank {rank} is being debugged by {owner}", "code": 2}
        return {"answers": answers, "held": {str(r): owner for r, owner in held.items()}}

    def _attach(self, pauses: PauseDesk, channel: wire.Channel, first: dict[str, Any]) -> None:
        rank, client = first.get("rank"), str(first.get("client") or "another client")[:200]
        found = {p.rank: p for p in paused_ranks(pauses)}
        if not isinstance(rank, int) or rank not in found:
            channel.send(
                {
                    "error": _not_paused([rank] if isinstance(rank, int) else [], set(found)),
                    "code": 2,
                }
            )
            return
        with self._lock:
            owner = self._owners.get(rank)
            if owner is None:
                self._owners[rank] = client
        if owner is not None:
            channel.send({"error": f"rank {rank} is being debugged by {owner}", "code": 2})
            return
        try:
            answer = _merged(pauses.ask({"op": "take", "ranks": [rank], "wait": 0}))
            output = str(answer.get(str(rank), {}).get("output", ""))
            channel.send({"attached": found[rank].to_json(), "output": output})
            self._session(pauses, channel, rank)
        finally:
            with self._lock:
                self._owners.pop(rank, None)

    def _session(self, pauses: PauseDesk, channel: wire.Channel, rank: int) -> None:
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
                request = {"op": "send", "ranks": [rank], "line": line, "wait": ATTACHED_WAIT}
            else:
                request = {"op": "take", "ranks": [rank], "wait": TAKE_WAIT}
            answer = _merged(pauses.ask(request)).get(str(rank))
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
    return sorted(found, key=lambda p: p.rank)


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
