"""Node 0's decision on an attempt, as every node acts on it: restart the world, or end with a
code (pure). Sealed under `a<k>/verdict`; the full reasons stay in summary.json."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.errors import ExitCode


@dataclass(frozen=True)
class Decision:
    restart: bool
    code: int  # the job's exit code when it does not restart

    def to_json(self) -> dict[str, Any]:
        return {"restart": self.restart, "code": self.code}

    @staticmethod
    def from_json(data: Any) -> Decision:
        """A sealed decision (node 0's); one without a usable code ends the job as a rank
        failure would, never with success."""
        data = data if isinstance(data, Mapping) else {}
        code = data.get("code")
        known = isinstance(code, int) and not isinstance(code, bool)
        return Decision(data.get("restart") is True, code if known else int(ExitCode.RANK_FAILED))
