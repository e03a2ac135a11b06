"""How one run is carried out on this node, beside its plan: set by the command that runs it."""

from __future__ import annotations

import queue
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agent.console.router import LogRouter
from agent.console.view import Sinks
from agent.plan.ranks import RankSpec
from agent.plan.run_plan import RunPlan
from agent.plan.topology import Topology
from agent.run import workers
from agent.run.warm_source import WarmSource


class Spawn(Protocol):
    """Starts one attempt's ranks on this node (agent.run.workers.spawn; the scale bench fakes it)."""

    def __call__(
        self,
        specs: Sequence[RankSpec],
        base_env: Mapping[str, str],
        router: LogRouter,
        prefix_for: Callable[[RankSpec], bytes],
        console: Callable[[RankSpec], bool],
        events: queue.SimpleQueue[Any],
        cwd: str | None = None,
        warm: Any = None,
    ) -> list[workers.Worker]: ...


@dataclass(frozen=True)
class RunTools:
    read_topology: Callable[[str], Topology]  # a fresh look at this node's GPUs
    warm: WarmSource | None = None  # where ranks are forked from (None: always fresh)
    sinks: Sinks | None = None  # a resident agent's run: console lines to its client
    replan: Callable[[int], RunPlan] | None = None  # node 0: the plan for a smaller world
    spawn: Spawn = workers.spawn

    @property
    def warm_enabled(self) -> WarmSource | None:
        """The warm source, if it can fork ranks at all."""
        return self.warm if self.warm is not None and self.warm.enabled else None
