"""Runs one attempt on this node: spawn, watch, and on the first failure anywhere tear down."""

from __future__ import annotations

import json
import logging
import queue
import signal
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agent.node.events import AbortSeen, StoreLost
from agent.node.failure import Failure, Kind
from agent.node.signals import STOP, Signalled
from agent.node.stage import Stage
from agent.plan.ranks import RankSpec
from agent.run import workers as w
from agent.run.binding_check import BindingCheck
from agent.run.leftovers import Leftovers
from agent.run.summary import RankExit, rank_failure

log = logging.getLogger("agent")
# The longest the supervisor waits for an event when nothing falls due sooner: at thousands of
# agents on few cores, every needless wake of every agent is CPU the job's own work lacks.
IDLE_TICK = 5.0
PAUSED_LOOK = 1.0  # while a rank is paused in pdb: how often its pause is noted (--hang-warning)
# Where Slurm signals every process of the step itself, a rank killed by a stop signal may be
# seen before the agent's own copy of it: how long the rank's exit waits for that copy before
# it counts as the rank's failure (the scheduler's stop is the job's cause, not the rank).
STEP_SIGNAL_WAIT = 0.5


@dataclass
class Outcome:
    exits: list[RankExit]
    failure: Failure | None = None  # what this node published as a failure of the attempt
    signum: int | None = None
    store_lost: str | None = None
    refused: str | None = None
    warnings: list[str] = field(default_factory=list)
    progressed: bool = False  # a rank printed a --progress-regex line in this attempt
    step: int | None = None  # the furthest step this node's ranks named (--progress-regex `step`)
    leftovers: Leftovers | None = None  # what the ranks left on the node (agent.run.leftovers)


