"""The roster and the lineup's pure parts: who runs which node rank, who waits, who is out."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from agent.errors import AgentError, ExitCode
from agent.node.failure import Failure, Kind
from agent.node.ranks_store import RanksStore
from agent.plan.options import Options
from agent.plan.roster import (
    Exclusion,
    Roster,
    Shortfall,
    active_world,
    excluded_hosts,
    seated,
)
from agent.run.health import Health
from agent.run.lineup import Lineup, LineupEnd, exclusions, seating
from agent.world import Task, World

HOSTS = [f"n{i}" for i in range(6)]


def out(*agents: int) -> list[Exclusion]:
    return [Exclusion(a, HOSTS[a], "lost", 1) for a in agents]


@pytest.mark.parametrize(
    ("agents", "spares", "nodes", "waiting"),
    [
        (4, 1, (0, 1, 2), (3,)),
        (4, 0, (0, 1, 2, 3), ()),
        (2, 1, (0,), (1,)),
        (6, 3, (0, 1, 2), (3, 4, 5)),
    ],
)
def test_initial_roster_keeps_the_last_agents_as_spares(agents, spares, nodes, waiting):
    roster = Roster.initial(agents, spares)
    assert (roster.nodes, roster.spares) == (nodes, waiting)


def test_spares_must_leave_a_node_to_run_on():
    with pytest.raises(AgentError, match="--spares 4 leaves no node"):
        Roster.initial(4, 4)


@pytest.mark.parametrize(
    ("start", "gone", "min_nodes", "nodes", "spares"),
    [
        # a spare takes the lost node's rank; everyone else keeps theirs
        (Roster((0, 1, 2), (3,)), (1,), 0, (0, 3, 2), ()),
        # spares are used in order
        (Roster((0, 1, 2), (3, 4)), (2, 1), 0, (0, 3, 4), ()),
        # a lost spare is simply gone
        (Roster((0, 1, 2), (3, 4)), (4,), 0, (0, 1, 2), (3,)),
        # no spare: the world shrinks, later nodes move up (ranks stay dense)
        (Roster((0, 1, 2, 3)), (1,), 2, (0, 2, 3), ()),
        # one spare for two lost nodes: the first (by agent) gets it, then shrink
        (Roster((0, 1, 2, 3), (4,)), (2, 1), 3, (0, 4, 3), ()),
        # someone already out is not excluded twice
        (Roster((0, 2), (), (Exclusion(1, "n1", "lost", 1),)), (1,), 0, (0, 2), ()),
    ],
)
def test_without_fills_places_then_shrinks(start, gone, min_nodes, nodes, spares):
    after = start.without(out(*gone), min_nodes)
    assert (after.nodes, after.spares) == (nodes, spares)
    assert len(after.excluded) == len(start.excluded) + len(
        [g for g in gone if g in start.members()]
    )


@pytest.mark.parametrize(
    ("start", "gone", "min_nodes", "message"),
    [
        (Roster((0, 1, 2), (3,)), (0,), 0, "node 0 hosts the job store and cannot be replaced"),
        (
            Roster((0, 1, 2)),
            (1,),
            0,
            "no spare left to take its place (start the job with --spares",
        ),
        (Roster((0, 1, 2)), (1, 2), 2, "1 node(s) left, fewer than --min-nodes 2"),
    ],
)
def test_without_refuses_what_cannot_go_on(start, gone, min_nodes, message):
    with pytest.raises(Shortfall, match=re.escape(message)) as caught:
        start.without(out(*gone), min_nodes)
    assert caught.value.code == ExitCode.RENDEZVOUS


def test_roster_and_lineup_round_trip_through_json():
    roster = Roster((0, 3), (2,), (Exclusion(1, "n1", "failed", 0, ("a", "b")),))
    assert Roster.from_json(roster.to_json()) == roster
    lineup = Lineup(4242, roster, None, LineupEnd(3, Failure(Kind.EXCLUDED, "x")))
    assert Lineup.from_json(lineup.to_json()) == lineup
    alone = Lineup(4242, roster, agent_store=False)  # a one-node job whose rank 0 hosts it
    assert Lineup.from_json(alone.to_json()).ranks_store == RanksStore(4242, False)
    assert [roster.role(a) for a in range(4)] == ["node", "out", "spare", "node"]


@pytest.mark.parametrize(
    ("roster", "spares", "ranks"),
    [
        (Roster((0, 1, 2)), False, {0: 0, 1: 1, 2: 2}),
        # a spare took node 1's place: it has that node rank; the excluded agent has none
        (Roster((0, 3, 2), (4,), (Exclusion(1, "n1", "lost", 1),)), False, {0: 0, 3: 1, 2: 2}),
        (
            Roster((0, 3, 2), (4,), (Exclusion(1, "n1", "lost", 1),)),
            True,
            {0: 0, 3: 1, 2: 2, 4: None},
        ),
        (Roster((0,), (1, 2)), True, {0: 0, 1: None, 2: None}),
        (Roster((0,), (1, 2)), False, {0: 0}),
    ],
)
def test_ranks_by_agent_are_the_positions_in_the_roster(roster, spares, ranks):
    found = roster.ranks_by_agent(spares=spares)
    assert found == ranks
    assert list(found) == list(roster.members() if spares else roster.nodes)


def _world(node: int = 0, nnodes: int = 4, task: Task | None = None) -> World:
    return World(
        "slurm", "7", "0", nnodes, node, tuple(HOSTS[:nnodes]), HOSTS[node], "n0", None, task
    )


@pytest.mark.parametrize(("agent", "rank", "nnodes"), [(0, 0, 3), (3, 1, 3), (2, 2, 3), (1, 0, 3)])
def test_seated_world_is_the_position_in_the_roster(agent, rank, nnodes):
    roster = Roster((0, 3, 2), (), (Exclusion(1, "n1", "lost", 1),))
    placed = seated(_world(agent), roster)
    assert (placed.node_rank, placed.nnodes, placed.host) == (rank, nnodes, HOSTS[agent])


def test_active_world_plans_for_the_agents_less_the_spares():
    assert active_world(_world(), Options(spares=1)).nnodes == 3
    assert active_world(_world(), Options(spares=1), nodes=2).nnodes == 2
    with pytest.raises(AgentError, match="--min-nodes 4 is more than the 3 node"):
        active_world(_world(), Options(spares=1, min_nodes=4))
    task = _world(task=Task(0, 0, 8, 8))
    with pytest.raises(AgentError, match="need one agent per node"):
        active_world(task, Options(spares=1))
    assert active_world(task, Options()) == task


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        (None, set()),
        ("", set()),
        ("gpu[003,017],gpu020", {"gpu003", "gpu017", "gpu020"}),
        ("n1", {"n1"}),
    ],
)
def test_excluded_hosts_are_a_slurm_host_list(text, hosts):
    assert excluded_hosts(text) == hosts


@pytest.mark.parametrize("text", ["n[1-", "n[1-100000000]", "n[3-1]"])
def test_a_bad_exclude_list_is_one_clear_error(text):
    with pytest.raises(AgentError, match="is not a host list"):
        excluded_hosts(text)


def test_exclusions_name_the_lost_the_unhealthy_the_silent_and_the_excluded():
    roster = Roster((0, 1, 2), (3, 4))
    reports = {
        0: Health(),
        1: Health(("--health-check exited with code 1",), ("disk sick",)),
        2: None,
        3: Health(),
    }
    found = exclusions(roster, reports, {4: "lost: gone"}, {"n3"}, HOSTS, 2, 65.0)
    assert [(e.agent, e.why, e.output) for e in found] == [
        (1, "failed its health check: --health-check exited with code 1", ("disk sick",)),
        (2, "sent no health report within 65s", ()),
        (3, "named by --exclude", ()),
        (4, "lost: gone", ()),
    ]
    assert {e.attempt for e in found} == {2}


def test_seating_says_who_ran_which_ranks_who_waited_and_who_was_excluded():
    roster = Roster((0, 3, 2), (4,), (Exclusion(1, "n1", "lost", 1), Exclusion(5, "n5", "x", 0)))
    record = seating(roster, HOSTS, 8, 1, per_task=False)
    assert record["nodes"] == [
        {"node": 0, "agent": 0, "host": "n0", "ranks": [0, 7]},
        {"node": 1, "agent": 3, "host": "n3", "ranks": [8, 15]},
        {"node": 2, "agent": 2, "host": "n2", "ranks": [16, 23]},
    ]
    assert record["spares"] == ["n4"]
    assert [e["host"] for e in record["excluded"]] == ["n1"]  # new in this attempt only
    per_task = seating(replace(roster, spares=()), HOSTS, 1, 0, per_task=True)
    assert [n["ranks"] for n in per_task["nodes"]] == [[0, 0], [3, 3], [2, 2]]
