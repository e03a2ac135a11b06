"""What every agent does before it joins, one-shot and resident alike: the world from the
scheduler's env, the command line's options checked, the secret taken out of the ranks' env."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent.node.agent import NodeAgent, NodeSettings
from agent.node.signing import SECRET_ENV, load_secret
from agent.plan.options import Options, resolve
from agent.plan.topology import Topology, read_topology
from agent.run.workers import become_subreaper
from agent.text import PrintableFormatter
from agent.world import World, WorldFlags, world_from_env


def node_world(
    given: Mapping[str, Any], environ: Mapping[str, str]
) -> tuple[World, Options, dict[str, str]]:
    """The world, every flag checked, and the ranks' base env (a snapshot, untouched later)."""
    environ = dict(environ)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # the agent's own c10d chatter only
    world = world_from_env(environ, world_flags(given), hostname=socket.gethostname())
    for handler in logging.getLogger().handlers:  # name the node, not the pid, in every message
        handler.setFormatter(PrintableFormatter(f"[agent {world.host}] %(message)s"))
    return world, resolve(given, {}, "the command line"), environ


def node_agent(world: World, options: Options, environ: dict[str, str]) -> NodeAgent:
    """The node's agent, its signal handlers installed, the subreaper of its ranks."""
    settings = NodeSettings(options.rdzv_timeout, options.heartbeat_timeout, options.master_port)
    secret = load_secret(environ, Path.home())
    environ.pop(SECRET_ENV, None)  # the ranks never see the job's secret
    agent = NodeAgent(world=world, settings=settings, secret=secret, environ=environ)
    agent.signals.install()
    become_subreaper()
    return agent


def topology_at(root: str) -> Topology:
    return read_topology(Path(root))


def world_flags(given: Mapping[str, Any]) -> WorldFlags:
    return WorldFlags(
        source=given.get("world", "auto"),
        nnodes=given.get("nnodes"),
        node_rank=given.get("node_rank"),
        master_addr=given.get("master_addr"),
        master_port=given.get("master_port"),
        job_id=given.get("job_id"),
    )
