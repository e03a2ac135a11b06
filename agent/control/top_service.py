"""Node 0's answers to `agent top`, for one-shot jobs and resident agents alike.

Request: {"op": "top", "run"?: the run of LOG_DIR's control.json} → {"top": {"rows": [...],
"notes": [...], "run": n}}, or an error when no attempt is running (the client's sign that the
job is over). Node 0 relays the request to every node through the attempt's StackDesk
(agent.console.top answers there, at once, without py-spy). Bounded on node 0: at most one gather
in flight; clients that ask meanwhile wait for it and share its rows, and rows younger than
`FRESH` seconds are answered again rather than gathered anew, whatever the number of clients.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from agent.console.top import DESK, MAX_ROWS, TopRow
from agent.run.node_run import Session

GATHER_WAIT = 2.0  # seconds node 0 waits for every node's rows (they answer without py-spy)
FRESH = 0.5  # seconds a gather's rows are answered again instead of gathering anew
MAX_TOTAL = 65536  # rows in one answer to a client (a frame holds them: ~120 bytes each)


class TopService:
    def __init__(self, session: Session, wait: float = GATHER_WAIT) -> None:
        self.session = session
        self.wait = wait
        self._lock = threading.Lock()  # held through a gather: one in flight
        self._last: tuple[object, float, dict[str, Any]] | None = None  # (desk, when, answer)

    def reply(self, message: dict[str, Any]) -> dict[str, Any]:
        desk = self.session.desk
        if desk is None:
            return {"error": "no ranks are running right now (between attempts or runs)", "code": 2}
        run = message.get("run")
        if isinstance(run, int) and desk.stage is not None and desk.stage.run != run:
            return {"error": f"run {run} is over (run {desk.stage.run} is running now)", "code": 2}
        with self._lock:
            last = self._last
            if last is not None and last[0] is desk and time.monotonic() - last[1] < FRESH:
                return {"top": last[2]}
            answer = self._gather(desk)
            self._last = (desk, time.monotonic(), answer)
        return {"top": answer}

    def _gather(self, desk: Any) -> dict[str, Any]:
        answers = desk.gather({"desk": DESK}, self.wait)
        rows: list[TopRow] = []
        notes = []
        for node, answer in zip(desk.nodes, answers, strict=True):
            if answer is None:
                notes.append(f"node {node}'s agent did not answer within {self.wait:g} s")
                continue
            items = answer.get("rows")
            for item in items[:MAX_ROWS] if isinstance(items, list) else []:
                row = TopRow.from_json(item)
                if row is not None:
                    rows.append(row)
            more = answer.get("more")
            if isinstance(more, int) and more > 0:
                notes.append(f"node {node}: {more} more ranks not listed")
        rows.sort(key=lambda row: row.rank)
        if len(rows) > MAX_TOTAL:
            notes.append(f"{len(rows) - MAX_TOTAL} more ranks not listed")
            rows = rows[:MAX_TOTAL]
        stage = desk.stage
        return {
            "rows": [row.to_json() for row in rows],
            "notes": notes,
            "run": stage.run if stage is not None else None,
            "attempt": stage.attempt if stage is not None else None,
        }
