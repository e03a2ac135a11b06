"""Every node's ranks' stacks on request, through the attempt's scope in the job store.

Node 0 asks (`ask`): it publishes the next request, sealed, and waits a bounded time for every
agent's answer. Every agent (node 0 too) has a thread blocked on the next request key over a
connection of its own; it dumps its own ranks (agent.hang.capture) and publishes them sealed.
Nothing runs while nobody asks but that wait, renewed every `RECHECK` seconds. Other desks post
their requests through this one (`post`, `relays`: agent.pause answers `agent debug` so), which
keeps one waiting thread and one store connection per agent whatever the number of desks.

Node 0 numbers its requests itself (no store counter an outsider could bump) and seals, after
each, the number of the latest (`stacks/latest`). A request that is not there when a later one
was published (deleted, or overwritten by a value that does not open) is skipped, logged once:
the answering threads never wait on a number that leads to no sealed request.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from agent.hang.stacks import RankStack
from agent.node.scope import Scope
from agent.node.sealed import Tampered, read_sealed
from agent.node.stage import Stage

log = logging.getLogger("agent")
ANSWER_SLACK = 2.0  # seconds node 0 waits beyond the capture time itself
ANSWER_LIMIT = 4 << 20  # bytes of JSON per node's answer (a store value holds 8 MiB sealed)
RECHECK = 5.0  # seconds an answering thread waits on a request before it looks for a later one
# ...or longer in a job so large that node 0's store would answer more rechecks a second than
# this (each a wait, its cancel and a query): a deleted request delays its node's answer that
# long. A request that is there wakes its wait at once: only an outsider's deletion needs one.
RECHECKS_PER_SECOND = 64


class StackDesk:
    def __init__(
        self,
        scope: Scope,
        nodes: Sequence[int],  # the agents that run ranks in this attempt (spares do not)
        host: str,
        ranks: Callable[[], list[tuple[int, int]]],  # this node's live (rank, pid)
        fallback_dir: str | None = None,
        stage: Stage | None = None,  # the run and attempt it serves (a request names its run)
        recheck: float | None = None,  # recheck_pace(len(nodes)) when not given
    ) -> None:
        self.scope, self.nodes, self.host, self.stage = scope, tuple(nodes), host, stage
        self.ranks, self.fallback_dir = ranks, fallback_dir
        self._lock = threading.Lock()
        self._asking: Scope | None = None  # node 0's own connection for requests
        self._posted = 0  # node 0: the number of the last request it published
        self._gathering: Scope | None = None  # node 0: the connection `gather` waits on
        self._gather_lock = threading.Lock()
        self.recheck = recheck_pace(len(self.nodes)) if recheck is None else recheck
        # request["desk"] → who answers it instead of this desk: (number, request) → the answer
        # (put here at once), or None when it puts one under answer_name(number) itself later
        self.relays: dict[str, Callable[[int, dict[str, Any]], dict[str, Any] | None]] = {}

    def start(self) -> None:
        threading.Thread(target=self._answer, name="stacks", daemon=True).start()

    def _answer(self) -> None:
        side = self.scope.on(self.scope.store.another_client())
        number = 0
        with contextlib.suppress(Exception):  # the store went away: the attempt is over
            while True:
                number += 1
                request = self._request(side, number)
                if request is None:
                    continue  # skipped: a later request was published
                if request.get("end"):
                    return
                relay = self.relays.get(str(request.get("desk")))
                if relay is not None:
                    answer = relay(number, request)
                    if answer is not None:
                        side.put(self.answer_name(number), answer)
                    continue
                stacks = self._stacks(
                    native=bool(request.get("native")),
                    timeout=float(request.get("timeout", 2.0)),
                )
                side.put(f"stacks/{number}/{self.scope.index}", _answer(stacks))

    def _request(self, side: Scope, number: int) -> dict[str, Any] | None:
        """Request `number` once it is there and sealed; None (skipped) once node 0 has sealed
        a later one as its latest while this one is absent or does not open; an `end` record
        when node 0 ended the attempt at or after this number."""
        key = side.key("stacks", "req", number)
        while True:
            if side.store.wait([key], self.recheck):
                data = side.store.get_bytes(key, present=True)
                with contextlib.suppress(Tampered):
                    record = read_sealed(
                        side.store, side.keys, key, "stacks request", data, self.recheck
                    )
                    assert record is not None
                    return record
            latest = side.get_if("stacks/latest", "latest stacks request") or {}
            last = latest.get("n")
            if not isinstance(last, int) or last < number:
                continue  # nothing published past it yet: keep waiting
            if latest.get("end"):
                return {"end": True}  # the attempt is over, whatever became of this request
            if last > number:
                log.warning(
                    "%s: no sealed request there though node 0 published a later one (deleted "
                    "or altered in the store); skipped",
                    key,
                )
                return None

    def _stacks(self, native: bool, timeout: float) -> list[RankStack]:
        """This node's live ranks' stacks, each with its flight recorder where its probe
        answers (asked at once, beside the stack capture)."""
        from agent.hang.capture import capture
        from agent.hang.recorder import RankRecorder, ask_all

        ranks = self.ranks()
        answers: dict[int, dict[str, Any]] = {}
        asking = None
        if self.fallback_dir and ranks:
            directory = self.fallback_dir

            def probe() -> None:
                answers.update(ask_all(directory, ranks))

            asking = threading.Thread(target=probe, name="probes", daemon=True)
            asking.start()
        stacks = capture(
            ranks, self.host, native=native, timeout=timeout, fallback_dir=self.fallback_dir
        )
        if asking is None:
            return stacks
        asking.join()
        return [
            replace(s, recorder=RankRecorder.from_json(answers[s.rank])) if s.rank in answers else s
            for s in stacks
        ]

    def ask(self, native: bool = False, timeout: float = 2.0) -> list[RankStack]:
        """Node 0: every node's answer (nodes that did not answer in time are named)."""
        with self._lock:
            if self._asking is None:
                self._asking = self.scope.on(self.scope.store.another_client())
            s = self._asking
            number = self._publish(s, {"native": native, "timeout": timeout})
            keys = [s.key("stacks", number, i) for i in self.nodes]
            deadline = time.monotonic() + timeout + ANSWER_SLACK
            every = s.store.wait(keys, timeout + ANSWER_SLACK)
            found: list[RankStack] = []
            names = [f"stacks/{number}/{i}" for i in self.nodes]
            answers: list[dict[str, Any] | None] | None = None
            if every:  # one round trip for every answer; one that does not open (an
                # outsider's garbage, there before the node's answer or over it) is waited past
                # until the deadline, never longer: its node answers once, and a hang found
                # must end the job (the soak's hang seed 10 waited on one for ever)
                left = max(deadline - time.monotonic(), 0.001)
                with contextlib.suppress(Tampered):
                    answers = list(s.get_all(names, "stacks answer", left))
            if answers is None:  # someone is silent, or garbled: name it
                answers = [s.get_if(name, "stacks answer") for name in names]
            for i, answer in zip(self.nodes, answers, strict=True):
                if answer is None:
                    altered = s.store.exists(s.key(f"stacks/{number}/{i}"))
                    found.append(_silent(i, timeout + ANSWER_SLACK, altered))
                    continue
                found += [RankStack.from_json(item) for item in _items(answer.get("stacks"))]
            return sorted(found, key=lambda stack: stack.rank)

    def post(self, request: dict[str, Any]) -> int:
        """Node 0: publish another desk's request to every agent; its number."""
        with self._lock:
            if self._asking is None:
                self._asking = self.scope.on(self.scope.store.another_client())
            return self._publish(self._asking, request)

    def gather(self, request: dict[str, Any], wait: float) -> list[dict[str, Any] | None]:
        """Node 0: every node's quick answer to another desk's request (`agent top`), None for
        a node silent for `wait` seconds. One at a time, on a connection of its own: a stacks
        request (seconds of py-spy) never holds it up, nor it the stacks."""
        number = self.post(request)
        names = [self.answer_name(number, node) for node in self.nodes]
        with self._gather_lock:
            if self._gathering is None:
                self._gathering = self.scope.on(self.scope.store.another_client())
            side = self._gathering
            if side.store.wait([side.key(name) for name in names], wait):
                with contextlib.suppress(Tampered):  # one round trip for every answer
                    return list(side.get_all(names, "relayed answer", wait))
            return [side.get_if(name, "relayed answer") for name in names]

    def _publish(self, s: Scope, request: dict[str, Any]) -> int:
        """Node 0 (holding the lock): the request under the next number of its own, then that
        number sealed as the latest. A request that could not be stored (too large) takes no
        number: the answering threads wait on the next one as before."""
        number = self._posted + 1
        s.put(f"stacks/req/{number}", request)
        s.put("stacks/latest", {"n": number, "end": bool(request.get("end"))})
        self._posted = number
        return number

    def answer_name(self, number: int, node: int | None = None) -> str:
        """Where node `node` (default: this one) answers request `number`."""
        return f"stacks/{number}/{self.scope.index if node is None else node}"

    def end(self) -> None:
        """Node 0, the attempt is over: the answering threads return."""
        with contextlib.suppress(Exception), self._lock:
            self._publish(self._asking or self.scope, {"end": True})


