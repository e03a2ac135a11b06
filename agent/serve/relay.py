"""A resident run's console goes to the client that asked for it, not to the agents' terminals.

Node 0 writes its ranks' lines straight into the client's channel; every other node sends its
lines, and its own warnings (why it tears down), to node 0 over its feed (a channel of its own,
opened once), and node 0 relays them. The
router's console thread is the only writer of each, and it drops lines rather than block a rank
when the client is slow (agent.console.router), so a stalled client never stalls a run.

A message node 0 hands to its client is not printed on its own stderr too: `srun ... serve &`
and `agent run` in one shell share a terminal, where it would appear twice. The run's agent log
(LOG_DIR/agent-00000.log) keeps it; a message the client did not get (gone) still goes to stderr.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from agent.control import wire
from agent.node.stage import tagged

log = logging.getLogger("agent")


class ChannelOut:
    """A binary stream for the LogRouter: each write is one {"out"} frame (whole lines)."""

    def __init__(self, channel: wire.Channel | None, fd: int, run: int | None = None) -> None:
        self.channel, self.fd, self.run = channel, fd, run
        self.broken = False

    def write(self, data: bytes) -> int:
        if self.channel is None or self.broken or not data:
            return len(data)
        message: dict[str, Any] = {"out": wire.pack_bytes(bytes(data)), "fd": self.fd}
        if self.run is not None:
            message["run"] = self.run
        try:
            self.channel.send(message)
        except Exception as exc:  # the client (or node 0) went away: files still get every byte
            self.broken = True
            log.warning("console lines no longer reach the client: %s", exc)
        return len(data)

    def flush(self) -> None:
        pass


class _ToClient(logging.Handler):
    def __init__(self, channel: wire.Channel, host: str, level: int, run: int | None) -> None:
        super().__init__(level)
        self.channel, self.run = channel, run
        tagged(self, f"agent {host}")

    def emit(self, record: logging.LogRecord) -> None:
        message: dict[str, Any] = {"log": self.format(record)}
        if self.run is not None:
            message["run"] = self.run
        try:
            self.channel.send(message)
        except Exception:
            return
        record.reached_client = True  # the terminal handlers below leave it out (_NotTwice)


class _NotTwice(logging.Filter):
    """On this agent's own stderr: only the messages no client got (see the module's doc)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, "reached_client", False)


@contextlib.contextmanager
def forward_logs(
    channel: wire.Channel | None, host: str, level: int = logging.INFO, run: int | None = None
) -> Iterator[None]:
    """This agent's own messages during a run reach the client: node 0's straight into the
    client's channel (teardown reasons, the report), another node's warnings (its teardown
    reason) over its feed, tagged with the run, for node 0 to relay."""
    if channel is None:
        yield
        return
    handler = _ToClient(channel, host, level, run)
    logger = logging.getLogger("agent")
    logger.addHandler(handler)  # the "agent" logger's handlers run before the root's
    terminals = [h for h in logging.getLogger().handlers if type(h) is logging.StreamHandler]
    once = _NotTwice()
    for terminal in terminals:
        terminal.addFilter(once)
    try:
        yield
    finally:
        for terminal in terminals:
            terminal.removeFilter(once)
        logger.removeHandler(handler)
