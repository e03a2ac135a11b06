"""This node's paused ranks for one attempt, and the requests `agent debug` sends them.

Every agent listens on a unix socket in its private 0700 directory (agent.hang.fallback), named
to its ranks by AGENT_DEBUG_SOCKET; a rank that pauses connects (agent.pause.hook) and is a
`RankLink` until its session ends. Requests travel with `agent stacks` ones, through the
attempt's StackDesk (agent.hang.desk: `post`, `relays`): node 0 (`ask`) publishes one sealed in
the attempt's scope and waits, bounded, for every agent's answer; each agent's stacks thread
hands it here and puts a quick answer itself (a list, or none of the ranks asked for is here);
the agent holding the ranks answers a pdb line from a thread and a store connection of the
desk's own (a line may take seconds). No port is opened:
clients reach node 0's authenticated endpoint only (agent.control.debug_service).

The socket is bounded like every listener of the agent, though only the user's own processes can
reach it: one desk holds `max_links` connections at most (64: more processes paused on one node
than anyone debugs), each with `handshake` seconds to say where it stopped (agent.pause.link),
and frames of 1 MiB at most (agent.pause.frames); a process beyond the cap is told why in one
frame and runs on without pdb (agent.pause.hook); every connection, stopped or not, goes with
the attempt (`close`).

Several processes of one rank may pause at once (a forked DataLoader worker stopping in
`__getitem__` while its rank stops in the training loop): each is a link of its own, keyed by
(rank, pid), and requests reach each.

Requests: {"op": "list"} → {"paused": [records]}; {"op": "send", "ranks", "line", "wait"} and
{"op": "take", "ranks", "wait"} → {"answers": {"<rank>:<pid>": {"output", "state"}}} for the
paused processes of those ranks this node holds; "procs": [[rank, pid], ...] narrows a request
to those processes; "banner": true (a take for a client attaching) puts where pdb stopped first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

from agent.hang.desk import StackDesk
from agent.node.scope import Scope
from agent.node.stage import Stage
from agent.pause import acceptor
from agent.pause.frames import encode
from agent.pause.hook import SOCKET_ENV
from agent.pause.link import GONE, RankLink
from agent.pause.paused import Paused, answer_key

log = logging.getLogger("agent")
ANSWER_SLACK = 3.0  # seconds node 0 waits beyond what a request allows each node
MAX_WAIT = 30.0  # the longest one request may hold a node's answer
DESK = "pause"  # what our requests say in the StackDesk's `desk` field
MAX_LINKS = 64  # connections one desk holds: processes stopped in pdb on one node, at most
HANDSHAKE = 5.0  # seconds a connecting process has to say who it is and where it stopped


class PauseDesk:
    def __init__(
        self,
        scope: Scope,
        stacks: StackDesk,  # the attempt's: its requests carry ours
        host: str,
        directory: str | None,  # this agent's private directory (None: no debugging here)
        stage: Stage,
        # once per paused process: the console line (True: another process of its rank is
        # paused too, so the line names its pid)
        announce: Callable[[Paused, bool], None],
        max_links: int = MAX_LINKS,
        handshake: float = HANDSHAKE,
    ) -> None:
        self.scope, self.stacks, self.host, self.stage = scope, stacks, host, stage
        self.announce = announce
        self.max_links, self.handshake = max_links, handshake
        self.path = (
            os.path.join(directory, f"debug-{os.getpid()}-{stage}-n{scope.index}.sock")
            if directory
            else None
        )
        self._links: dict[tuple[int, int], RankLink] = {}  # (rank, pid) → its session
        self._announced: set[tuple[int, int]] = set()
        self._open: set[RankLink] = set()  # every connection held, stopped in pdb or not yet
        self._closed = False
        self._lock = threading.Lock()
        self._spare: list[Scope] = []  # store connections for reply and ask threads
        self._listener: socket.socket | None = None

    # -- every node ----------------------------------------------------------------------
    def start(self) -> None:
        if self.path is not None:
            self._listener = self._listen(self.path)
        if self._listener is not None:
            acceptor.register(self._listener, self._accepted)
        self.stacks.relays[DESK] = self._relay

    def env(self) -> dict[str, str]:
        """What this node's ranks need to find it."""
        return {SOCKET_ENV: self.path} if self._listener is not None and self.path else {}

    def paused(self) -> bool:
        """Whether one of this node's ranks is stopped in pdb now."""
        with self._lock:
            return any(link.paused for link in self._links.values())

    def paused_ranks(self) -> set[int]:
        with self._lock:
            return {rank for (rank, _), link in self._links.items() if link.paused}

    def local(self) -> list[Paused]:
        with self._lock:
            links = list(self._links.values())
        return [link.where for link in links if link.paused and link.where is not None]

    def close(self) -> None:
        """The attempt is over here: the socket goes, and every session with it."""
        if self._listener is not None:
            acceptor.unregister(self._listener)
            with contextlib.suppress(OSError):
                self._listener.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path or "")
        with self._lock:
            self._closed = True
            links = {*self._links.values(), *self._open}
            self._links, self._open = {}, set()
        for link in links:
            link.close()

    def _listen(self, path: str) -> socket.socket | None:
        with contextlib.suppress(OSError):
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            os.chmod(path, 0o600)
            sock.listen(64)
        except OSError as exc:
            sock.close()
            log.warning(
                "cannot listen on %s (breakpoint() in ranks falls back to plain pdb on /dev/null, "
                "which ends them in BdbQuit): %s",
                path,
                exc,
            )
            return None
        return sock

    def _accepted(self, conn: socket.socket) -> None:
        link = RankLink(conn, self.host, self._paused, self.handshake, self._ended)
        with self._lock:
            refused = self._closed or len(self._open) >= self.max_links
            if not refused:
                self._open.add(link)
        if not refused:
            link.start()
            return
        if not self._closed:
            conn.setblocking(False)  # one short frame into an empty buffer: never waits
            with contextlib.suppress(OSError):
                conn.send(encode({"refused": self._full()}))
        with contextlib.suppress(OSError):
            conn.close()

    def _full(self) -> str:
        return (
            f"this node's agent holds {self.max_links} processes paused in pdb already "
            "(its limit); continue one of them (agent debug) to make room"
        )

    def _ended(self, link: RankLink) -> None:
        with self._lock:
            self._open.discard(link)

    def _paused(self, link: RankLink) -> None:
        process = (link.rank, link.pid)
        with self._lock:
            for key in [k for k, old in self._links.items() if old.state == GONE]:
                del self._links[key]  # sessions that ended (a worker that exited, say)
            old = self._links.get(process)
            self._links[process] = link
            first = process not in self._announced
            self._announced.add(process)
            sibling = any(
                r == link.rank and other is not link and other.paused
                for (r, _), other in self._links.items()
            )
        if old is not None and old is not link:
            old.close()  # an older session of the same process (breakpoints left, then paused)
        if first and link.where is not None:
            self.announce(link.where, sibling)

    def _relay(self, number: int, request: dict[str, Any]) -> dict[str, Any] | None:
        """The answer now when it is quick (a list; none of the ranks asked for is here), on
        the stacks thread's own connection; else from a thread of its own (a pdb line may take
        seconds, and must not hold the next request)."""
        if request.get("op") == "list" or not self._links_for(request):
            return self.handle(request)
        threading.Thread(
            target=self._reply, args=(number, request), name="pause-reply", daemon=True
        ).start()
        return None

    def _links_for(self, request: dict[str, Any]) -> dict[tuple[int, int], RankLink]:
        ranks, procs = _ranks(request.get("ranks")), _procs(request.get("procs"))
        with self._lock:
            return {
                process: link
                for process, link in self._links.items()
                if (ranks is None or process[0] in ranks) and (procs is None or process in procs)
            }

    def _reply(self, number: int, request: dict[str, Any]) -> None:
        with contextlib.suppress(Exception), self._connection() as side:
            side.put(self.stacks.answer_name(number), self.handle(request))

    @contextlib.contextmanager
    def _connection(self) -> Iterator[Scope]:
        """A store connection of the desk's own for one thread (kept for the next one)."""
        with self._lock:
            side = self._spare.pop() if self._spare else None
        if side is None:
            side = self.scope.on(self.scope.store.another_client())
        yield side
        with self._lock:
            self._spare.append(side)

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """This node's answer to one request."""
        op = request.get("op")
        if op == "list":
            return {"paused": [p.to_json() for p in self.local()]}
        wait = _wait(request.get("wait"))
        links = self._links_for(request)
        line = request.get("line")
        if not (op == "take" or op == "send" and isinstance(line, str)):
            return {"answers": {}}
        answers: dict[str, dict[str, str]] = {}

        def one(process: tuple[int, int], link: RankLink) -> None:  # at once: lines take time
            if isinstance(line, str) and op == "send":
                output, state = link.exchange(line, wait)
            else:
                output, state = link.take(wait, banner=request.get("banner") is True)
            answers[answer_key(*process)] = {"output": output, "state": state}

        threads = [threading.Thread(target=one, args=item) for item in links.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return {"answers": answers}

    # -- node 0 ----------------------------------------------------------------------------
    def ask(self, request: dict[str, Any]) -> list[dict[str, Any] | None]:
        """Every node's answer to `request` (None: a node that did not answer in time)."""
        wait = _wait(request.get("wait"))
        number = self.stacks.post({**request, "desk": DESK})
        names = [self.stacks.answer_name(number, node) for node in self.stacks.nodes]
        with self._connection() as asking:
            asking.store.wait([asking.key(name) for name in names], wait + ANSWER_SLACK)
            return [asking.get_if(name, "debug answer") for name in names]


def _wait(value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return max(0.0, min(float(value), MAX_WAIT))
    return 0.0


def _procs(value: object) -> set[tuple[int, int]] | None:
    """The processes a request names ([rank, pid] pairs); None: every one of its ranks."""
    if not isinstance(value, list):
        return None
    return {
        (item[0], item[1])
        for item in value[:65536]
        if isinstance(item, list)
        and len(item) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) for n in item)
    }


def _ranks(value: object) -> set[int] | None:
    """The ranks a request names; None: every rank."""
    if not isinstance(value, list):
        return None
    return {r for r in value[:65536] if isinstance(r, int) and not isinstance(r, bool)}
