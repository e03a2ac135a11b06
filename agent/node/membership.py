"""Who is alive: claiming a node index, the join barrier, heartbeats, lost and departed peers.

Every agent does O(1) store operations to join; only node 0 touches O(N) keys, and only in one
multi-key call per heartbeat tick. No compare-and-set loops, no polling sleeps: waits block.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence

from agent.errors import AgentError, ExitCode
from agent.node.scope import Scope
from agent.node.sealed import Tampered, tell_refused
from agent.node.store import Store
from agent.node.trust import JobKeys, Refused
from agent.text import printable

log = logging.getLogger("agent")

FIRST_TICK = 30.0  # seconds node 0 waits for a peer's first heartbeat before counting it silent
# Heartbeats reaching node 0 per second, at most, while a peer still ticks 3 times per
# --heartbeat-timeout. Node 0's store spends ~4x more on a query it answers (a write, the reply's
# delivery) than on one it only reads (4,096 a second on this machine: 9 % of a core against 2 %),
# and each beat wakes its agent (at 2,048 agents on this machine, beating every second was 0.25
# ms of CPU per agent a second, the most of any idle agent's threads).
TICKS_PER_SECOND = 512
# A later claimant of a node index waits this long for the sealed claims of the earlier tickets
# (written one query after their ticket was taken); a ticket an outsider took costs it once.
CLAIM_WAIT = 3.0
CLAIM_WINDOW = 64  # earlier tickets looked at: two agents of one index take theirs together
HOSTS_WAIT = 3.0  # seconds node 0 waits past a host announcement an outsider deleted or garbled
SCOPE = "m"  # the membership's keys: claims, the join, beats, departures (gone/<index>)


def pace(agents: int, interval: float, lost_after: float, leader: bool) -> tuple[float, int]:
    """(seconds between ticks, one tick in how many is answered). A peer ticks every
    `interval`, or every agents / TICKS_PER_SECOND seconds when that is longer (but at least 3
    times per `lost_after`), and asks for an answer at least every `lost_after` / 2 seconds.
    Node 0 reads every beat twice per peer tick, every `interval` at most: reading all N each
    `interval` while each changes every 8 s (4,096 agents) was most of its idle heartbeat work."""
    peer = max(interval, min(agents / TICKS_PER_SECOND, lost_after / 3))
    tick = max(interval, peer / 2) if leader else peer
    return tick, max(1, int(lost_after / 2 / tick))


class Membership:
    def __init__(
        self,
        store: Store,
        agents: int,
        index: int,
        names: Sequence[str],
        keys: JobKeys,
    ) -> None:
        self.store = store
        self.agents = agents
        self.index = index
        self.names = names  # "node 3 (n4)" per agent, for messages
        self.scope = Scope(store, SCOPE, index, keys, wakes=("done",))
        self._hosts: list[str] | None = None

    def claim(self, host: str, wait: float = CLAIM_WAIT) -> None:
        """Take this node index for the job, once: a second agent with the same one is refused
        before it writes anything else of the job, so the job that holds the index is left
        untouched.

        The claim is this agent's own sealed record under `claim/<index>/<ticket>` (its host,
        pid and a nonce); the `claim/<index>` counter only hands out tickets. An agent is refused
        only on a sealed claim of an earlier ticket that is not its own: a later ticket waits
        (`wait` seconds at most) for the earlier ones' records, which their agents write right
        after taking them. A ticket an outsider took with `add()` never gets a record: it costs
        that wait once and refuses no one. A ticket that already has a sealed claim (an outsider
        deleted or reset the counter: it went back) counts as an earlier one."""
        ticket = self.store.add(self.scope.key("claim", self.index))
        mine = {"i": self.index, "ticket": ticket, "host": host, "pid": os.getpid()}
        mine["nonce"] = secrets.token_hex(8)
        held = self.scope.get_if(f"claim/{self.index}/{ticket}", "node claim")
        self.scope.put(f"claim/{self.index}/{ticket}", mine)
        earlier = [f"claim/{self.index}/{t}" for t in range(max(1, ticket - CLAIM_WINDOW), ticket)]
        if earlier:
            self.store.wait([self.scope.key(name) for name in earlier], wait)
        for other in [held, *(self.scope.get_if(name, "node claim") for name in earlier)]:
            if other is None or other.get("i") != self.index or other.get("nonce") == mine["nonce"]:
                continue
            raise AgentError(
                f"{self.names[self.index]} is already taken in this job (job {self.store.ns!r}) "
                f"by the agent pid {other.get('pid')} on {printable(str(other.get('host')))}: "
                "another agent with the same job, step and node index is running; start one "
                "agent per node (srun --ntasks-per-node=1), or give this job its own --job-id",
                ExitCode.RENDEZVOUS,
            )
        self.host = host

    def join(self, timeout: float) -> None:
        self._hosts = None
        self.scope.barrier(self.agents, timeout, self.names, {"host": self.host})

    def hosts(self) -> list[str]:
        """Every agent's host as it announced itself when joining (after the barrier), read
        once. A note an outsider deleted or garbled since is waited past for HOSTS_WAIT seconds
        at most, then that host is unknown (""): a tampered note delays, never hangs a run."""
        if self._hosts is not None:
            return self._hosts
        names = [f"in/{i}" for i in range(self.agents)]
        if self.store.exists_all([self.scope.key(name) for name in names]):
            try:
                notes = self.scope.get_all(names, "host announcement", 0.001)
                self._hosts = [str(note.get("host", "")) for note in notes]
                return self._hosts
            except Tampered:
                pass
        deadline = time.monotonic() + HOSTS_WAIT
        hosts = []
        for name in names:
            note = self.scope.get_if(name, "host announcement")
            while note is None and time.monotonic() < deadline:
                time.sleep(0.25)  # only an outsider's write leads here: a few polls, bounded
                note = self.scope.get_if(name, "host announcement")
            hosts.append("" if note is None else str(note.get("host", "")))
        self._hosts = hosts
        return hosts

    def leaving(self, why: str | None = None) -> None:
        """Our silence from now on is a departure (why=None: an orderly one), not a loss."""
        self.scope.put(f"gone/{self.index}", {"why": why})

    def heartbeat(
        self,
        stop: threading.Event,
        interval: float,
        lost_after: float,
        on_lost: Callable[[str], None],
        on_silent: Callable[[int], None] | None,
    ) -> threading.Thread:
        """Beat; node 0 (`on_silent` given) also notices a peer that stopped.

        A beat is a sealed record under `hb/<index>`: the sender's index and a sequence number
        that only grows (microseconds of the wall clock at the agent's start, plus its ticks), so
        an outsider who bumps, replays, copies or deletes beats never makes a dead node look
        alive: node 0 counts a peer alive only on a sealed beat newer than the last it saw.
        A peer beats at `pace` (every `interval`, less often in jobs so large that node 0
        would receive more than TICKS_PER_SECOND, never less than 3 times per `lost_after`);
        one beat in `answered` is followed by a query that is answered, so a store that stopped
        answering is noticed within ~1.5 * `lost_after`. A peer only ever names its own key.
        Node 0 waits (FIRST_TICK s at most) for every beat to exist, then reads all N in one
        query every tick of its own (a missing one reads as empty: a peer that never beat is
        lost `lost_after` later), and opens only the values that changed."""
        beat = self.store.another_client(op_timeout=lost_after)  # a silent store counts as lost
        mine = beat.key("hb", self.index)
        keys, index = self.scope.keys, self.index
        first = time.time_ns() // 1000  # grows across restarts of this agent as well

        def sealed(seq: int) -> bytes:
            return keys.seal({"i": index, "seq": seq}, mine)

        beat.set_bytes(mine, sealed(first))
        beat.exists(mine)  # answered: ours exists before node 0 reads every beat
        leader = on_silent is not None
        tick, answered = pace(self.agents, interval, lost_after, leader)

        def run() -> None:
            ticks = 0
            watch = Silence(self.index, lost_after, FIRST_TICK) if on_silent is not None else None
            every = tuple(beat.key("hb", i) for i in range(self.agents)) if watch else ()
            beats = Beats(keys, every)
            waited_past: set[int] = set()
            try:
                if watch is not None:
                    beat.wait(every, FIRST_TICK)
                while not stop.wait(tick):
                    ticks += 1
                    beat.set_bytes(mine, sealed(first + ticks))
                    if not ticks % answered:
                        beat.exists(mine)
                    if watch is None:
                        continue
                    seqs = beats.read(beat.multi_get(every, present=True))
                    now = time.monotonic()
                    for i in watch.silent(seqs, now):
                        if beats.tampered[i] and i not in waited_past:
                            # A deletion or forgery delays, never decides: its node writes
                            # its beat again each tick; one more --heartbeat-timeout for it.
                            waited_past.add(i)
                            watch.again(i, now)
                            log.warning(
                                "store tampering suspected at %s: %s; waiting past it",
                                every[i],
                                beats.tampered[i],
                            )
                            continue
                        if on_silent is not None:  # node 0's watch: `leader`
                            on_silent(i)
            except Exception as exc:
                if not stop.is_set():
                    on_lost(
                        f"lost the job store at {beat.endpoint.addr}:{beat.endpoint.port} ({exc})"
                    )

        thread = threading.Thread(target=run, name="heartbeat", daemon=True)
        thread.start()
        return thread


class Beats:
    """Node 0's reading of the sealed beats: per peer, the newest sequence number seen in a
    beat that opens under its own key and names its sender. Bytes unchanged since the last
    read are not opened again (O(N) compares a tick, a decryption only per new beat); a value
    that does not open, an older beat (a replay) or an empty key leaves the peer's number
    where it was, and is remembered as the reason it may fall silent (`tampered`)."""

    def __init__(self, keys: JobKeys, names: Sequence[str]) -> None:
        self.keys, self.names = keys, names
        self.raw: list[bytes] = [b""] * len(names)
        self.seqs: list[int] = [0] * len(names)
        self.tampered: list[str] = [""] * len(names)

    def read(self, values: Sequence[bytes]) -> list[int]:
        raw, seqs = self.raw, self.seqs
        for i, value in enumerate(values):
            if value == raw[i]:
                continue
            raw[i] = value
            if not value:
                if seqs[i]:
                    self.tampered[i] = "its heartbeat key was deleted"
                continue
            try:
                record = self.keys.unseal(value, self.names[i], "heartbeat")
            except Refused as exc:
                tell_refused(self.names[i], exc)
                self.tampered[i] = "its heartbeat key holds a value that does not open"
                continue
            seq = record.get("seq")
            if record.get("i") != i or not isinstance(seq, int) or seq <= seqs[i]:
                self.tampered[i] = "an old heartbeat of it was written back (a replay)"
                continue
            seqs[i], self.tampered[i] = seq, ""
        return seqs


class Silence:
    """Node 0's view of the heartbeats: which peers stopped beating (each named once).

    `silent` is fed every peer's newest beat number at each tick; a peer whose number has not
    moved for more than `lost_after` seconds is returned (once). O(N) per tick, no allocation per unchanged peer.
    A peer with no sealed beat yet (0) has `first_after` seconds: an outsider's value where its
    first beat goes, then deleted, only delays (its agent may still be connecting)."""

    def __init__(self, own: int, lost_after: float, first_after: float | None = None) -> None:
        self.own, self.lost_after = own, lost_after
        self.first_after = lost_after if first_after is None else max(first_after, lost_after)
        self.counts: list[int] = []
        self.since: list[float] = []
        self.reported: set[int] = set()

    def again(self, peer: int, now: float) -> None:
        """`peer`'s clock starts again now (named once more when it stays silent)."""
        self.reported.discard(peer)
        if peer < len(self.since):
            self.since[peer] = now

    def silent(self, counts: Sequence[int], now: float) -> list[int]:
        if len(self.counts) != len(counts):  # the first tick: every clock starts now
            self.counts, self.since = list(counts), [now] * len(counts)
            return []
        found = []
        last, since, limit = self.counts, self.since, now - self.lost_after
        first = now - self.first_after
        for i, count in enumerate(counts):
            if count != last[i]:
                last[i], since[i] = count, now
            elif (
                since[i] < (limit if count else first) and i != self.own and i not in self.reported
            ):
                self.reported.add(i)
                found.append(i)
        return found
