"""--hang-timeout, node 0's part: the job hangs when every rank still running, on every node,
has made no progress for T seconds (agent.hang.standing). Ranks that exited are done, not quiet.

When the records say the job is still, node 0 asks every node again (a request of the stacks
desk, `RECHECK_DESK`): each measures its silence at that moment and answers its standing under
that request's number. Only answers that all say still call a hang, so an old quiet record
written back by an outsider can at most make node 0 ask (once per RECHECK_AGAIN s), never decide.
Then every node dumps its live ranks' stacks, they go to stacks-a<attempt>.txt, and the failure
record names the ranks still running (the odd stack first) and those that had exited.

By default (with the flight recorder; --hang-timeout or not): when a node's standing names ranks
waiting in a collective near its process group's timeout (agent.hang.collective_watch), node 0
asks every rank's stack and recorder and calls the hang if those fresh answers show a collective
overdue (agent.hang.overdue) — before torch's own timeout ends some ranks with a bare error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence

from agent.hang.collectives import collective_view, render_view
from agent.hang.desk import StackDesk
from agent.hang.overdue import clause, overdue
from agent.hang.stacks import RankStack
from agent.hang.standing import Ended, Standing, stillness
from agent.hang.watch import RECHECK_DESK
from agent.node.failure import Failure, Kind
from agent.node.scope import Scope
from agent.plan.log_dir import LogDir

log = logging.getLogger("agent")
STACKS_IN_RECORD = 32 << 10  # characters of the collated stacks kept in the failure record
RECHECK_WAIT = 2.0  # seconds node 0 waits for every node's answer before it calls a hang
RECHECK_AGAIN = 1.0  # seconds before it asks again when the answers said the job moves
OVERDUE_AGAIN = 10.0  # seconds before stacks are asked again when no collective was overdue


class HangJudge:
    def __init__(
        self,
        desk: StackDesk,
        scope: Scope,  # node 0's connection for the recheck's answers (the coordinator's)
        *,
        timeout: float,
        log_dir: str,
        attempt: int,
        node_rank: int,
        host: str,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,  # the clock of the ranks' end times
    ) -> None:
        self.desk, self.timeout, self.log_dir, self.attempt = desk, timeout, log_dir, attempt
        self.node_rank, self.host, self.scope, self.clock = node_rank, host, scope, clock
        self.wall = wall
        self.fired = False
        self.rechecks = 0  # questions asked: each one a still job by the records
        self._again = float("-inf")
        self.overdue_asks = 0  # stack captures asked because a node found a rank overdue
        self._overdue_again = float("-inf")
        self.began = clock()  # the attempt's start, near enough: no node is quiet before T

    def look(
        self, standings: Mapping[int, Standing], unsure: Collection[int] = ()
    ) -> Failure | None:
        """A failure record when the job hangs (once); None otherwise. `unsure`: nodes whose
        record was missing or did not open at the last read."""
        if self.fired:
            return None
        return self._still(standings, unsure) or self._overdue(standings)

    def _still(self, standings: Mapping[int, Standing], unsure: Collection[int]) -> Failure | None:
        """--hang-timeout: every rank still running silent for T."""
        if self.timeout <= 0:
            return None
        if not stillness(
            self.desk.nodes, standings, self.wall(), self.timeout
        ).still and not self._maybe_still(standings, unsure):
            return None
        now = self.clock()
        if now < self._again:
            return None
        answers = self.recheck()
        if not stillness(self.desk.nodes, answers, self.wall(), self.timeout).still:
            self._again = now + RECHECK_AGAIN
            return None
        self.fired = True
        ranks = [answers[a] for a in self.desk.nodes]
        running = sum(len(s.live) for s in ranks)
        log.error(
            "no progress for %g s from the %d rank(s) still running: capturing their stacks",
            self.timeout,
            running,
        )
        noun = "rank" if running == 1 else "ranks"
        how = f"hang: no progress for {self.timeout:g} s from the {running} {noun} still running"
        return self._hang(how, self.desk.ask(native=False), ranks)

    def _maybe_still(self, standings: Mapping[int, Standing], unsure: Collection[int]) -> bool:
        """Records an outsider garbled or deleted show no progress, nor stillness: when every
        other node's record says still (or done) once T has passed, ask every node (the fresh
        answers decide). Without it, a node's quiet record garbled before node 0 read it kept
        a hung job running for ever (the soak's hang seed 2011); a healthy node's record says
        active, and no question is asked."""
        if not unsure or self.clock() - self.began < self.timeout:
            return False
        rest = [standings.get(a) for a in self.desk.nodes if a not in unsure]
        return all(s is not None and (s.quiet or not s.live) for s in rest)

    def _overdue(self, standings: Mapping[int, Standing]) -> Failure | None:
        """By default: a node found ranks waiting in a collective near its group's timeout
        (agent.hang.overdue). Node 0 asks every rank's stack and recorder afresh and calls the
        hang only on what those answers say (a node's stale or replayed word only asks)."""
        if not any(s.overdue for s in standings.values()):
            return None
        now = self.clock()
        if now < self._overdue_again:
            return None
        self.overdue_asks += 1
        stacks = self.desk.ask(native=False)
        recorders = {s.rank: s.recorder for s in stacks if s.rank >= 0 and s.recorder}
        wall = self.wall()
        found = overdue(recorders, wall)
        if not found:
            self._overdue_again = now + OVERDUE_AGAIN
            return None
        self.fired = True
        how = f"hang: {clause(found, wall)}"
        before = "before" if any(p.waited(wall) < p.timeout for p in found) else "instead of"
        log.error("%s: the job ends with every stack %s torch's own timeout", how, before)
        return self._hang(how, stacks, [standings[a] for a in self.desk.nodes if a in standings])

    def recheck(self) -> dict[int, Standing]:
        """Every node's standing now, each its answer to a request numbered after the records
        that raised the question (a node that does not answer in time is left out: no hang)."""
        self.rechecks += 1
        number = self.desk.post({"desk": RECHECK_DESK})
        names = {agent: self.desk.answer_name(number, agent) for agent in self.desk.nodes}
        s = self.scope
        s.store.wait([s.key(name) for name in names.values()], RECHECK_WAIT)
        found: dict[int, Standing] = {}
        for agent, name in names.items():
            answer = Standing.from_json(s.get_if(name, "standing answer"))
            if answer is not None and answer.agent == agent:
                found[agent] = answer
        return found

    def _hang(
        self, how: str, stacks: Sequence[RankStack], standings: Sequence[Standing]
    ) -> Failure:
        """The failure record: `how`, the collectives' first finding, the stacks' headline,
        the ranks that had exited; every stack to stacks-a<attempt>.txt."""
        from agent.hang.collate import collate, headline, render

        groups = collate(stacks)
        ended = Ended.of(standings)
        view = collective_view(stacks, groups, {e.rank: e.returncode for e in ended.ranks})
        text = render_view(view) + render(groups)
        path = LogDir(self.log_dir).stacks(self.attempt)
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            log.error("cannot write %s: %s", path, exc.strerror or exc)
            path = ""
        parts = [how, *view[:1], headline(groups), ended.clause()]
        return Failure(
            Kind.HANG,
            "; ".join(p for p in parts if p),
            self.node_rank,
            self.host,
            time.time(),
            stacks=text[:STACKS_IN_RECORD],
            stacks_file=path or None,
        )
