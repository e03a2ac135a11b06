"""A node's result for one attempt: how its ranks ended, or that the node was lost (pure).

Each node that ran ranks seals its own under `a<k>/result/<agent>`; node 0 writes a lost node's
in its place (agent.node.reporter), so the judging never waits for a node that is gone. Node 0
reads them all (agent.run.execute) and judges (agent.run.verdict). The JSON form keeps the keys
the result has always had; `from_json` takes a record as anyone may have written it: a field
of the wrong type is absent, and it never raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.node.failure import Failure


@dataclass(frozen=True)
class Result:
    # each rank's exit as summary.json has it (agent.run.summary.RankExit.to_json)
    exits: tuple[Mapping[str, Any], ...] = ()
    signal: int | None = None  # the stop signal this node received (SIGINT, SIGTERM)
    refused: str | None = None  # a record this node refused to act on
    warnings: tuple[str, ...] = ()
    failure: Failure | None = None  # what this node published as the attempt's failure
    progressed: bool = False  # a rank printed a --progress-regex line
    leftovers: Mapping[str, Any] | None = None  # its audit (agent.run.leftovers), when news
    step: int | None = None  # the highest step its ranks' progress lines named
    # node 0's, for a node it declared lost: its node rank and host
    lost: bool = False
    node: int | None = None
    host: str | None = None

    @staticmethod
    def gone(node: int | None, host: str) -> Result:
        """What node 0 writes for a node it declared lost."""
        return Result(lost=True, node=node, host=host)

    def to_json(self) -> dict[str, Any]:
        exits = [dict(e) for e in self.exits]
        if self.lost:
            return {"lost": True, "node": self.node, "host": self.host, "exits": exits}
        return {
            "exits": exits,
            "signal": self.signal,
            "refused": self.refused,
            "warnings": list(self.warnings),
            "failure": self.failure.to_json() if self.failure else None,
            "progressed": self.progressed,
            **({"leftovers": dict(self.leftovers)} if self.leftovers else {}),
            **({"step": self.step} if self.step is not None else {}),
        }

    @staticmethod
    def from_json(data: Any) -> Result:
        """A result as read from the store; what is no result reads as one with no ranks."""
        if not isinstance(data, Mapping):
            return Result()
        signal, node = data.get("signal"), data.get("node")
        leftovers = data.get("leftovers")
        return Result(
            exits=tuple(e for e in _list(data.get("exits")) if isinstance(e, Mapping)),
            signal=_int(signal),
            refused=data.get("refused") if isinstance(data.get("refused"), str) else None,
            warnings=tuple(w for w in _list(data.get("warnings")) if isinstance(w, str)),
            failure=Failure.from_json(data.get("failure")),
            progressed=data.get("progressed") is True,
            leftovers=leftovers if isinstance(leftovers, Mapping) else None,
            step=_int(data.get("step")),
            lost=data.get("lost") is True,
            node=_int(node),
            host=data.get("host") if isinstance(data.get("host"), str) else None,
        )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
