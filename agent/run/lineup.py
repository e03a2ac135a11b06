"""Before every attempt: every node checks its health, node 0 decides who runs, everyone acts.

In the scope `r<run>/l<attempt>` each member (nodes and spares) posts `health/<index>`; the last
report (or a failure there: a peer lost mid-round) wakes node 0, which excludes the lost, the
unhealthy and the hosts named by --exclude, lets spares take their node ranks (or shrinks the
world, re-planned) and publishes `lineup`: the port, the roster, a new plan if the world
changed shape, or why the job cannot go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.errors import AgentError, ExitCode
from agent.node.events import StoreLost, drained
from agent.node.failure import Failure, Kind
from agent.node.ranks_store import RanksStore
from agent.node.scope import Scope
from agent.node.sealed import Tampered
from agent.plan.roster import Exclusion, Roster
from agent.plan.run_plan import RunPlan
from agent.run.health import Health

REPORT_SLACK = 5.0  # seconds node 0 waits for health reports beyond --health-timeout


@dataclass(frozen=True)
class LineupEnd:
    """The job cannot go on (too few nodes, node 0 unhealthy, a stop mid-round): its exit code
    and why (None: a lineup that gave no reason)."""

    code: int
    cause: Failure | None

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "cause": self.cause.to_json() if self.cause else None}

    @staticmethod
    def from_json(data: Any) -> LineupEnd | None:
        """None when there is no end; a code that is no int is a rank failure's (exit 1)."""
        if not isinstance(data, Mapping):
            return None
        code = data.get("code")
        if not isinstance(code, int) or isinstance(code, bool):
            code = int(ExitCode.RANK_FAILED)
        return LineupEnd(code, Failure.from_json(data.get("cause")))


