"""What node 0 asks of the OS to host the job store: file descriptors for thousands of agents'
connections (and how many are still free), a port probe, IP literals told from host names."""

from __future__ import annotations

import errno
import ipaddress
import os
import resource
import socket

# Connections node 0 holds per agent: the store's main, failure reports, heartbeat, and during an
# attempt its abort watcher and stacks desk; and the agent's lifeline (agent.control.lifeline).
FDS_PER_AGENT = 6


def raise_fd_limit(agents: int) -> tuple[int, int]:
    """Node 0 serves every agent's connections (FDS_PER_AGENT each): 4,096 nodes need ~25K file
    descriptors, 200 already pass the soft limit many sites keep (1024). Raise the soft limit
    as far as this job needs (and the hard limit allows) — only then, since node 0's ranks
    inherit it; returns (soft before, soft now)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = FDS_PER_AGENT * agents + 1024  # + the agent's own files, pipes, ranks' streams
    wanted = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):
            return soft, soft
        return soft, wanted
    return soft, soft


def free_fds() -> int | None:
    """Descriptors this process may still open (its soft limit less those open now); None where
    that cannot be known (no limit, no /proc)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        open_now = len(os.listdir("/proc/self/fd")) - 1  # less the one listdir itself held
    except OSError as exc:
        return 0 if exc.errno in (errno.EMFILE, errno.ENFILE) else None
    return soft - open_now


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def probe_port(port: int) -> int:
    """Bind `port` (0: any) and let it go: the port a one-agent job's rank 0 will bind."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore binds it
        probe.bind(("", port))
        return probe.getsockname()[1]
