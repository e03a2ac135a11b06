"""The round before every attempt, as each agent lives it: examine this node, post its health,
and — node 0 — decide the lineup (who is out and why, who takes whose place, a new plan)."""

from __future__ import annotations

import logging
import time
from typing import Any

from agent.errors import AgentError, ExitCode
from agent.node.scope import Scope
from agent.plan.roster import Roster, Shortfall, excluded_hosts, foreign_excludes, seated
from agent.plan.run_plan import node_layout
from agent.run.gpu_faults import gpu_faults
from agent.run.health import Health, HealthCheck, examine
from agent.run.lineup import (
    REPORT_SLACK,
    Lineup,
    await_key,
    check_wait,
    exclusions,
    gather,
    post_health,
    round_failure,
)
from agent.run.prepare import Prepared
from agent.run.summary import node_failure

log = logging.getLogger("agent")


def roll_call(self: Any, prepared: Prepared, roster: Roster, attempt: int) -> Lineup:
    """This agent's part in the round (self: Attempts). It is entered first, so that a stop
    signal or a failure anywhere during a slow --health-check ends the round within a second."""
    scope = self.scope_of(f"l{attempt}")
    leader = self.world.agent_index == 0
    # Node 0: a member lost mid-round fails this round (waking the gather), not an attempt.
    self.enter(scope, _ranks_of(roster) if leader else None)
    health = examine_node(self, prepared, roster, scope)
    if health is not None:
        post_health(scope, health, len(roster.members()))
    if leader:
        lineup = _decide(self, prepared, roster, attempt, scope)
        scope.put("lineup", lineup.to_json())
        return lineup
    await_key(scope, "lineup", self.events, fatal=round_failure)
    return Lineup.from_json(scope.get("lineup", "lineup"))


def examine_node(self: Any, prepared: Prepared, roster: Roster, scope: Scope) -> Health | None:
    """This node's health for the next attempt (None: not a member any more). self: Attempts."""
    if self.world.agent_index not in roster.members():
        return None
    plan, o = prepared.plan, prepared.plan.options
    lay = node_layout(plan, seated(self.world, roster), prepared.topology)
    pcis = frozenset(p.pci for p in lay.placements if p.pci)
    read = self.read_topology

    def present() -> set[str]:
        return {g.pci for g in read(o.sysfs_root).gpus} if read else set(pcis)

    def over() -> bool:
        return check_wait(scope, self.events, round_failure) is not None

    check = HealthCheck(plan.log_dir, pcis, o.min_free_mib, o.health_check, o.health_timeout)
    health = examine(check, present, lambda: gpu_faults(pcis), self.environ, plan.cwd, over)
    if not health.ok:
        log.error("%s failed its health check: %s", self.world.host, "; ".join(health.problems))
    return health


def _decide(
    self: Any,  # the Attempts
    prepared: Prepared,
    roster: Roster,
    attempt: int,
    scope: Scope,
) -> Lineup:
    plan, o = prepared.plan, prepared.plan.options
    reports = gather(scope, roster.members(), lambda: self.lost().keys(), o.health_timeout)
    failure = round_failure(scope)
    if failure is not None:  # an agent stopped mid-round
        return Lineup(0, roster, end={"code": int(ExitCode.RANK_FAILED), "cause": failure})
    hosts = self.hosts()
    foreign = foreign_excludes(o.exclude, hosts) if attempt == 0 else None
    if foreign:
        log.warning("%s", foreign)
    waited = o.health_timeout + REPORT_SLACK
    out = exclusions(
        roster, reports, self.lost(), excluded_hosts(o.exclude), hosts, attempt, waited
    )
    for exclusion in out:
        log.error("excluding %s from the job: %s", exclusion.host, exclusion.why)
    try:
        new = roster.without(out, o.min_nodes)
    except Shortfall as exc:
        ended = Roster(roster.nodes, roster.spares, roster.excluded + tuple(out))
        first = out[0] if out else None
        cause = _cause(exc.message, roster, first.agent if first else 0, hosts)
        return Lineup(0, ended, end={"code": int(exc.code), "cause": cause})
    replanned = None
    if self.world.task is None and len(new.nodes) != plan.nnodes and self.replan is not None:
        try:
            replanned = self.replan(len(new.nodes))
        except AgentError as exc:
            why = f"the world shrank to {len(new.nodes)} node(s) and the configs no longer fit: {exc.message}"
            return Lineup(
                0, new, end={"code": int(exc.code), "cause": _cause(why, roster, 0, hosts)}
            )
    return Lineup(self.serve_workers(), new, replanned)


def _ranks_of(roster: Roster) -> dict[int, Any]:
    """Every member → its node rank (spares: None), for the records of lost members."""
    return {
        agent: roster.nodes.index(agent) if agent in roster.nodes else None
        for agent in roster.members()
    }


def _cause(how: str, roster: Roster, agent: int, hosts: list[str]) -> dict[str, Any]:
    rank = roster.nodes.index(agent) if agent in roster.nodes else None
    host = hosts[agent] if agent < len(hosts) else f"agent {agent}"
    return {**node_failure("excluded", rank, host, how, time.time()), "agent": agent}
