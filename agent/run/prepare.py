"""Before a run's first rank starts: node 0 publishes the plan, every node readies itself, barrier.

A failure on any node here (a bad config on node 0, a missing script on node 3, a signal) is
published in the run's scope, which wakes every agent waiting for the plan or at the barrier.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from agent.errors import AgentError, ExitCode, PeerFailed
from agent.node.scope import VALUE_LIMIT, Scope, TooLarge, could_not, refused
from agent.node.stage import StageFilter
from agent.plan import checks
from agent.plan.layout import NodeLayout
from agent.plan.log_dir import LogDir
from agent.plan.roster import Roster, seated
from agent.plan.run_plan import RunPlan, node_layout, rank_specs
from agent.run import outputs
from agent.world import World

log = logging.getLogger("agent")


@dataclass(frozen=True)
class Prepared:
    plan: RunPlan
    layout: NodeLayout  # as first seated (a spare: as if it ran node 0's share)
    config_file: str
    topology: Any  # this node's, read once: each attempt seats the node from it


def replanned(prepared: Prepared, plan: RunPlan, agent_index: int) -> Prepared:
    """Node 0 planned again for a smaller world: this node's copy of the new config."""
    config_file = outputs.write_config(plan.log_dir, agent_index, plan.payload.config)
    return replace(prepared, plan=plan, config_file=config_file)


def prepare(
    scope: Scope,
    *,
    world: World,
    plan: RunPlan | None,
    environ: Mapping[str, str],
    read_topology: Callable[[str], Any],
    timeout: float,
    names: list[str],
    absent: Collection[int] = (),
) -> Prepared:
    """Node 0 passes the plan it decided (published already: `offer`) and the agents it knew
    lost then; the others receive both. Those are not waited for (a resident agent's spare then
    takes a lost node's place in the roll call)."""
    if plan is None:
        record = _receive(scope, timeout, names)
        plan = RunPlan.from_json(record.get("plan"))
        checks.check_script(plan.script, plan.options, plan.cwd)  # it must exist on every node
        absent = _absent(record, world.agents)
    outputs.prepare_log_dir(plan.log_dir)
    try:
        _log_to_file(plan.log_dir, world.agent_index)
        config_file = outputs.write_config(plan.log_dir, world.agent_index, plan.payload.config)
    except OSError as exc:
        raise AgentError(
            f"log dir {plan.log_dir}: cannot write there ({exc.strerror or exc}); free some space "
            "or pass --log-dir DIR on another filesystem"
        ) from None
    _warn_if_low(plan.log_dir)
    if world.agent_index == 0:
        outputs.reserve_space(plan.log_dir)
    topology = read_topology(plan.options.sysfs_root)
    placed = seated(world, Roster.initial(world.agents, plan.options.spares))
    lay = node_layout(plan, placed, topology)
    # Every rank's argv and env can be built (e.g. --rank-prefix placeholders) before the barrier.
    rank_specs(plan, placed, lay, attempt=0, port=0, config_file=config_file, environ=environ)
    kept = {"plan": plan_record(plan, absent)} if world.agent_index == 0 else None
    scope.barrier(
        world.agents, timeout, names, absent=absent, kept=kept, doing="to prepare the run"
    )
    return Prepared(plan, lay, config_file, topology)


def offer(scope: Scope, plan: RunPlan, absent: Collection[int] = ()) -> None:
    """Node 0: publish the plan as soon as it is decided, so nobody waits for it later."""
    try:
        scope.put("plan", plan_record(plan, absent))
    except TooLarge as exc:
        configs = " + ".join(plan.configs) or "the command line"
        raise AgentError(
            f"configs {configs}: the run plan is {exc.size / 2**20:.1f} MiB once sealed and "
            f"encrypted; the job store carries at most {VALUE_LIMIT / 2**20:.1f} MiB per value: "
            "keep large data out of the configs (pass a path to it instead)"
        ) from None


def plan_record(plan: RunPlan, absent: Collection[int]) -> dict[str, Any]:
    return {"plan": plan.to_json(), "absent": sorted(absent)}


def _absent(record: Mapping[str, Any], agents: int) -> frozenset[int]:
    """The record is node 0's (sealed); bounded all the same: never node 0, never out of range."""
    given = record.get("absent") or []
    return frozenset(i for i in given if isinstance(i, int) and 0 < i < agents)


def _receive(scope: Scope, timeout: float, names: list[str]) -> dict[str, Any]:
    if not scope.store.wait([scope.key("plan")], timeout):
        raise AgentError(
            f"rendezvous timed out after {timeout:g}s: node 0 never published the run's plan",
            ExitCode.RENDEZVOUS,
        )

    def woken() -> None:  # a failure anywhere sets the plan key too, to wake us
        failure = scope.failure()
        if failure is not None:
            raise PeerFailed(could_not(failure, names), refused=refused(failure))

    woken()
    return scope.get("plan", "config payload", present=True, timeout=timeout, woken=woken)


LOW_SPACE = 100 << 20


def _warn_if_low(log_dir: str) -> None:
    try:
        stat = os.statvfs(log_dir)
    except OSError:
        return
    free = stat.f_bavail * stat.f_frsize
    if free < LOW_SPACE:
        log.warning(
            "log dir %s has only %.1f MiB free: rank output that does not fit is lost (counted "
            "and reported), the ranks keep running",
            log_dir,
            free / 2**20,
        )


def _log_to_file(log_dir: str, agent_index: int) -> None:
    path = os.path.abspath(LogDir(log_dir).agent_log(agent_index))
    for handler in log.handlers:
        if isinstance(handler, logging.FileHandler):
            if handler.baseFilename == path:
                return
            log.removeHandler(handler)  # a new run of a resident agent: a new log dir
            handler.close()
    handler = logging.FileHandler(path)
    handler.addFilter(StageFilter())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s%(stage)s %(message)s"))
    log.addHandler(handler)
