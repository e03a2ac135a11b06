"""Options for failures at scale: hot spares, exclusions, shrinking, health checks."""

from __future__ import annotations

from agent.plan.option import DAY, Option

RESILIENCE: tuple[Option, ...] = (
    Option(
        "spares",
        int,
        0,
        "keep the last K agents idle as hot spares: one takes the place of a node that is lost, "
        "fails its health check or is excluded (node 0 cannot be replaced)",
        low=0,
        high=1_000_000,
    ),
    Option(
        "min_nodes",
        int,
        0,
        "with no spare left, go on with the nodes left while there are at least M "
        "(configs parsed again for the smaller world; 0: never shrink)",
        low=0,
        high=1_000_000,
    ),
    Option(
        "exclude",
        str,
        None,
        "hosts never to run ranks on, e.g. 'gpu[003,017]' (a spare takes their place)",
    ),
    Option(
        "health_check",
        str,
        None,
        "a command every node runs before every attempt: non-zero or too slow means the node is "
        "excluded (its last output lines go to summary.json)",
    ),
    Option(
        "health_timeout",
        float,
        60.0,
        "seconds a node's health checks may take",
        low=0,
        high=DAY,
        above=True,
    ),
    Option(
        "min_free_mib",
        int,
        0,
        "a node whose log dir or /dev/shm has less free space (MiB) fails its health check "
        "(0: not checked; a full log disk alone never stops a job)",
        low=0,
        high=1 << 40,
    ),
)
