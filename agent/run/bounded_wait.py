"""Waits for a record node 0 writes once — a lineup, a verdict — that end even when an outsider
deletes it or writes garbage over it (issue 25, item 4).

A value that does not open is absent (agent.node.sealed), so a forged or deleted record would
leave its reader waiting for ever while node 0, which wrote it, has gone on. Each wait is
therefore given what only a genuine job can show, and ends with "store tampering suspected at
KEY" (exit 4) when the record is still missing although:
- the verdict: node 0 has closed the attempt (its sealed `closed` abort record, written right
  after the verdict), another node reported the same tampering there, or node 0's agent has
  left (its sealed departure). A node's own result, which node 0 needs to judge, is looked at
  on the same checks and written again when it is gone or does not open: a deletion delays
  the verdict (by CHECK_MAX seconds at most), never decides it;
- the lineup: node 0 decides it within the round's own bound (its health check, then the
  members' reports: each --health-timeout, plus the report slack), so a lineup missing
  LINEUP_MARGIN seconds after that is not a slow node 0.
These checks cost a few queries, first after a second, then less and less often (at most every
CHECK_MAX seconds): a wait that ends normally pays nothing, and a tampered record is named
within CHECK_MAX seconds of the evidence (at once, for a wait that began with it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from agent.errors import PeerFailed
from agent.node.failure import Failure
from agent.node.membership import SCOPE as MEMBERSHIP
from agent.node.scope import Scope
from agent.node.sealed import Tampered, read_sealed
from agent.node.trust import Refused
from agent.run.lineup import REPORT_SLACK, check_wait

log = logging.getLogger("agent")
TICK = 1.0  # seconds: a wait answers to node 0's loss and failures this often; first check
# ...or less often in a job so large that its nodes' waits (for the lineup, for the verdict),
# each renewed every tick, would ask node 0's store more than this many a second: a renewal is
# a wait and its cancel, and torch's store server walks every waiting client at each cancel.
WAITS_PER_SECOND = 512
CHECK_MAX = 30.0  # seconds between looks at the evidence, at most (doubling from TICK)
LINEUP_MARGIN = 30.0  # seconds past the round's own bound (node 0's replan, a fresh store)
SETTLE = 0.25  # seconds a last read waits past a forgery once the record must be there
READ_EVERY = 0.5  # seconds between node 0's reads of the results that came while it waits


class _Over(Exception):
    def __init__(self, why: str) -> None:
        self.why = why


def lineup_limit(health_timeout: float) -> float:
    """How long a member waits for the lineup after posting its health: node 0's own check,
    then its wait for the reports, then the margin."""
    return 2 * health_timeout + REPORT_SLACK + LINEUP_MARGIN


def await_sealed(
    scope: Scope,
    name: str,
    what: str,
    events: Any,
    fatal: Callable[[Scope], Failure | None],
    over: Callable[[], str] = lambda: "",
    limit: float | None = None,
    tick: float = TICK,
) -> dict[str, Any]:
    """The sealed record `name` of `scope`, waited for while answering to node 0's loss and to
    a failure that ends the wait (`fatal`), each within `tick` seconds. `over()` says
    (non-empty) why the record must exist by now; `limit`: seconds after which it must.
    Either ends the wait as Tampered when no sealed record is there."""
    key = scope.key(name)
    started = time.monotonic()
    check = {"at": started + tick, "every": tick}

    def woken() -> None:
        failure = check_wait(scope, events, fatal)
        if failure is not None:
            raise PeerFailed(f"{failure.host}: {failure.how}")
        now = time.monotonic()
        if limit is not None and now - started > limit:
            raise _Over(f"none came within {limit:g}s")
        if now < check["at"]:
            return
        check["every"] = min(check["every"] * 2, CHECK_MAX)
        check["at"] = now + check["every"]
        why = over()
        if why:
            raise _Over(why)

    try:
        while not scope.store.wait([key], tick):
            woken()
        data = scope.store.get_bytes(key, present=True)
        copies = scope.copies_of(key)  # node 0 writes the lineup and verdict with a first copy
        record = read_sealed(scope.store, scope.keys, key, what, data, woken=woken, copies=copies)
    except _Over as ended:
        return _last_look(scope, key, what, ended.why)
    assert record is not None  # no stop event: a record or an exception
    return record


def _last_look(scope: Scope, key: str, what: str, why: str) -> dict[str, Any]:
    """The record must be there: one more read (past a forgery for SETTLE s), else Tampered."""
    if scope.store.exists(key):
        data = scope.store.get_bytes(key, present=True)
        with contextlib.suppress(Tampered):  # said below, with why it had to be there
            return read_sealed(scope.store, scope.keys, key, what, data, SETTLE) or {}
    raise Tampered(key, f"the {what} is gone or does not open, yet {why}")


def verdict_over(scope: Scope, own_result: tuple[str, dict[str, Any]] | None) -> Callable[[], str]:
    """What shows that node 0 wrote the attempt's verdict (or never can): its sealed `closed`
    record, its agent's departure. `own_result` (a node that ran ranks): the name and record of
    our result, which node 0 waits for: written again when it is gone or does not open."""
    members = Scope(scope.store, MEMBERSHIP, scope.index, scope.keys)
    keep = kept(scope, *own_result, "result") if own_result is not None else lambda: None

    def over() -> str:
        keep()
        abort = scope.abort()
        if abort is not None and abort.closed:
            return "node 0 has closed the attempt"
        if abort is not None and abort.tampering:
            return f"{abort.host} found the store tampered with"  # over its `closed`
        return _node0_left(members)

    return over


def kept(scope: Scope, name: str, record: dict[str, Any], what: str) -> Callable[[], None]:
    """A look at a record this node wrote for node 0 (its result, its health report): written
    again when it is gone or does not open, each time also as a copy node 0 blocks on (a
    deletion or a forgery delays, never decides)."""
    again = [0]

    def look() -> None:
        if scope.get_if(name, what) is None:
            log.warning(
                "%s: the %s this node wrote is gone or does not open; written again",
                scope.key(name),
                what,
            )
            again[0] += 1
            scope.put_again(name, record, again[0])

    return look


def node0_over(scope: Scope, keep: Callable[[], None] = lambda: None) -> Callable[[], str]:
    """Node 0's departure in order: whatever it was to write, it has written. `keep`: a look
    at what this node wrote for node 0 meanwhile (`kept`)."""
    members = Scope(scope.store, MEMBERSHIP, scope.index, scope.keys)

    def over() -> str:
        keep()
        return _node0_left(members)

    return over


def _node0_left(members: Scope) -> str:
    """Non-empty when node 0 left in order (it wrote all it had to); PeerFailed when it left
    on a failure of its own (told to the job already: not a tampering matter)."""
    departed = members.get_if("gone/0", "departure")
    if departed is None:
        return ""
    if departed.get("why") is not None:
        raise PeerFailed(f"node 0's agent left: {departed.get('why')}")
    return "node 0's agent has left"


def results_with_own(
    scope: Scope, nodes: list[int], me: int, mine: dict[str, Any], pause: float = READ_EVERY
) -> list[dict[str, Any]]:
    """Node 0: every node's sealed result, its own taken from its hand (a copy in the store
    that an outsider deleted or replaced could otherwise stop the judging for ever). Read as
    they come, every `pause` seconds, so that the last result costs one read, not N (4,096
    simulated agents: the one read of all at the end took 1.2 s of the last result → summary).
    The wait for the rest goes on past a deletion or a forgery: their writers watch their own
    and write it again (`verdict_over`); a value that does not open is left to that last read."""
    found: dict[int, dict[str, Any]] = {}
    pending = [i for i in nodes if i != me]
    store = scope.store
    while pending:
        keys = [scope.key(f"result/{i}") for i in pending]
        if store.wait(keys, pause):
            break
        there = [i for i, here in zip(pending, store.exists_each(keys), strict=True) if here]
        values = store.multi_get([scope.key(f"result/{i}") for i in there], True) if there else []
        for i, value in zip(there, values, strict=True):
            with contextlib.suppress(Refused):  # an outsider's: the last read waits past it
                found[i] = scope.keys.unseal(value, scope.key(f"result/{i}"), "result")
        pending = [i for i in pending if i not in found]
    if pending:
        read = scope.get_all([f"result/{i}" for i in pending], "result")
        found.update(zip(pending, read, strict=True))
    found[me] = json.loads(json.dumps(mine))  # as the others': what the store would hold
    return [found[i] for i in nodes]


def await_verdict(
    scope: Scope,
    events: Any,
    own_result: tuple[str, dict[str, Any]] | None,
    nodes: int = 1,
    tick: float | None = None,
) -> dict[str, Any]:
    """A node (`own_result`: the name and record of the result it wrote) or a spare (None) of
    a job of `nodes` waits for node 0's verdict on the attempt; a failure elsewhere is node
    0's to judge. `tick`: wait_tick(nodes) when not given."""
    over = verdict_over(scope, own_result)
    tick = wait_tick(nodes) if tick is None else tick
    return await_sealed(scope, "verdict", "verdict", events, lambda scope: None, over, tick=tick)


def wait_tick(nodes: int) -> float:
    """Seconds between the renewals of a wait that every node of a job of `nodes` makes at
    once (the lineup, the verdict): TICK, or longer where `nodes` waits renewed that often
    would ask node 0's store more than WAITS_PER_SECOND (at 2,048 simulated agents on 2 cores,
    the waits of the nodes done first slowed node 0's read of the results). Node 0's loss is
    then noticed up to that long after its heartbeat timeout; a closed store connection ends
    the wait at once, and the record it waits for wakes it at once.
    """
    return max(TICK, nodes / WAITS_PER_SECOND)
