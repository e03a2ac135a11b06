"""`python -m agent SCRIPT ...`: parse the world and options, let node 0 decide, then act."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent import setup, signing
from agent.cli import Command
from agent.dryrun import print_plan
from agent.job import decide
from agent.node import NodeAgent
from agent.options import resolve
from agent.topology import read_topology
from agent.world import WorldFlags, world_from_env


def launch(command: Command, environ: Mapping[str, str]) -> int:
    environ = dict(environ)  # the ranks' base env: a snapshot, untouched by what follows
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # the agent's own c10d chatter only
    given = {k: v for k, v in command.options.items() if v is not None}
    world = world_from_env(environ, _flags(given), hostname=socket.gethostname())
    for handler in logging.getLogger().handlers:  # name the node, not the pid, in every message
        handler.setFormatter(logging.Formatter(f"[agent {world.host}] %(message)s"))
    options = resolve(given, {}, "the command line")
    setup.check_script(command.script, options)
    secret = b"" if command.dry_run else signing.load_secret(environ, Path.home())
    topology = read_topology(Path(options.sysfs_root))
    if world.agent_index == 0 or command.dry_run:
        job, options = decide(command, world, options, given, environ, topology)
    else:
        job = None
    if command.dry_run:
        return print_plan(command, world, options, job, environ, topology)
    return NodeAgent(command, world, options, given, environ, topology, secret).run(job)


def _flags(given: Mapping[str, Any]) -> WorldFlags:
    return WorldFlags(
        source=given.get("world", "auto"),
        nnodes=given.get("nnodes"),
        node_rank=given.get("node_rank"),
        master_addr=given.get("master_addr"),
        master_port=given.get("master_port"),
    )