class Supervisor:
    """One node, one attempt: reacts to rank exits, aborts elsewhere, signals and a lost store.

    Everything it does to processes goes through `processes` (workers.Processes by default),
    and everything it learns arrives on `events`, so tests drive it with fakes.
    """

    def __init__(
        self,
        specs: Sequence[RankSpec],
        *,
        stage: Stage,  # this attempt of this run: an abort of any other is not ours
        events: queue.SimpleQueue,
        report: Callable[[Failure], Failure | None],
        grace: float,
        hang_warning: float,
        processes: w.Processes | None = None,
        hang: Any = None,  # agent.hang.watch.HangWatch: this node's standing for node 0's judges
        pace: Any = None,  # agent.run.pace.PaceWatch when --progress-regex is set
        slurm_signals_ranks: bool = False,  # agent.world.proctrack: the ranks have it already
        paused: Callable[[], Collection[int]] = frozenset,  # ranks stopped in pdb (agent.pause)
    ) -> None:
        self.paused = paused
        self.hang = hang
        self.pace = pace
        self.slurm_signals_ranks = slurm_signals_ranks
        self.specs = specs
        self.procs = processes or w.Processes()
        self.stage = stage
        self.attempt = stage.attempt or 0
        self.events = events
        self._report = report  # publishes the job's first failure (never raises)
        self.grace = grace
        self.hang_warning = hang_warning
        self.outcome = Outcome(exits=[])
        self.workers: list[w.Worker] = []
        self._deadline: float | None = None
        self._stragglers: list = []
        self._hung: set[int] = set()
        self._paused_seen: dict[int, float] = {}  # rank → last look that found it in pdb
        self.bindings = BindingCheck()
        self._held: list[Any] = []  # events read while a rank's exit waited for a signal

    def run(self, start: Callable[[], list[w.Worker]]) -> Outcome:
        self.workers = start()
        if self.hang is not None:
            self.hang.started([worker.spec.rank for worker in self.workers])
        alive = len(self.workers)
        while alive:
            event = self._next_event()
            if event is None:
                continue
            if isinstance(event, w.RankExited):
                alive -= 1
                self._on_exit(event, more=alive > 0 and self._more_events())
            elif isinstance(event, AbortSeen) and event.stage == self.stage:
                self._on_abort(event.record)
            elif isinstance(event, StoreLost):
                self.outcome.store_lost = self.outcome.store_lost or event.why
                self._stop("the job store is gone: node 0's agent died or the network broke")
            elif isinstance(event, Signalled) and event.run in (None, self.stage.run):
                self._on_signal(event.signum, event.how)
            if self.hang is not None and not self._more_events():
                self.hang.flush()  # exits held back for the last of a batch
        self.procs.kill(self._stragglers)
        return self.outcome

    # -- events ---------------------------------------------------------------------------
    def _next_event(self):
        if self._held:
            return self._held.pop(0)
        timeout = 0.05 if self.bindings.pending(self.workers) else self._until_due()
        if self._deadline is not None:
            timeout = max(0.0, min(timeout, self._deadline - time.monotonic()))
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            if self._deadline is not None and time.monotonic() >= self._deadline:
                log.warning("grace period over: SIGKILL to ranks still running")
                self.procs.signal_all(self.workers, signal.SIGKILL)
                self.procs.kill(self._stragglers)
                self._deadline = float("inf")
            self._check_hangs()
            if self.pace is not None and self._deadline is None:
                self.pace.tick()
            self.outcome.warnings += self.bindings.verify(self.workers)
            return None

    def _more_events(self) -> bool:
        return bool(self._held) or not self.events.empty()

    def _on_exit(self, event: w.RankExited, more: bool = False) -> None:
        """`more`: other events wait already (the node's other ranks ending with it): this
        exit's standing goes out with theirs."""
        worker = self.workers[event.index]
        worker.returncode, worker.end = event.returncode, event.when
        if self._step_signal(event.returncode):
            worker.terminated = True  # the scheduler stopped the step: the agent's signal says so
        state = "succeeded" if event.returncode == 0 else "failed"
        if worker.terminated and event.returncode != 0:
            state = "terminated"
        exit = RankExit(
            worker.spec.rank,
            worker.spec.local_rank,
            worker.spec.node_rank,
            worker.spec.host,
            worker.proc.pid,
            event.returncode,
            state,
            worker.start,
            event.when,
            self.attempt,
            self.bindings.seen.get(worker.spec.rank),
        )
        self.outcome.exits.append(exit)
        if self.hang is not None:
            self.hang.exited(exit.rank, event.returncode, event.when, post=not more)
        if state == "failed" and self._deadline is None:
            worker.err.done.wait(1.0)  # let the pipe drain so the record has its last words
            record = rank_failure(
                exit, self._stderr_tail(worker), _read_error_file(worker.spec.error_file)
            )
            lost_with = getattr(worker.proc, "lost_with", None)  # a warm rank's zygote died
            if lost_with:
                record = replace(record, how=f"{record.how} {lost_with}")
            self.outcome.failure = self._report(record) or record
            self._stop(f"rank {exit.rank} {record.how}")

    def _step_signal(self, returncode: int) -> bool:
        """Whether a rank killed by a stop signal was killed by the scheduler's stop of the whole
        step: where Slurm signals the ranks itself, the agent's own copy of that signal comes
        within STEP_SIGNAL_WAIT (it is handled here, first); else the exit is the rank's own."""
        signum = -returncode
        if not (self.slurm_signals_ranks and self._deadline is None and signum in STOP):
            return False
        until = time.monotonic() + STEP_SIGNAL_WAIT
        while (left := until - time.monotonic()) > 0:
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                break
            ours = isinstance(event, Signalled) and event.run in (None, self.stage.run)
            if ours and event.signum == signum and event.how is None:
                self._on_signal(event.signum)
                return True
            self._held.append(event)  # handled in its turn, after this exit
        return False

    def _on_abort(self, record: Failure) -> None:
        if self._deadline is None:
            # in the report's words: `node 1 (n1) lost: ...`, the node named once
            self._stop(f"failure elsewhere ({record.line()})", _operator_signal(record))

    def _on_signal(self, signum: int, how: str | None = None) -> None:
        name = signal.Signals(signum).name
        if signum not in STOP and how is None and self.slurm_signals_ranks:
            log.info("%s: Slurm (proctrack/linuxproc) gave it to every rank already", name)
            return
        if signum not in STOP:
            log.info("forwarding %s to every rank of this node", name)
            self.procs.signal_all(self.workers, signum)
            return
        if self.outcome.signum is None:
            self.outcome.signum = signum
            if self._deadline is None:
                spec = self.specs[0] if self.specs else None
                record = Failure(
                    Kind.SIGNAL,
                    how or f"agent received {name}",
                    spec.node_rank if spec else -1,
                    spec.host if spec else "?",
                    time.time(),
                    signal=name,  # peers stop their ranks with the same signal
                )
                self.outcome.failure = self._report(record) or record
            elif signum != signal.SIGTERM:
                # Already stopping for a peer's reason: the operator's signal still reaches the ranks.
                self.procs.signal_all(self.workers, signum)
            self._stop(f"received {name}", signum)

    def _stop(self, why: str, signum: int = signal.SIGTERM) -> None:
        """SIGTERM (or the signal we got) to every rank's group now; SIGKILL after the grace."""
        if self._deadline is not None:
            return
        log.warning("tearing down this node: %s", why)
        for worker in self.workers:
            if worker.returncode is None:
                worker.terminated = True
        self._stragglers = self.procs.descendants(self.workers)
        self.procs.signal_all(self.workers, signum)
        self._deadline = time.monotonic() + self.grace

    # -- helpers --------------------------------------------------------------------------
    def _stderr_tail(self, worker: w.Worker) -> list[str]:
        text = b"".join(worker.err.tail).decode("utf-8", "replace")
        return text.splitlines()[-20:]

    def quiet_for(self) -> float | None:
        """Seconds since a live rank of this node last made progress; None: none is live."""
        live = [w for w in self.workers if w.returncode is None]
        if not live:
            return None
        last = max(max(w.out.last_progress, w.err.last_progress) for w in live)
        return time.monotonic() - last

    def silent_for(self, rank: int) -> float:
        """Seconds since this node's `rank` last made progress (0 for a rank not here)."""
        for worker in self.workers:
            if worker.spec.rank == rank:
                last = max(worker.out.last_progress, worker.err.last_progress)
                return time.monotonic() - last
        return 0.0

    def _until_due(self) -> float:
        """Seconds to wait for an event: until the next look falls due — this node turning
        quiet (--hang-timeout), a rank's --hang-warning, its pace record (node 0 judges on
        those) — and IDLE_TICK at most."""
        wait = IDLE_TICK
        if self._deadline is not None:
            return wait
        now = time.monotonic()
        quiet_for = self.quiet_for() if self.hang is not None else None
        if quiet_for is not None and not self.hang.quiet and self.hang.timeout > 0:
            wait = min(wait, self.hang.timeout - quiet_for + 0.01)
        paused = set(self.paused())
        if paused:
            wait = min(wait, PAUSED_LOOK)
        warning = self._warning_due(paused)
        if warning is not None:
            wait = min(wait, warning - now + 0.01)
        if self.pace is not None:
            wait = min(wait, self.pace.due - now)
        return max(wait, 0.01)

    def _warning_due(self, paused: set[int]) -> float | None:
        """When (monotonic) the first live rank not yet warned about, and not paused in pdb,
        reaches --hang-warning (as _check_hangs counts it: its last line, or the last look that
        found it paused)."""
        due = [
            self._last_sign(worker) + self.hang_warning
            for worker in self.workers
            if worker.returncode is None and worker.spec.rank not in self._hung | paused
        ]
        return min(due) if due else None

    def _last_sign(self, worker: w.Worker) -> float:
        # time spent in pdb is not silence: a rank that ran on is quiet since it left pdb
        rank = worker.spec.rank
        return max(worker.out.last_output, worker.err.last_output, self._paused_seen.get(rank, 0.0))

    def _check_hangs(self) -> None:
        now = time.monotonic()
        quiet_for = self.quiet_for() if self.hang is not None else None
        if self.hang is not None and quiet_for is not None and self._deadline is None:
            self.hang.tick(quiet_for)  # node 0's coordinator judges (agent.run.coordinator)
        paused = set(self.paused())  # silent by choice: no --hang-warning for them
        for rank in paused:
            self._paused_seen[rank] = now
        for worker in self.workers:
            if worker.returncode is not None or worker.spec.rank in self._hung | paused:
                continue
            last = self._last_sign(worker)
            if now - last > self.hang_warning:
                self._hung.add(worker.spec.rank)
                msg = f"rank {worker.spec.rank} has printed nothing for {now - last:.0f}s (--hang-warning)"
                self.outcome.warnings.append(msg)
                log.warning(msg)


def _operator_signal(record: Failure) -> int:
    """Ctrl-C on one node reaches every rank as SIGINT, not as a SIGTERM teardown."""
    name = record.signal if record.kind is Kind.SIGNAL else None
    allowed = {s.name: s for s in STOP}
    return allowed.get(name, signal.SIGTERM) if isinstance(name, str) else signal.SIGTERM


def _read_error_file(path: str, limit: int = 32 << 20) -> dict[str, Any] | None:
    """torch's @record file, if it is there and sane (bounded: a rank wrote it)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
        data = json.loads(raw) if len(raw) <= limit else None
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None
