"""The supervisor of one node's attempt, driven by fake events and fake processes (no children)."""

from __future__ import annotations

import queue
import signal
import threading
import time

from agent.node.events import AbortSeen, StoreLost
from agent.node.failure import Failure, Kind
from agent.node.signals import Signalled
from agent.node.stage import Stage
from agent.plan.ranks import Placement, RankSpec
from agent.run.supervisor import Supervisor
from agent.run.workers import RankExited, Worker


class FakeStream:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.done.set()
        self.tail = [b"last words\n"]
        self.last_output = float("inf")  # never silent: no hang warnings
        self.last_progress = float("inf")


class FakeProc:
    def __init__(self, pid: int) -> None:
        self.pid = pid


class FakeProcesses:
    """Records every signal; ranks react as real ones would (die by it, unless they ignore it)."""

    def __init__(self, events: queue.SimpleQueue, ignores_term: set[int] = frozenset()) -> None:
        self.events = events
        self.ignores_term = ignores_term
        self.sent: list[tuple[int, int]] = []  # (rank, signal)

    def signal_all(self, workers, signum: int) -> None:
        for index, worker in enumerate(workers):
            if worker.returncode is not None:
                continue
            self.sent.append((worker.spec.rank, signum))
            if signum in (signal.SIGUSR1, signal.SIGUSR2):
                continue
            if signum == signal.SIGKILL or worker.spec.rank not in self.ignores_term:
                self.events.put(RankExited(index, -signum, 1.0))

    def descendants(self, workers):
        return []

    def kill(self, processes) -> None:
        pass


def _spec(rank: int) -> RankSpec:
    return RankSpec(
        rank=rank,
        local_rank=rank,
        local_world_size=3,
        node_rank=0,
        host="n0",
        placement=Placement(),
        argv=("train.py",),
        env={},
        out_path="/nonexistent/out",
        err_path="/nonexistent/err",
        error_file="/nonexistent/error.json",
    )


def _supervisor(events, processes, reports, grace=5.0, attempt=0, slurm_signals_ranks=False, run=0):
    specs = [_spec(r) for r in range(3)]

    def report(record):
        reports.append(record.to_json())  # as the store holds it
        return record.with_seq(len(reports))

    sup = Supervisor(
        specs,
        stage=Stage(run, attempt),
        events=events,
        report=report,
        grace=grace,
        hang_warning=1e9,
        processes=processes,
        slurm_signals_ranks=slurm_signals_ranks,
    )
    workers = [Worker(s, FakeProc(1000 + s.rank), 0.0, FakeStream(), FakeStream()) for s in specs]
    return sup, (lambda: workers)


def _states(outcome) -> dict[int, str]:
    return {e.rank: e.state for e in outcome.exits}


def test_a_failing_rank_is_reported_once_and_the_others_are_terminated():
    events, reports = queue.SimpleQueue(), []
    procs = FakeProcesses(events)
    sup, start = _supervisor(events, procs, reports)
    events.put(RankExited(1, 3, 1.0))
    outcome = sup.run(start)
    assert [(r["kind"], r["rank"], r["returncode"]) for r in reports] == [("rank", 1, 3)]
    assert reports[0]["stderr_tail"] == ["last words"]
    assert outcome.failure.seq == 1
    assert sorted(procs.sent) == [(0, signal.SIGTERM), (2, signal.SIGTERM)]
    assert _states(outcome) == {0: "terminated", 1: "failed", 2: "terminated"}


def test_an_abort_elsewhere_tears_down_without_reporting():
    events, reports = queue.SimpleQueue(), []
    procs = FakeProcesses(events)
    sup, start = _supervisor(events, procs, reports, attempt=2, run=5)
    events.put(
        AbortSeen(
            Stage(5, 1), Failure.from_json({"kind": "rank", "rank": 9, "host": "x", "how": "stale"})
        )
    )
    events.put(
        AbortSeen(
            Stage(4, 2),
            Failure.from_json({"kind": "rank", "rank": 9, "host": "x", "how": "old run"}),
        )
    )
    events.put(
        AbortSeen(
            Stage(5, 2),
            Failure.from_json({"kind": "rank", "rank": 9, "host": "x", "how": "exit code 1"}),
        )
    )
    outcome = sup.run(start)
    assert reports == [] and outcome.failure is None
    assert sorted(procs.sent) == [(0, signal.SIGTERM), (1, signal.SIGTERM), (2, signal.SIGTERM)]
    assert set(_states(outcome).values()) == {"terminated"}