@dataclass(frozen=True)
class Lineup:
    port: int
    roster: Roster
    plan: RunPlan | None = None  # node 0 planned again: the world changed shape
    end: LineupEnd | None = None  # the job cannot go on
    agent_store: bool = True  # the ranks join node 0's store at `port` (RanksStore)

    @property
    def ranks_store(self) -> RanksStore:
        return RanksStore(self.port, self.agent_store)

    def to_json(self) -> dict[str, Any]:
        return {
            "port": self.port,
            "roster": self.roster.to_json(),
            "plan": self.plan.to_json() if self.plan else None,
            "end": self.end.to_json() if self.end else None,
            "agent_store": self.agent_store,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Lineup:
        plan = data.get("plan")
        return cls(
            int(data["port"]),
            Roster.from_json(data["roster"]),
            RunPlan.from_json(plan) if plan else None,
            LineupEnd.from_json(data.get("end")),
            data.get("agent_store") is not False,
        )


def post_health(scope: Scope, health: Health, members: int) -> None:
    scope.put(f"health/{scope.index}", health.to_json())
    if scope.store.add(scope.key("reported")) == members:
        scope.store.set_bytes(scope.key("health-done"), b"")


def gather(
    scope: Scope,
    members: Sequence[int],
    lost: Callable[[], Collection[int]],
    timeout: float,
    slack: float = REPORT_SLACK,
    own: tuple[int, Health] | None = None,
) -> dict[int, Health | None]:
    """Node 0: each member's report; None for one that sent none in time (or is lost), waited
    for `timeout` (the members' --health-timeout) plus `slack`. `own`: node 0's index and its
    report, taken from its hand (its copy in the store, garbled, would be waited for in vain:
    the soak's restart seed 8057)."""
    deadline = time.monotonic() + timeout + slack
    gone = set(lost()) & set(members)
    if gone and scope.store.add(scope.key("reported"), len(gone)) == len(members):
        scope.store.set_bytes(scope.key("health-done"), b"")  # they never report: counted in
    mine = {own[0]: own[1]} if own is not None and own[0] in members else {}
    reports = _others(scope, members, gone | set(mine), lost, deadline)
    return {**reports, **mine}


def _others(
    scope: Scope,
    members: Sequence[int],
    gone: set[int],
    lost: Callable[[], Collection[int]],
    deadline: float,
) -> dict[int, Health | None]:
    """The reports of `members` not `gone` (None for those: lost, or none in time)."""
    expect = [i for i in members if i not in gone]
    done = _reported(scope, [scope.key("health", i) for i in expect], deadline)
    names = [f"health/{i}" for i in expect]
    # The usual case: one round trip for every report. The counter only wakes: the reports
    # themselves must be there (an outsider's bump of the count would leave us waiting).
    if done and scope.failure() is None and scope.store.exists_all([scope.key(n) for n in names]):
        found = _sealed(scope, names, deadline)
        if found is not None:
            return {
                **dict.fromkeys(gone),
                **dict(zip(expect, map(Health.from_json, found), strict=True)),
            }
    # Woken by a failure (a peer lost or stopped mid-round) or late: wait for the rest alone,
    # a second at a time, so that a member lost meanwhile is not waited for, and a failure that
    # ends the round ends the wait (its reports no longer matter).
    while True:
        gone |= set(lost())
        expect = [i for i in expect if i not in gone]
        waiting = [scope.key("health", i) for i in expect]
        left = deadline - time.monotonic()
        if scope.store.wait(waiting, min(1.0, max(left, 0.001))):
            found = _sealed(scope, [f"health/{i}" for i in expect], deadline)
            if found is None:  # a report that does not open: read each one alone, below
                break
            return {
                **dict.fromkeys(gone),
                **dict(zip(expect, map(Health.from_json, found), strict=True)),
            }
        if left <= 1.0 or round_failure(scope) is not None:
            break
    reports: dict[int, Health | None] = {}
    for i in members:
        record = None if i in gone else scope.get_if(f"health/{i}", "health report")
        reports[i] = None if record is None else Health.from_json(record)
    return reports


def _reported(scope: Scope, keys: list[str], deadline: float) -> bool:
    """Whether every report (or a failure) came before the deadline: woken by `health-done`,
    which the last reporter sets on its count, or, since an outsider may delete, reset or bump
    that counter, by a look at the reports themselves (after 1 s, then less often)."""
    pause = 1.0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if scope.store.wait([scope.key("health-done")], min(pause, left)):
            return True
        if scope.failure() is not None or scope.store.exists_all(keys):
            return True
        pause = min(pause * 2, 8.0)


def _sealed(scope: Scope, names: list[str], deadline: float) -> list[dict[str, Any]] | None:
    """Every report, waiting past forgeries until the round's deadline (None: one never came
    sealed; the member is then treated as having sent none)."""
    try:
        return scope.get_all(names, "health report", max(deadline - time.monotonic(), 0.001))
    except Tampered:
        return None


def exclusions(
    roster: Roster,
    reports: Mapping[int, Health | None],
    lost: Mapping[int, str],
    excluded_hosts: Collection[str],
    hosts: Sequence[str],
    attempt: int,
    waited: float,
) -> list[Exclusion]:
    """Pure: who leaves the job before this attempt, and why."""
    out = []
    for agent in roster.members():
        host = hosts[agent] if agent < len(hosts) else f"agent {agent}"
        health = reports.get(agent)
        if agent in lost:
            out.append(Exclusion(agent, host, lost[agent], attempt))
        elif host in excluded_hosts:
            out.append(Exclusion(agent, host, "named by --exclude", attempt))
        elif health is None:
            why = f"sent no health report within {waited:g}s"
            out.append(Exclusion(agent, host, why, attempt))
        elif not health.ok:
            why = "failed its health check: " + "; ".join(health.problems)
            out.append(Exclusion(agent, host, why, attempt, health.output))
    return out


def seating(
    roster: Roster, hosts: Sequence[str], nproc: int, attempt: int, per_task: bool
) -> dict[str, Any]:
    """Pure: one attempt in ranks.json and summary.json — who ran which ranks, who waited,
    who was excluded before it and why."""
    new = [e.to_json() for e in roster.excluded if e.attempt == attempt]

    def host(agent: int) -> str:
        return hosts[agent] if agent < len(hosts) else f"agent {agent}"

    nodes = [
        {
            "node": position,
            "agent": agent,
            "host": host(agent),
            "ranks": [agent, agent] if per_task else [position * nproc, (position + 1) * nproc - 1],
        }
        for position, agent in enumerate(roster.nodes)
    ]
    return {
        "attempt": attempt,
        "nodes": nodes,
        "spares": [host(a) for a in roster.spares],
        "excluded": new,
    }


def round_failure(scope: Scope) -> Failure | None:
    """The failure that ends a roll call: the latest one, unless it is a member node 0 declared
    lost (a spare can take its place) — then that member's own record if it left one first (a
    stop signal: the operator meant the whole job, as in an attempt)."""
    failure = scope.failure()
    if failure is None or failure.kind is not Kind.LOST:
        return failure
    own = scope.failure_of(failure.agent)
    return own if own is not None and own.kind is not Kind.LOST else None


def check_wait(
    scope: Scope, events: Any, fatal: Callable[[Scope], Failure | None]
) -> Failure | None:
    """One look while waiting in `scope`: raises when node 0 vanished (the heartbeat's StoreLost
    event); the failure that ends the wait, if there is one."""
    for event in drained(events):
        if isinstance(event, StoreLost):
            raise AgentError(f"{event.why}: node 0's agent is gone", ExitCode.RENDEZVOUS)
    return fatal(scope)
