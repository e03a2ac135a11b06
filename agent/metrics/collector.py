"""A run's state as Prometheus metric families (prometheus_client renders them).

Cardinality is bounded by the nodes: per node rank the seconds since its last progress line and
its host (an info series), per rank a median step time only up to RANK_SERIES ranks; everything
else is a handful of series for the job, and the last KEPT_ATTEMPTS attempts' phase times.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.samples import Sample

from agent.metrics.recorder import RunMetrics
from agent.metrics.state import RunState

PREFIX = "launch_agent_"


def job_families(state: RunState, lost: int) -> Iterator[Metric]:
    """The job's own series: a few dozen whatever its size."""
    info = InfoMetricFamily(PREFIX + "run", "the run these numbers are of", labels=["job", "run"])
    info.add_metric([state.job, str(state.run)], {})
    yield info
    yield GaugeMetricFamily(
        PREFIX + "ranks_running", "ranks of the running attempt still running, on every node (0 between attempts)",
        value=state.ranks_running,
    )  # fmt: skip
    yield CounterMetricFamily(PREFIX + "attempts", "attempts started", value=state.started)
    yield CounterMetricFamily(
        PREFIX + "exit_skew_warnings",
        "times ranks that exited 0 waited --hang-warning for others still running",
        value=state.skew_warnings,
    )
    yield CounterMetricFamily(
        PREFIX + "restarts", "restarts of the whole world", value=state.restarts
    )
    phases = GaugeMetricFamily(
        PREFIX + "attempt_phase_seconds",
        "per attempt (the last few): rendezvous = its roll call and the spawn of node 0's ranks; "
        "first_progress = spawn to the first progress line (to within a second); teardown = its "
        "root cause (a failure, a stop signal) to every node's result; exit_skew = a clean "
        "finish's first rank exit to its last",
        labels=["attempt", "phase"],
    )
    for times in state.attempts:
        for phase, seconds in times.phases():
            phases.add_metric([str(times.attempt), phase], seconds)
    yield phases
    nodes = GaugeMetricFamily(
        PREFIX + "nodes",
        "agents by state: running ranks, spare, excluded (out of the job at the last lineup, "
        "the lost among them), lost (heartbeats stopped, as node 0 sees it now)",
        labels=["state"],
    )
    for name, count in (
        ("running", len(state.hosts)),
        ("spare", state.spares),
        ("excluded", state.excluded),
        ("lost", lost),
    ):
        nodes.add_metric([name], count)
    yield nodes
    yield GaugeMetricFamily(PREFIX + "spares_left", "spares still waiting", value=state.spares)
    if state.exit_code is not None:
        yield GaugeMetricFamily(PREFIX + "exit_code", "the run's exit code", value=state.exit_code)
    if not state.tracks_progress:
        return
    yield GaugeMetricFamily(
        PREFIX + "stragglers",
        "nodes straggling now (as a whole, or one of their ranks)",
        value=len(state.stragglers),
    )
    yield CounterMetricFamily(
        PREFIX + "straggler_episodes", "stragglers named in this run", value=state.episodes
    )
    slow = GaugeMetricFamily(
        PREFIX + "straggler_slowdown",
        "a straggling node's median step time over the job's (its slowest straggler)",
        labels=["node"],
    )
    for s in state.stragglers:
        slow.add_metric([str(s.node)], s.slowdown)
    yield slow
    steps = state.steps
    if steps is None:
        return
    summary = Metric(
        PREFIX + "step_seconds",
        "the ranks' median step times (each over its last 20 steps): quantiles across ranks",
        "summary",
    )
    for q, seconds in steps.quantiles:
        summary.add_sample(PREFIX + "step_seconds", {"quantile": str(q)}, seconds)
    summary.add_sample(PREFIX + "step_seconds_count", {}, steps.count)
    summary.add_sample(PREFIX + "step_seconds_sum", {}, steps.total)
    yield summary
    if steps.ranks:
        per_rank = GaugeMetricFamily(
            PREFIX + "rank_step_seconds",
            "each rank's median step time (only up to 64 ranks)",
            labels=["rank", "node"],
        )
        for r in steps.ranks:
            per_rank.add_metric([str(r.rank), str(r.node)], r.median)
        yield per_rank


def host_families(state: RunState) -> Iterator[Metric]:
    """Per node rank its host: changes only at a lineup (Exposition renders it once per)."""
    hosts = InfoMetricFamily(PREFIX + "node", "the host of each node rank", labels=["node"])
    for node, host in enumerate(state.hosts):
        hosts.add_metric([str(node)], {"host": host})
    yield hosts


def progress_families(
    state: RunState, now: float, labels: Sequence[Mapping[str, str]] = ()
) -> Iterator[Metric]:
    """With --progress-regex, per node rank the seconds since its last progress line (up to the
    attempt's end once it ended; a node that printed none counts from the spawn of the ranks).
    `labels`: {"node": "N"} per node rank, made once (this runs on every scrape)."""
    current = state.current
    if not state.tracks_progress or current is None or current.ranks_started is None:
        return
    until = current.ended if current.ended is not None else now
    since = GaugeMetricFamily(
        PREFIX + "node_seconds_since_progress",
        "seconds since the node's last progress line (node 0 looks every 0.25 s)",
        labels=["node"],
    )
    origin: float = current.ranks_started
    progress, name = state.progress, since.name
    nodes = len(state.hosts)
    last = [p if p is not None else origin for p in progress[:nodes]]
    last += [origin] * (nodes - len(last))  # nodes with no progress yet: since the ranks started
    since.samples = [
        Sample(
            name,
            dict(labels[node]) if node < len(labels) else {"node": str(node)},
            max(0.0, until - last[node]),
        )
        for node in range(nodes)
    ]
    yield since


class Exposition:
    """The text a scrape gets: the job's and the progress series rendered per scrape, the
    hosts' (unchanged between lineups) rendered once per lineup."""

    def __init__(self, metrics: RunMetrics, clock: Callable[[], float] = time.monotonic) -> None:
        self.metrics, self.clock = metrics, clock
        self._hosts: tuple[str, ...] | None = None
        self._hosts_text = b""
        self._labels: list[dict[str, str]] = []

    def collect(self) -> Iterator[Metric]:
        """Every family (the textfile at the end)."""
        state = self.metrics.state
        yield from job_families(state, len(self.metrics.lost()))
        yield from host_families(state)
        yield from progress_families(state, self.clock())

    def render(self) -> bytes:
        state = self.metrics.state
        if state.hosts is not self._hosts:
            self._hosts_text = generate_latest(_Families(lambda: host_families(state)))
            self._hosts = state.hosts
            self._labels = [{"node": str(n)} for n in range(len(state.hosts))]
        lost, now, labels = len(self.metrics.lost()), self.clock(), self._labels

        def live() -> Iterator[Metric]:
            yield from job_families(state, lost)
            yield from progress_families(state, now, labels)

        return generate_latest(_Families(live)) + self._hosts_text


class _Families:
    """A collector of given families (generate_latest takes any object with collect())."""

    def __init__(self, families: Callable[[], Iterable[Metric]]) -> None:
        self.collect = families