def test_an_abort_of_the_previous_runs_attempt_is_not_this_ones():
    """Every run's first attempt is attempt 0: a late abort of run 0 must not stop run 1."""
    events, reports = queue.SimpleQueue(), []
    procs = FakeProcesses(events)
    sup, start = _supervisor(events, procs, reports, attempt=0, run=1)
    events.put(
        AbortSeen(
            Stage(0, 0), Failure.from_json({"kind": "rank", "rank": 1, "host": "x", "how": "old"})
        )
    )
    for rank in range(3):
        events.put(RankExited(rank, 0, 1.0))
    outcome = sup.run(start)
    assert procs.sent == [] and reports == []
    assert set(_states(outcome).values()) == {"succeeded"}


def test_a_clients_stop_of_the_previous_run_is_not_this_ones():
    events, reports = queue.SimpleQueue(), []
    procs = FakeProcesses(events)
    sup, start = _supervisor(events, procs, reports, attempt=0, run=3)
    events.put(Signalled(signal.SIGTERM, "the client disconnected", run=2))
    for rank in range(3):
        events.put(RankExited(rank, 0, 1.0))
    outcome = sup.run(start)
    assert procs.sent == [] and reports == [] and outcome.signum is None
    sup, start = _supervisor(events, procs, reports, attempt=0, run=3)
    events.put(Signalled(signal.SIGTERM, "the client disconnected", run=3))
    outcome = sup.run(start)
    assert outcome.signum == signal.SIGTERM and reports[0]["how"] == "the client disconnected"


def test_a_rank_ignoring_sigterm_is_killed_after_the_grace_period():
    events, reports = queue.SimpleQueue(), []
    procs = FakeProcesses(events, ignores_term={2})
    sup, start = _supervisor(events, procs, reports, grace=0.05)
    events.put(RankExited(0, 1, 1.0))
    outcome = sup.run(start)
    assert (2, signal.SIGKILL) in procs.sent and (1, signal.SIGKILL) not in procs.sent
    assert _states(outcome)[2] == "terminated"


def test_sigusr1_is_forwarded_and_the_attempt_goes_on():
    events, reports = queue.SimpleQueue(), []
    procs = FakeProcesses(events)
    sup, start = _supervisor(events, procs, reports)
    events.put(Signalled(signal.SIGUSR1))
    for index in range(3):
        events.put(RankExited(index, 0, 1.0))
    outcome = sup.run(start)
    assert procs.sent == [(0, signal.SIGUSR1), (1, signal.SIGUSR1), (2, signal.SIGUSR1)]
    assert set(_states(outcome).values()) == {"succeeded"} and outcome.signum is None


def test_usr2_that_slurm_gave_every_rank_is_not_sent_again():
    """Under proctrack/linuxproc the ranks got the step's USR2 from Slurm: a second copy could
    kill a rank that checkpointed and is exiting. A client's USR2 (resident agents) and a stop
    signal still go to the ranks."""
    events, reports = queue.SimpleQueue(), []
    procs = FakeProcesses(events)
    sup, start = _supervisor(events, procs, reports, slurm_signals_ranks=True)
    events.put(Signalled(signal.SIGUSR2))
    events.put(Signalled(signal.SIGUSR1, "agent run's client"))
    events.put(Signalled(signal.SIGTERM))
    outcome = sup.run(start)
    assert [s for _, s in procs.sent] == [signal.SIGUSR1] * 3 + [signal.SIGTERM] * 3
    assert outcome.signum == signal.SIGTERM


def test_a_rank_killed_by_the_steps_sigterm_before_the_agents_copy_is_no_rank_failure():
    """Where Slurm signals every process of the step (scancel, the time limit), a rank's death
    by SIGTERM may be seen first: the agent's own SIGTERM, just after, is the cause (exit 143,
    infrastructure), the rank terminated. Without Slurm's signal, or without the agent's copy,
    the same death is the rank's failure."""
    for slurm, agents_copy, kinds in [
        (True, True, [("signal", "SIGTERM")]),
        (True, False, [("rank", "SIGTERM")]),
        (False, True, [("rank", "SIGTERM")]),
    ]:
        events, reports = queue.SimpleQueue(), []
        procs = FakeProcesses(events)
        sup, start = _supervisor(events, procs, reports, slurm_signals_ranks=slurm)
        events.put(RankExited(1, -signal.SIGTERM, 1.0))
        if agents_copy:
            events.put(Signalled(signal.SIGTERM))
        outcome = sup.run(start)
        assert [(r["kind"], r["signal"]) for r in reports] == kinds, (slurm, agents_copy)
        state = "terminated" if kinds[0][0] == "signal" else "failed"
        assert _states(outcome)[1] == state, (slurm, agents_copy)


