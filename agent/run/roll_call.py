"""The round before every attempt, as each agent lives it: examine this node, post its health,
and — node 0 — decide the lineup (who is out and why, who takes whose place, a new plan)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from agent.errors import AgentError, ExitCode
from agent.node.failure import Failure, Kind
from agent.node.scope import Scope
from agent.node.seat import RunSeat
from agent.plan.roster import Roster, Shortfall, excluded_hosts, foreign_excludes, seated
from agent.plan.run_plan import node_layout
from agent.run.bounded_wait import await_sealed, kept, lineup_limit, node0_over, wait_tick
from agent.run.gpu_faults import gpu_faults
from agent.run.health import Health, HealthCheck, examine
from agent.run.leftovers import LeftoverAudit, Leftovers, node_audit
from agent.run.lineup import (
    REPORT_SLACK,
    Lineup,
    LineupEnd,
    check_wait,
    exclusions,
    gather,
    post_health,
    round_failure,
)
from agent.run.prepare import Prepared
from agent.run.tools import RunTools

log = logging.getLogger("agent")


class RollCall:
    """One agent's part in the round before an attempt."""

    def __init__(
        self,
        seat: RunSeat,
        tools: RunTools,
        prepared: Prepared,
        roster: Roster,  # the last lineup's
        attempt: int,
        scope: Scope,  # the round's keys (r<run>/l<attempt>)
        held: Leftovers | None = None,  # this node's GPUs still held after its last attempt
    ) -> None:
        self.seat, self.tools, self.prepared = seat, tools, prepared
        self.roster, self.attempt, self.scope = roster, attempt, scope
        self.held = held

    def lineup(self, lost: Callable[[], Mapping[int, str]]) -> Lineup:
        """Who runs this attempt. It is entered first, so that a stop signal or a failure
        anywhere during a slow --health-check ends the round within a second. `lost` (node
        0): the agents out of the job → why, asked again while the health reports come in."""
        seat, scope = self.seat, self.scope
        # Node 0: a member lost mid-round fails this round (waking the gather), not an attempt.
        seat.enter(scope, self.roster.ranks_by_agent(spares=True) if seat.leader else None)
        health = self.examine()
        if health is not None:
            post_health(scope, health, len(self.roster.members()))
        if seat.leader:
            lineup = self._decide(lost, health)
            scope.put_again("lineup", lineup.to_json(), 1)  # and a first copy the members block on
            return lineup
        limit = lineup_limit(self.prepared.plan.options.health_timeout)
        over = node0_over(
            scope,
            kept(scope, f"health/{scope.index}", health.to_json(), "health report")
            if health is not None
            else lambda: None,
        )
        record = await_sealed(
            scope, "lineup", "lineup", seat.events, round_failure, over, limit,
            tick=wait_tick(len(self.roster.members())),
        )  # fmt: skip
        return Lineup.from_json(record)

    def examine(self) -> Health | None:
        """This node's health for the next attempt (None: not a member any more)."""
        seat, roster, scope = self.seat, self.roster, self.scope
        if seat.world.agent_index not in roster.members():
            return None
        plan, o = self.prepared.plan, self.prepared.plan.options
        lay = node_layout(plan, seated(seat.world, roster), self.prepared.topology)
        pcis = frozenset(p.pci for p in lay.placements if p.pci)
        read = self.tools.read_topology

        def present() -> set[str]:
            return {g.pci for g in read(o.sysfs_root).gpus}

        def over() -> bool:
            return check_wait(scope, seat.events, round_failure) is not None

        check = HealthCheck(plan.log_dir, pcis, o.min_free_mib, o.health_check, o.health_timeout)
        health = examine(check, present, lambda: gpu_faults(pcis), seat.environ, plan.cwd, over)
        if self.held is not None:  # held after the last attempt: still? (one more look)
            now = self.audit().still_held(self.held, self._keep())
            if now.unusable:
                health = replace(health, problems=(*health.problems, now.reason()))
        if not health.ok:
            log.error("%s failed its health check: %s", seat.world.host, "; ".join(health.problems))
        return health

    def audit(self) -> LeftoverAudit:
        # The pids are known: no marker needed to tell the job's own from another's.
        return node_audit(self.seat.world.host, None, self.seat.environ)

    def _keep(self) -> tuple[int, ...]:
        warm = self.tools.warm
        return tuple(warm.pids()) if warm is not None else ()

    def _decide(self, lost: Callable[[], Mapping[int, str]], health: Health | None) -> Lineup:
        """Node 0: who is out and why, who takes whose place, a new plan for a smaller world.
        `health`: node 0's own report, taken from its hand."""
        seat, roster, scope, attempt = self.seat, self.roster, self.scope, self.attempt
        plan, o = self.prepared.plan, self.prepared.plan.options
        own = (scope.index, health) if health is not None else None
        reports = gather(scope, roster.members(), lambda: lost().keys(), o.health_timeout, own=own)
        failure = round_failure(scope)
        if failure is not None:  # an agent stopped mid-round
            return Lineup(0, roster, end=LineupEnd(int(ExitCode.RANK_FAILED), failure))
        hosts = seat.hosts()
        foreign = foreign_excludes(o.exclude, hosts) if attempt == 0 else None
        if foreign:
            log.warning("%s", foreign)
        waited = o.health_timeout + REPORT_SLACK
        out = exclusions(roster, reports, lost(), excluded_hosts(o.exclude), hosts, attempt, waited)
        for exclusion in out:
            log.error("excluding %s from the job: %s", exclusion.host, exclusion.why)
        try:
            new = roster.without(out, o.min_nodes)
        except Shortfall as exc:
            ended = Roster(roster.nodes, roster.spares, roster.excluded + tuple(out))
            first = out[0] if out else None
            cause = _cause(exc.message, roster, first.agent if first else 0, hosts)
            return Lineup(0, ended, end=LineupEnd(int(exc.code), cause))
        replan = self.tools.replan
        replanned = None
        if seat.world.task is None and len(new.nodes) != plan.nnodes and replan is not None:
            try:
                replanned = replan(len(new.nodes))
            except AgentError as exc:
                why = (
                    f"the world shrank to {len(new.nodes)} node(s) and the configs no longer "
                    f"fit: {exc.message}"
                )
                end = LineupEnd(int(exc.code), _cause(why, roster, 0, hosts))
                return Lineup(0, new, end=end)
        ranks = seat.serve_workers()
        return Lineup(ranks.port, new, replanned, agent_store=ranks.agent_store)


def _cause(how: str, roster: Roster, agent: int, hosts: list[str]) -> Failure:
    rank = roster.nodes.index(agent) if agent in roster.nodes else None
    host = hosts[agent] if agent < len(hosts) else f"agent {agent}"
    return Failure(Kind.EXCLUDED, how, rank, host, time.time(), agent=agent)
