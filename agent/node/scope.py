"""One phase's keys in the job store (the membership, a run, an attempt) and its failure channel.

A failure can never be lost: a reporter takes a sequence number, writes its record under its
own key, and only then sets the phase's wake keys (the abort key every watcher blocks on, the
barrier and plan keys others may be waiting for). A reporter that dies half-way leaves a gap in
the sequence, never a phase nobody can end: node 0 reports the lost node itself, and the root
cause is the existing record with the lowest sequence number.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from agent.errors import AgentError, ExitCode, PeerFailed
from agent.node.failure import Failure, Kind, closed
from agent.node.sealed import Tampered, read_sealed, tell_refused
from agent.node.store import Store
from agent.node.trust import JobKeys, Refused

log = logging.getLogger("agent")
LOOK_FIRST = 1.0  # seconds a barrier waits before it looks past its counter, doubling...
COPIES_LOOKED_AT = 64  # a note's copies read at most per look (each costs a query)
LOOK_MAX = 8.0  # ...up to this: an outsider's delete or reset of the count costs this at most
# Looks past the counter that node 0's store serves per second, at most, from every agent but
# the first awaited one (a look is ~5 queries; all agents looking each second at 4,096 agents
# starved the store and the machine: the join took 151 s instead of 18 s and heartbeats
# failed). Above 256 agents the others look less often, jittered; the first looks as before.
LOOKS_PER_SECOND = 256


# torch's TCPStore refuses values over 8 MiB (MAX_PAYLOAD_LEN) by closing the connection.
VALUE_LIMIT = 8 * 1024 * 1024 - 4096


class TooLarge(AgentError):
    def __init__(self, name: str, size: int) -> None:
        super().__init__(
            f"the {name} record is {size / 2**20:.1f} MiB once sealed; the job store carries at "
            f"most {VALUE_LIMIT / 2**20:.1f} MiB per value"
        )
        self.size = size


class Scope:
    """Keys under `<namespace><prefix>/`; `index` is this agent's index (its own keys)."""

    def __init__(
        self, store: Store, prefix: str, index: int, keys: JobKeys, wakes: Sequence[str] = ()
    ) -> None:
        self.store, self.prefix, self.index, self.keys = store, prefix, index, keys
        self.wakes = tuple(wakes)  # names of keys that waiters of this phase may block on

    def key(self, *parts: object) -> str:
        return self.store.key(self.prefix, *parts)

    def on(self, store: Store) -> Scope:
        """The same scope over another connection (for a thread of its own)."""
        return Scope(store, self.prefix, self.index, self.keys, self.wakes)

    # -- records --------------------------------------------------------------------------
    def put(self, name: str, record: dict[str, Any]) -> None:
        key = self.key(name)
        sealed = self.keys.seal(record, key)
        if len(sealed) > VALUE_LIMIT and not self.store.local:  # torch would drop the connection
            raise TooLarge(name, len(sealed))
        self.store.set_bytes(key, sealed)

    def get(
        self,
        name: str,
        what: str,
        present: bool = False,
        timeout: float | None = None,
        woken: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """The sealed record, waiting for it (`present`: known to exist, one round trip less);
        a value that does not open is waited past (`read_sealed`)."""
        key = self.key(name)
        data = self.store.get_bytes(key, present)
        record = read_sealed(
            self.store, self.keys, key, what, data, timeout, woken=woken,
            copies=self.copies_of(key),
        )  # fmt: skip
        assert record is not None  # no stop event: only a record or an exception ends it
        return record

    def copies_of(self, key: str) -> Callable[[int], str]:
        """The names of the copies of the record at `key` (read_sealed's `copies`)."""
        return lambda number: self.keys.copy_name(key, number)

    def put_again(self, name: str, record: dict[str, Any], number: int) -> None:
        """The record written again (found gone or garbled), and as its `number`-th copy under
        a secret name, which a reader waiting past the garbage reads the moment it comes
        (`get`): an outsider garbling the known key faster than anyone reads it delays, never
        stops, the reader."""
        self.put(name, record)
        copy = self.keys.copy_name(self.key(name), number)
        self.store.set_bytes(copy, self.keys.seal(record, copy))

    def get_if(self, name: str, what: str) -> dict[str, Any] | None:
        """The record if a sealed one is there now; None if absent or not ours (logged once)."""
        key = self.key(name)
        if not self.store.exists(key):
            return None
        try:
            return self.keys.unseal(self.store.get_bytes(key, present=True), key, what)
        except Refused as exc:
            tell_refused(key, exc)
            return None

    def get_all(
        self, names: Sequence[str], what: str, timeout: float | None = None
    ) -> list[dict[str, Any]]:
        """Several records in one round trip (waits until every one exists; one that does not
        open is waited past, alone, for `timeout` seconds at most: then Tampered)."""
        keys = [self.key(name) for name in names]
        found = []
        for key, data in zip(keys, self.store.multi_get(keys), strict=True):
            record = read_sealed(
                self.store, self.keys, key, what, data, timeout, copies=self.copies_of(key)
            )
            assert record is not None
            found.append(record)
        return found

    # -- failures -------------------------------------------------------------------------
    def report(self, failure: Failure, slot: object = None) -> Failure:
        """Publish a failure of this phase; returns it with its sequence number (1: first)."""
        record = failure.with_seq(self.store.add(self.key("fail-seq")))
        try:
            self.put(f"fail/{self.index if slot is None else slot}", record.to_json())
        except TooLarge:  # never lose a failure to its size: keep what names it
            note = "details too large for the store: see the rank's files"
            record = replace(record, stderr_tail=(), traceback=None, note=note)
            self.put(f"fail/{self.index if slot is None else slot}", record.to_json())
        self.put("abort", record.to_json())
        for name in self.wakes:
            self.store.set_bytes(self.key(name), b"")
        return record

    def abort(self) -> Failure | None:
        """What the abort key holds now: the latest failure, or node 0's `closed` record;
        None if there is none (or if what is there does not open with the job's key: logged
        once, and ignored)."""
        return Failure.from_json(self.get_if("abort", "abort record"))

    def failure(self) -> Failure | None:
        """The phase's latest failure (the abort key), None if there is none."""
        record = self.abort()
        return None if record is None or record.closed else record

    def failure_of(self, slot: object) -> Failure | None:
        return Failure.from_json(self.get_if(f"fail/{slot}", "failure record"))

    def close(self) -> None:
        """Wakes every watcher of this phase with a record that means: over, no failure."""
        self.put("abort", closed().to_json())

    def watch(
        self,
        stop: threading.Event,
        on_abort: Callable[[Failure], None],
        on_lost: Callable[[str], None],
    ) -> threading.Thread:
        """A thread blocked on the abort key over its own connection. A value there that does
        not open (an outsider's) is waited past: only a sealed record ends the watch."""
        watcher = self.on(self.store.another_client())
        key = watcher.key("abort")

        def run() -> None:
            try:
                while not stop.is_set():
                    if watcher.store.wait([key], 3600.0):
                        data = watcher.store.get_bytes(key, present=True)
                        record = Failure.from_json(
                            read_sealed(
                                watcher.store, self.keys, key, "abort record", data, stop=stop
                            )
                        )
                        if record is not None and not record.closed:
                            on_abort(record)
                        return
            except Exception as exc:  # the store went away: node 0 is gone
                if not stop.is_set():
                    end = watcher.store.endpoint
                    on_lost(f"lost the job store at {end.addr}:{end.port} ({exc})")

        thread = threading.Thread(target=run, name=f"watch-{self.prefix}", daemon=True)
        thread.start()
        return thread

    # -- barrier --------------------------------------------------------------------------
    def barrier(
        self,
        agents: int,
        timeout: float,
        names: Sequence[str],
        note: dict[str, Any] | None = None,
        absent: Collection[int] = (),
        kept: Mapping[str, dict[str, Any]] | None = None,
        doing: str = "to join",
    ) -> None:
        """Every agent arrives once (indexes are claimed, so the count is of distinct agents),
        leaving a sealed `note` under `in/<index>`; `absent` agents (lost before this phase) are
        not waited for. A failure reported in this phase wakes it at once; a timeout names who
        never came. `doing`: what the others are still doing, for the user ("to join").
        `kept`: records this agent wrote for the others before (node 0's plan), written again
        whenever it looks and finds one gone or not opening (a deletion delays, never decides)."""
        kept = kept or {}
        copies: dict[str, int] = {}  # how many times each kept record was put again
        seen = {self.index}  # agents whose sealed note was read: arrived, whatever comes after
        s = self.store
        mine = f"in/{self.index}"
        self.put(mine, note or {})
        count = s.add(self.key("arrived"))
        expected = agents - len(absent)
        waited = [i for i in range(agents) if i not in absent] if absent else list(range(agents))
        # The counter only wakes: the barrier ends on a sealed record, written once every
        # sealed note is in (an outsider's bump of the count ends nothing early).
        if count >= expected and self._all_in(waited, seen):
            copies["done"] = 1
            self.put_again("done", {}, 1)
        else:
            log.info("waiting for %d more agent(s) %s", expected - count, doing)
        deadline = time.monotonic() + timeout
        done = self.key("done")

        def woken() -> None:  # a failure anywhere sets the done key too, to wake us
            failure = self.failure()
            if failure is not None:
                raise PeerFailed(could_not(failure, names), refused=refused(failure))

        def look(full: bool = False) -> bool:
            """Past the counter, which an outsider may delete, reset or bump: our own note
            written again if it is gone or does not open, and the done record written by
            whoever finds every sealed note in. The first awaited agent looks each time; the
            others only when `full`: the done record is there but garbled — the first agent
            may have left the barrier already, so the counter, set back by an outsider, must
            not keep us from writing it (the soak's clean seed 2008). A full look costs a query
            of every note, so the others never look on the count's word: when it reached the
            total, every agent whose look came due read all N notes until one wrote the done
            record (4,096 simulated agents: ~260 full reads, a million unseals). The arrival
            that made the count whole reads them once; an outsider's reset of the count
            leaves it to the first awaited agent's next look (LOOK_MAX s at most).
            Returns whether it found a record of ours gone or garbled (an outsider at work:
            the next look comes in LOOK_FIRST, not later)."""
            tampered = False
            if self.get_if(mine, "host announcement") is None:
                tampered = True
                copies[mine] = copies.get(mine, 0) + 1
                self.put_again(mine, note or {}, copies[mine])
            for name, record in kept.items():
                if self.get_if(name, name) is None:
                    tampered = True
                    log.warning(
                        "the %s record written here is gone or altered: written again", name
                    )
                    copies[name] = copies.get(name, 0) + 1
                    self.put_again(name, record, copies[name])
            if (full or self.index == waited[0]) and self._all_in(waited, seen):
                # every write of it also a copy: a reader blocked on the next one gets it
                # however fast an outsider garbles the known key (soak clean seed 4000)
                copies["done"] = copies.get("done", 0) + 1
                self.put_again("done", {}, copies["done"])
            return tampered

        arrived = False
        first, longest = look_pace(agents, self.index == waited[0])
        pause = first * random.uniform(0.5, 1.0) if first > LOOK_FIRST else first
        while not arrived:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            # the done record, or its first copy (the record deleted as soon as it came)
            arrived = s.wait([done], min(pause, left)) or s.exists(self.keys.copy_name(done, 1))
            woken()
            if not arrived:
                # an outsider garbling the notes faster than the looks come: look every second
                # (each look a chance to read the others' notes sealed; `seen` keeps them)
                pause = LOOK_FIRST if look() else min(pause * 2, longest)
        if arrived:
            left = max(deadline - time.monotonic(), 0.001)

            def woken_or_look() -> None:  # garbage over the done record: written again
                woken()
                look(full=True)

            try:
                data = s.get_bytes(done, present=True)
                read_sealed(
                    s, self.keys, done, "barrier record", data, left, woken=woken_or_look,
                    copies=self.copies_of(done),
                )  # fmt: skip
                return
            except Tampered as exc:
                tampered: Tampered | None = exc
        else:
            tampered = None
        missing = [names[i] for i in waited if not s.exists(self.key("in", i))]
        gone = [name for name in kept if self.get_if(name, name) is None]
        if gone:  # what we wrote for the others (the plan) is no longer there: not a slow node
            raise Tampered(
                self.key(gone[0]), f"the {gone[0]} record written here is gone or altered"
            )
        if not missing:  # everyone's note is in, yet no sealed record ended the barrier
            raise tampered or Tampered(done, f"no sealed barrier record came in {timeout:g}s")
        shown = ", ".join(missing[:8]) + (
            f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        )
        raise AgentError(
            f"rendezvous timed out after {timeout:g}s: {shown} never arrived "
            f"({expected - len(missing)}/{expected} agents joined); check that srun "
            "started an agent on every node, or raise --rdzv-timeout",
            ExitCode.RENDEZVOUS,
        )

    def _all_in(self, waited: Sequence[int], seen: set[int]) -> bool:
        """Whether every awaited agent's sealed note has been read, here or at an earlier look
        (`seen`, updated): a note that was sealed once means its agent arrived, whatever an
        outsider does to it later. Two queries when every note not yet seen is there; a note
        that does not open is looked for among its agent's copies (written again under secret
        names, `put_again`): an outsider garbling every note faster than the looks come cannot
        keep the barrier from ending."""
        todo = [i for i in waited if i not in seen]
        keys = {i: self.key("in", i) for i in todo}
        if todo and not self.store.exists_all(list(keys.values())):
            return False  # not every agent here yet (or a note deleted: its agent writes it again)
        values = self.store.multi_get([keys[i] for i in todo], present=True) if todo else []
        for i, data in zip(todo, values, strict=True):
            if self._opens(keys[i], data) or self._a_copy_opens(keys[i]):
                seen.add(i)
        return seen.issuperset(waited)

    def _opens(self, key: str, data: bytes) -> bool:
        try:
            self.keys.unseal(data, key, "host announcement")
        except Refused:
            return False
        return True

    def _a_copy_opens(self, key: str) -> bool:
        """Whether one of the copies written so far (1, 2, … up to the first absent) opens."""
        for number in range(1, COPIES_LOOKED_AT + 1):
            copy = self.keys.copy_name(key, number)
            if not self.store.exists(copy):
                return False
            if self._opens(copy, self.store.get_bytes(copy, present=True)):
                return True
        return False


def look_pace(agents: int, first_awaited: bool) -> tuple[float, float]:
    """(seconds before a barrier's first look past its counter, the longest pause between
    looks). The first awaited agent ends the barrier when an outsider's reset of the count
    keeps everyone else from it: it looks soon. The others, who look only to write their own
    note again, share LOOKS_PER_SECOND between them; an agent that finds its note tampered
    with looks every LOOK_FIRST whatever the size."""
    if first_awaited:
        return LOOK_FIRST, LOOK_MAX
    spread = agents / LOOKS_PER_SECOND
    return max(LOOK_FIRST, spread), max(LOOK_MAX, spread)


def refused(failure: Failure) -> bool:
    """Whether a peer's failure ends this agent with exit 4 (a secret or tampering matter)."""
    return failure.kind is Kind.SECRET or failure.tampering


def could_not(failure: Failure, names: Sequence[str]) -> str:
    who = failure.agent if failure.agent is not None else failure.node_rank
    name = names[who] if who is not None and 0 <= who < len(names) else failure.host
    return f"{name} could not join: {failure.how}"