def test_sigint_to_the_agent_is_reported_and_reaches_ranks_as_sigint():
    events, reports = queue.SimpleQueue(), []
    procs = FakeProcesses(events)
    sup, start = _supervisor(events, procs, reports)
    events.put(Signalled(signal.SIGINT))
    outcome = sup.run(start)
    assert [(r["kind"], r["signal"]) for r in reports] == [("signal", "SIGINT")]
    assert {s for _, s in procs.sent} == {signal.SIGINT}
    assert outcome.signum == signal.SIGINT


def test_an_operator_signal_elsewhere_reaches_ranks_as_that_signal():
    events, reports = queue.SimpleQueue(), []
    procs = FakeProcesses(events)
    sup, start = _supervisor(events, procs, reports)
    events.put(
        AbortSeen(
            Stage(0, 0),
            Failure(Kind.SIGNAL, "agent received SIGINT", host="n1", signal="SIGINT"),
        )
    )
    sup.run(start)
    assert {s for _, s in procs.sent} == {signal.SIGINT}


def test_a_lost_store_tears_down_and_says_so():
    events, reports = queue.SimpleQueue(), []
    procs = FakeProcesses(events)
    sup, start = _supervisor(events, procs, reports)
    events.put(StoreLost("lost the job store at 10.0.0.1:29500"))
    outcome = sup.run(start)
    assert outcome.store_lost == "lost the job store at 10.0.0.1:29500"
    assert {s for _, s in procs.sent} == {signal.SIGTERM} and reports == []


class SilentStream(FakeStream):
    """A rank that printed its last line at `since` (monotonic)."""

    def __init__(self, since: float) -> None:
        super().__init__()
        self.last_output = self.last_progress = since


def test_a_hang_warning_comes_when_it_falls_due_not_at_the_next_idle_look():
    """Nothing happening, the supervisor sleeps IDLE_TICK (5 s) between looks, except until the
    next look that is due: a rank silent for --hang-warning 0.2 s is warned about at once."""
    events, reports = queue.SimpleQueue(), []
    procs = FakeProcesses(events)
    specs = [_spec(0)]
    sup = Supervisor(
        specs, stage=Stage(0, 0), events=events, report=lambda r: r, grace=5.0,
        hang_warning=0.2, processes=procs,
    )  # fmt: skip
    started = time.monotonic()
    workers = [Worker(specs[0], FakeProc(1000), 0.0, SilentStream(started), SilentStream(started))]
    warned = threading.Event()

    def watch() -> None:  # ends the rank once the warning is out (3 s: a hang, not a slow look)
        deadline = time.monotonic() + 3.0
        while not sup.outcome.warnings and time.monotonic() < deadline:
            time.sleep(0.01)
        if sup.outcome.warnings:
            warned.set()
        events.put(RankExited(0, 0, 1.0))

    threading.Thread(target=watch, daemon=True).start()
    outcome = sup.run(lambda: workers)
    assert warned.is_set(), "no --hang-warning within 3 s of a 0.2 s one"
    assert outcome.warnings == ["rank 0 has printed nothing for 0s (--hang-warning)"]
    assert reports == []


class RecordingHang:
    """The supervisor's hang watch, as a fake: what it was told, and when it posted."""

    quiet, timeout = False, 0.0  # no --hang-timeout

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def started(self, ranks) -> None:
        self.calls.append(("started", tuple(ranks)))

    def exited(self, rank, returncode, when, post=True) -> None:
        self.calls.append(("exited", rank, post))

    def flush(self) -> None:
        self.calls.append(("flush",))

    def tick(self, quiet_for) -> None:
        pass


def test_a_nodes_ranks_that_end_together_are_told_to_the_hang_watch_as_one_batch():
    events, reports = queue.SimpleQueue(), []
    procs = FakeProcesses(events)
    sup, start = _supervisor(events, procs, reports)
    sup.hang = RecordingHang()
    for index in range(3):
        events.put(RankExited(index, 0, 1.0))
    sup.run(start)
    exits = [c for c in sup.hang.calls if c[0] == "exited"]
    assert exits == [("exited", 0, False), ("exited", 1, False), ("exited", 2, True)]
