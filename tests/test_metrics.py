"""Node 0's run metrics (agent/metrics): the numbers (pure), their families and cardinality,
the pace look feeding them, the /metrics server's life and metrics.prom."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.console.stream import JobPace, StepClock
from agent.metrics.collector import Exposition
from agent.metrics.recorder import RunMetrics
from agent.metrics.server import MetricsServer, job_address, open_server, write_textfile
from agent.metrics.state import (
    KEPT_ATTEMPTS,
    RANK_SERIES,
    AttemptTimes,
    RankStep,
    StepTimes,
    Straggling,
)
from agent.plan.roster import Exclusion, Roster
from agent.world import World


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def samples(text: str) -> dict[str, dict[tuple, float]]:
    found: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return found


# (case, medians, quantiles (q → seconds), per-rank series)
STEP_CASES = [
    ("none", [], {}, 0),
    ("one rank", [0.3], {0.5: 0.3, 0.9: 0.3, 0.99: 0.3}, 1),
    ("ten ranks, nearest rank", [0.1 * (i + 1) for i in range(10)], {0.5: 0.5, 0.9: 0.9, 0.99: 1.0}, 10),
    ("over 64 ranks: no per-rank series", [0.2] * (RANK_SERIES + 1), {0.5: 0.2, 0.9: 0.2, 0.99: 0.2}, 0),
]  # fmt: skip


@pytest.mark.parametrize(("case", "medians", "quantiles", "per_rank"), STEP_CASES)
def test_step_times(case, medians, quantiles, per_rank):
    ranks = [RankStep(r, r // 8, m) for r, m in enumerate(medians)] if per_rank else []
    times = StepTimes.of(medians, ranks)
    assert {q: pytest.approx(v) for q, v in times.quantiles} == quantiles
    assert times.count == len(medians) and times.total == pytest.approx(sum(medians))
    assert len(times.ranks) == per_rank


@pytest.mark.parametrize(
    ("times", "phases"),
    [
        (AttemptTimes(0, 10.0), {}),
        (AttemptTimes(0, 10.0, 12.5), {"rendezvous": 2.5}),
        (AttemptTimes(0, 10.0, 12.5, 14.0, 20.0, 21.0), {"rendezvous": 2.5, "first_progress": 1.5, "teardown": 1.0}),
        (AttemptTimes(0, 10.0, 12.5, None, 20.0, 19.0), {"rendezvous": 2.5, "teardown": 0.0}),
        (AttemptTimes(0, 10.0, 12.5, None, None, 30.0, 14.0, 29.5), {"rendezvous": 2.5, "exit_skew": 15.5}),
    ],
)  # fmt: skip
def test_attempt_phases(times, phases):
    assert dict(times.phases()) == pytest.approx(phases)


@pytest.mark.parametrize(
    ("cause", "exits", "phases"),
    [
        (None, [5000.0, 5004.0, 5007.5], {"exit_skew": 7.5}),  # a clean finish: no teardown
        (5006.0, [5000.0, 5007.5], {"teardown": 2.0}),  # from the root cause, not a rank's exit
        (None, [], {}),
    ],
)  # fmt: skip
def test_a_teardown_runs_from_the_root_cause_and_a_clean_finish_has_an_exit_skew(
    cause, exits, phases
):
    clock = Clock()
    metrics = RunMetrics("j", 0, clock=clock, wall=lambda: clock.now + 4000.0)
    metrics.attempt_started(0)
    clock.now += 8.0  # the verdict: every result in at wall 5008
    metrics.attempt_ended(0, cause, exits)
    got = {k: v for k, v in metrics.state.attempts[0].phases() if k != "rendezvous"}
    assert got == pytest.approx(phases)


def _run(clock: Clock, nodes: int = 2, per_node: int = 2, lost=()) -> RunMetrics:
    """A run of two attempts: the first failed, the second is running, both nodes stepping."""
    metrics = RunMetrics("job7", 3, tracks_progress=True, lost=lambda: lost, exported=True,
                         clock=clock, wall=lambda: clock.now + 5000.0)  # fmt: skip
    hosts = [f"n{i}" for i in range(nodes + 1)]
    metrics.attempt_started(0)
    metrics.lined_up(Roster(tuple(range(nodes)), (nodes,)), hosts)
    clock.now += 2.0
    metrics.ranks_started(0, nodes * per_node)
    clock.now += 3.0
    metrics.attempt_ended(0, clock.now + 5000.0 - 1.0, [clock.now + 5000.0 - 0.5])  # failed 1 s ago
    metrics.attempt_started(1)
    clock.now += 1.0
    metrics.lined_up(Roster(tuple(range(nodes)), (), (Exclusion(nodes, "x", "lost", 1),)), hosts)
    metrics.ranks_started(1, nodes * per_node)
    clock.now += 4.0
    steps = [
        RankStep(r, r // per_node, 0.2 if r // per_node else 0.1) for r in range(nodes * per_node)
    ]
    progress = [clock.now - 0.5] + [None] * (nodes - 1)
    medians = [s.median for s in steps]
    per_rank = steps if len(steps) <= RANK_SERIES else []  # as the pace look passes them
    metrics.paced(1, progress, medians, per_rank, [Straggling(1, 2.0)], 1)
    clock.now += 1.0
    return metrics


def test_the_run_as_prometheus_sees_it():
    clock = Clock()
    metrics = _run(clock, lost={9})
    got = samples(Exposition(metrics, clock).render().decode())
    assert got["launch_agent_run_info"] == {(("job", "job7"), ("run", "3")): 1}
    assert (
        got["launch_agent_attempts_total"][()] == 2 and got["launch_agent_restarts_total"][()] == 1
    )
    assert got["launch_agent_ranks_running"][()] == 4
    phases = got["launch_agent_attempt_phase_seconds"]
    assert phases == pytest.approx({
        (("attempt", "0"), ("phase", "rendezvous")): 2.0,
        (("attempt", "0"), ("phase", "teardown")): 1.0,
        (("attempt", "1"), ("phase", "rendezvous")): 1.0,
        (("attempt", "1"), ("phase", "first_progress")): 3.5,
    })  # fmt: skip
    assert got["launch_agent_nodes"] == {
        (("state", "running"),): 2, (("state", "spare"),): 0,
        (("state", "excluded"),): 1, (("state", "lost"),): 1,
    }  # fmt: skip
    assert got["launch_agent_spares_left"][()] == 0
    # node 0 stepped 1.5 s ago; node 1 never did: counted from its ranks' start, 5 s ago
    assert got["launch_agent_node_seconds_since_progress"] == pytest.approx(
        {(("node", "0"),): 1.5, (("node", "1"),): 5.0}
    )
    assert got["launch_agent_node_info"] == {
        (("host", "n0"), ("node", "0")): 1,
        (("host", "n1"), ("node", "1")): 1,
    }
    assert got["launch_agent_step_seconds"][(("quantile", "0.5"),)] == pytest.approx(0.1)
    assert got["launch_agent_step_seconds"][(("quantile", "0.99"),)] == pytest.approx(0.2)
    assert got["launch_agent_step_seconds_count"][()] == 4
    assert got["launch_agent_stragglers"][()] == 1
    assert got["launch_agent_straggler_slowdown"] == {(("node", "1"),): 2.0}
    assert len(got["launch_agent_rank_step_seconds"]) == 4
    assert "launch_agent_exit_code" not in got  # still running
    metrics.attempt_ended(1, None, [])
    metrics.finished(0)
    clock.now += 100.0  # after the end, ages stay those at the attempt's end
    got = samples(Exposition(metrics, clock).render().decode())
    assert got["launch_agent_exit_code"][()] == 0 and got["launch_agent_ranks_running"][()] == 0
    assert got["launch_agent_node_seconds_since_progress"][(("node", "0"),)] == pytest.approx(1.5)


def test_cardinality_is_bounded_by_the_nodes_at_1024_nodes():
    clock = Clock()
    metrics = _run(clock, nodes=1024, per_node=8)
    for _ in range(KEPT_ATTEMPTS + 3):  # many restarts: only the last attempts' phases stay
        metrics.attempt_started(metrics.state.started)
    metrics.ranks_started(metrics.state.started - 1, 8192)
    families = list(text_string_to_metric_families(Exposition(metrics, clock).render().decode()))
    series = sum(len(f.samples) for f in families)
    assert series <= 2 * 1024 + 60  # hosts and progress per node; the job's few dozen
    assert not any("rank" in s.labels for f in families for s in f.samples)  # 8,192 ranks
    attempts = {s.labels["attempt"] for f in families for s in f.samples if "attempt" in s.labels}
    assert len(attempts) <= KEPT_ATTEMPTS


def test_without_progress_regex_only_the_job_series():
    metrics = RunMetrics("j", 0, tracks_progress=False, exported=True)
    metrics.attempt_started(0)
    metrics.lined_up(Roster((0,)), ["h"])
    metrics.ranks_started(0, 1)
    got = samples(Exposition(metrics).render().decode())
    assert got["launch_agent_ranks_running"][()] == 1
    assert not {"launch_agent_stragglers", "launch_agent_node_seconds_since_progress"} & set(got)


def test_pace_watch_feeds_the_recorder_and_the_live_table():
    from agent.node.local_store import LocalStore
    from agent.node.scope import Scope
    from agent.node.store import Endpoint, Store
    from agent.node.trust import JobKeys
    from agent.run.pace import PaceJudge, PaceWatch

    store = Store(LocalStore(), Endpoint("127.0.0.1", 1), "t/")
    keys = JobKeys.derive(b"metrics-test", "job", "0")
    clock = Clock()
    metrics = RunMetrics("job", 0, tracks_progress=True, exported=True, clock=clock)
    metrics.attempt_started(0)
    metrics.lined_up(Roster((0, 1)), ["h0", "h1"])
    metrics.ranks_started(0, 4)
    looks: list[JobPace] = []
    clocks = [{0: StepClock(), 1: StepClock()}, {2: StepClock(), 3: StepClock()}]
    watches = [
        PaceWatch(Scope(store, "r0/a0", node, keys), lambda node=node: clocks[node],
                  agent=node, node_rank=node, host=f"h{node}")
        for node in (0, 1)
    ]  # fmt: skip
    judge = PaceJudge(Scope(store, "r0/a0", 0, keys), agents=[0, 1], factor=1.5, attempt=0,
                      metrics=metrics, on_look=looks.append)  # fmt: skip
    for node, seconds in ((0, 0.2), (1, 0.4)):
        for c in clocks[node].values():
            for n in range(6):
                c.tick(n, 990.0 + n * seconds)  # node 0's last line at 991.0, node 1's at 992.0
    watches[1].tick(1000.0)
    watches[0].tick(1000.0)
    judge.tick(1000.0)
    state = metrics.state
    assert state.progress == pytest.approx((991.0, 992.0))  # now less each record's age
    assert state.steps is not None and state.steps.count == 4
    assert [(s.node, round(s.slowdown, 3)) for s in state.stragglers] == [(1, 2.0)]
    assert state.episodes == 1 and state.current.first_progress == pytest.approx(991.0)
    assert looks[-1] == JobPace(pytest.approx(0.2), 5, frozenset({1}), frozenset())
    watches[1].tick(1001.0)  # nothing new from node 1: its last progress stays
    watches[0].tick(1001.0)
    judge.tick(1001.0)
    assert metrics.state.progress[1] == pytest.approx(992.0)


def test_the_server_serves_then_frees_its_port(tmp_path):
    server = MetricsServer(lambda: b"launch_agent_up 1\n", "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.port}"
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as reply:
            assert reply.read() == b"launch_agent_up 1\n"
            assert "version=0.0.4" in reply.headers["Content-Type"]
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(url + "/other", timeout=10)
        assert missing.value.code == 404
    finally:
        server.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=5).close()
    MetricsServer(lambda: b"", "127.0.0.1", server.port).close()  # the port binds again


def test_a_busy_port_is_one_warning_and_metrics_prom_is_still_written(tmp_path, caplog):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    world = World("local", "j", "0", 1, 0, ("h",), "h", "127.0.0.1", None)
    try:
        assert open_server(lambda: b"", None, busy.getsockname()[1], world) is None
    finally:
        busy.close()
    (line,) = [r.getMessage() for r in caplog.records]
    assert "cannot listen on 127.0.0.1 port" in line and "metrics.prom is still written" in line
    metrics = RunMetrics("j", 0, exported=True)
    metrics.finished(2)
    write_textfile(Exposition(metrics), str(tmp_path))
    assert samples((tmp_path / "metrics.prom").read_text())["launch_agent_exit_code"][()] == 2


@pytest.mark.parametrize(
    ("master", "bound"),
    [("127.0.0.1", "127.0.0.1"), ("127.0.0.2", "127.0.0.2"), ("localhost", "0.0.0.0")],
)
def test_job_address(master, bound):
    """The job's own address; a name that resolves to loopback (Debian's 127.0.1.1 for the
    host name) is not what the other nodes reach: every interface instead."""
    assert job_address(master) == bound


def test_an_address_not_ours_falls_back_to_every_interface(caplog):
    # TEST-NET-1: no host's own address, so binding it fails with EADDRNOTAVAIL
    world = World("local", "j", "0", 1, 0, ("h",), "h", "192.0.2.1", None)
    server = open_server(lambda: b"", None, 0, world)
    assert server is not None
    try:
        assert server.addr == "0.0.0.0"
    finally:
        server.close()


def test_a_failing_render_is_one_line_and_the_server_goes_on(caplog):
    answers = iter([RuntimeError("bug"), b"launch_agent_up 1\n"])

    def render() -> bytes:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    server = MetricsServer(render, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.port}/metrics"
    try:
        with pytest.raises(OSError):  # the connection closes without a reply
            urllib.request.urlopen(url, timeout=10).read()
        with urllib.request.urlopen(url, timeout=10) as reply:
            assert reply.read() == b"launch_agent_up 1\n"
    finally:
        server.close()
    assert any(
        "a scrape from" in r.getMessage() and "bug" in r.getMessage() for r in caplog.records
    )


def test_close_never_raises_and_runs_every_closer(caplog):
    metrics, closed = RunMetrics(), []
    metrics.on_close(lambda: closed.append("server"))
    metrics.on_close(lambda: 1 / 0)  # the textfile, say
    metrics.close()
    assert closed == ["server"] and "metrics: division by zero" in caplog.text
