"""Which agent runs which node rank in an attempt, which wait as spares, which are out (pure).

Position in `nodes` is the node rank, so ranks stay dense: a spare that takes an excluded node's
place takes its node rank (every other node keeps its ranks); with no spare left and a minimum
node count, the world shrinks and the nodes after the gap move up. Node 0 hosts the job store,
so it can never be replaced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from agent.errors import AgentError, ExitCode
from agent.world import World


@dataclass(frozen=True)
class Exclusion:
    """An agent out of the job for good, and why (lost, unhealthy, named by --exclude)."""

    agent: int
    host: str
    why: str
    attempt: int
    output: tuple[str, ...] = ()  # a failed --health-check's last lines

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "output": list(self.output)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Exclusion:
        return cls(
            int(data["agent"]),
            str(data["host"]),
            str(data["why"]),
            int(data["attempt"]),
            tuple(str(line) for line in data.get("output") or ()),
        )


class Shortfall(AgentError):
    """Too few nodes left to go on: the job ends, naming who was lost and why."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ExitCode.RENDEZVOUS)


@dataclass(frozen=True)
class Roster:
    nodes: tuple[int, ...]  # agent index per node rank
    spares: tuple[int, ...] = ()
    excluded: tuple[Exclusion, ...] = ()

    @classmethod
    def initial(cls, agents: int, spares: int) -> Roster:
        """The last `spares` agents wait; the others run node ranks 0.. in agent order."""
        if spares >= agents:
            raise AgentError(
                f"--spares {spares} leaves no node to run ranks on ({agents} agent(s) in the "
                "job); ask for more nodes or fewer spares"
            )
        return cls(tuple(range(agents - spares)), tuple(range(agents - spares, agents)))

    def members(self) -> tuple[int, ...]:
        return self.nodes + self.spares

    def ranks_by_agent(self, spares: bool = False) -> dict[int, int | None]:
        """Each node's agent → its node rank, and with `spares` each spare → None: who a lost
        member was, for node 0's records. One pass: a rank looked up by position for each
        agent cost node 0 N² comparisons a lineup (4,096 agents: 0.3 s on its critical path)."""
        ranks: dict[int, int | None] = {agent: rank for rank, agent in enumerate(self.nodes)}
        if spares:
            ranks.update(dict.fromkeys(self.spares))
        return ranks

    def role(self, agent: int) -> str:
        """'node', 'spare' or 'out'."""
        return "node" if agent in self.nodes else "spare" if agent in self.spares else "out"

    def without(self, out: Sequence[Exclusion], min_nodes: int) -> Roster:
        """This roster with `out` excluded: spares fill their node ranks in order, then (with
        `min_nodes`) the world shrinks; Shortfall when neither can keep the job going."""
        nodes: list[int | None] = list(self.nodes)
        spares = list(self.spares)
        gone: list[Exclusion] = []
        for exclusion in sorted(out, key=lambda e: e.agent):
            agent = exclusion.agent
            if agent not in nodes and agent not in spares:
                continue  # out already
            gone.append(exclusion)
            if agent in spares:
                spares.remove(agent)
                continue
            position = nodes.index(agent)
            if position == 0:
                raise Shortfall(
                    f"{exclusion.host} (node 0) {exclusion.why}; node 0 hosts the job store and "
                    "cannot be replaced: the job ends"
                )
            nodes[position] = spares.pop(0) if spares else None
        left = tuple(agent for agent in nodes if agent is not None)
        if len(left) < len(self.nodes) and (min_nodes == 0 or len(left) < min_nodes):
            named = "; ".join(f"{e.host} {e.why}" for e in gone if e.agent in self.nodes)
            floor = (
                f"{len(left)} node(s) left, fewer than --min-nodes {min_nodes}"
                if min_nodes
                else "start the job with --spares K, or let it shrink with --min-nodes M"
            )
            raise Shortfall(f"{named}; no spare left to take its place ({floor})")
        return Roster(left, tuple(spares), self.excluded + tuple(gone))

    def to_json(self) -> dict[str, Any]:
        return {
            "nodes": list(self.nodes),
            "spares": list(self.spares),
            "excluded": [e.to_json() for e in self.excluded],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Roster:
        return cls(  # map, not a generator: every agent reads N of them from each lineup
            tuple(map(int, data["nodes"])),
            tuple(map(int, data["spares"])),
            tuple(Exclusion.from_json(e) for e in data["excluded"]),
        )


def seated(world: World, roster: Roster) -> World:
    """The world as one attempt's ranks see it: this agent's node rank is its position in the
    roster, the node count the roster's. A spare is seated at node 0's place: its world only
    checks what it would run. (Its agent_index changes too: keep the agent's own World for the
    store.)"""
    if world.task is not None:
        return world
    me = world.agent_index
    position = roster.nodes.index(me) if me in roster.nodes else 0
    return replace(world, nnodes=len(roster.nodes), node_rank=position)


def active_world(world: World, options: Any, nodes: int | None = None) -> World:
    """The world node 0 plans for: the agents less the spares (or `nodes`, once shrunk)."""
    excluded_hosts(options.exclude)  # a bad host list is refused before anything starts
    if world.task is not None:
        if options.spares or options.min_nodes:
            raise AgentError(
                f"--spares/--min-nodes need one agent per node; the {world.source} world runs one "
                "agent per rank: start one agent per node (srun --ntasks-per-node=1)"
            )
        return world
    running = len(Roster.initial(world.agents, options.spares).nodes)
    if options.min_nodes > running:
        raise AgentError(
            f"--min-nodes {options.min_nodes} is more than the {running} node(s) the job runs "
            "on; lower it (or use fewer --spares)"
        )
    return replace(world, nnodes=running if nodes is None else nodes)


def excluded_hosts(text: str | None) -> frozenset[str]:
    """--exclude's host list ('gpu[003,017],gpu020') as names; a malformed one is refused."""
    if not text or not text.strip():
        return frozenset()
    import hostlist

    try:
        return frozenset(hostlist.expand_hostlist(text.strip()))
    except (hostlist.BadHostlist, ValueError) as exc:
        raise AgentError(
            f"--exclude {text[:200]!r} is not a host list ({exc}); write it as Slurm does, "
            "e.g. 'gpu[003,017],gpu020'"
        ) from None


def foreign_excludes(text: str | None, hosts: Sequence[str]) -> str | None:
    """The warning when --exclude names hosts that are not the job's (the job still runs on the
    others), naming the job's hosts; None when every name is one of them (or hosts are unknown)."""
    named = excluded_hosts(text)
    unknown = sorted(named - set(hosts))
    if not hosts or not unknown:
        return None
    import hostlist

    own = hostlist.collect_hostlist(list(dict.fromkeys(hosts)))
    given = repr((text or "").strip()[:200])
    if len(unknown) == len(named):
        return f"--exclude {given} names no host of this job (its hosts: {own}); excluding none"
    return (
        f"--exclude {given}: {hostlist.collect_hostlist(unknown)} not among this job's hosts "
        f"({own}); excluding only the others"
    )
