"""Agents holding different secrets find out at once, through the job's only public keys.

Every other key of the job lives in a namespace derived from the secret, so an agent with
another secret would wait out the rendezvous timeout in an empty namespace of its own. Node 0
publishes its key-check value under the public name `la/<job>/<step>/hello`; an agent whose own
value differs says so under `.../mismatch` and stops (exit 4), and node 0 ends the join for
everyone naming the node. An outsider can write `mismatch` too: that can stop a job that is still
joining (documented), never a running one — node 0 stops listening once everyone has joined.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

from agent.node.store import Store
from agent.node.trust import JobKeys, Refused, mismatch_message

log = logging.getLogger("agent")
UNREADABLE_WAIT = 5.0  # seconds an unreadable key check is waited past before joining anyway


def announce(public: Store, keys: JobKeys) -> None:
    """Node 0: the value every agent compares its own with."""
    public.set_json(public.key("hello"), {"check": keys.check_value})


def check(public: Store, keys: JobKeys, index: int, timeout: float, who: str) -> None:
    """Other agents: compare with node 0's value; on a mismatch tell node 0 and stop (exit 4)."""
    deadline = time.monotonic() + timeout
    pause = 0.1
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not public.wait([public.key("hello")], left):
            return  # node 0 is older or slow: the rendezvous timeout will speak
        theirs = _check_value(public.get_bytes(public.key("hello")))
        if theirs != "unreadable":
            break
        # Not node 0's value (it writes JSON): an outsider's garbage is waited past for
        # UNREADABLE_WAIT s (issue 35: it ended the agent as a secret mismatch, exit 4), then
        # the check is skipped: node 0 writes its value once, and a join with another secret
        # is still refused by its rendezvous timeout.
        if pause == 0.1:
            log.warning("the key check at %s does not read; waiting past it", public.key("hello"))
            deadline = min(deadline, time.monotonic() + UNREADABLE_WAIT)
        time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
        pause = min(pause * 2, 1.0)
    if theirs != keys.check_value:
        public.set_json(public.key("mismatch"), {"index": index, "check": keys.check_value})
        raise Refused(mismatch_message(keys.check_value, theirs, who))


def watch(
    public: Store, keys: JobKeys, stop: threading.Event, on_mismatch: Callable[[int, str], None]
) -> None:
    """Node 0, while the agents join: a thread blocked on the public mismatch key."""
    watcher = public.another_client()

    def run() -> None:
        try:
            if not watcher.wait([watcher.key("mismatch")], 3600.0) or stop.is_set():
                return
            note = json.loads(watcher.get_bytes(watcher.key("mismatch")))
            index, theirs = int(note["index"]), str(note["check"])
        except Exception as exc:  # a dead store, or an outsider's garbage
            log.debug("mismatch watch ended: %s", exc)
            return
        if theirs != keys.check_value:
            on_mismatch(index, theirs)

    threading.Thread(target=run, name="secret-check", daemon=True).start()


def _check_value(data: bytes) -> str:
    try:
        return str(json.loads(data)["check"])
    except (ValueError, KeyError, TypeError):
        return "unreadable"