def _answer(stacks: list[RankStack]) -> dict[str, Any]:
    """This node's answer, shrunk to fit one store value (deep stacks of many ranks can be
    megabytes): the innermost frames are the ones that say where a rank is."""
    answer = {"stacks": [s.to_json() for s in stacks]}
    if len(json.dumps(answer)) <= ANSWER_LIMIT:
        return answer
    small = [
        replace(s, threads=tuple(replace(t, frames=t.frames[-24:]) for t in s.threads[:8]))
        for s in stacks
    ]
    return {"stacks": [s.to_json() for s in small]}


def _items(value: object) -> Sequence[object]:
    return value[:4096] if isinstance(value, list) else []


def _silent(node: int, waited: float, altered: bool = False) -> RankStack:
    why = (
        "answer did not open (altered in the store)"
        if altered
        else f"agent did not answer within {waited:g} s"
    )
    return RankStack(
        rank=-1 - node, host=f"node {node}", pid=0, method="none", threads=(),
        error=f"node {node}'s {why}",
    )  # fmt: skip


def recheck_pace(nodes: int) -> float:
    """Seconds between an answering thread's looks past its request: RECHECK, or longer where
    `nodes` threads looking that often would ask node 0's store more than RECHECKS_PER_SECOND."""
    return max(RECHECK, nodes / RECHECKS_PER_SECOND)
