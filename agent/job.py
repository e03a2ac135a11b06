"""The job as node 0 decides it (configs, options, shape) and the rank specs each node derives."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent import config as cfg
from agent import setup
from agent.errors import AgentError
from agent.options import Options, resolve
from agent.parsers import load_parser, run_parser
from agent.payload import Payload
from agent.plan import Launch, RankSpec, node_ranks, parse_rank_set


@dataclass(frozen=True)
class Job:
    """What node 0 decided and broadcast; every agent acts on the same one."""

    launcher: Mapping[str, Any]
    payload: Payload
    log_dir: str
    world_size: int
    nproc_per_node: int


def decide(command, world, options, given, environ, topology) -> tuple[Job, Options]:
    """Node 0 only: read the configs once, resolve options, run the config parser."""
    merged = cfg.load_merged(command.configs, command.overrides) if command.configs else {}
    launcher, _ = cfg.split_launcher(merged)
    options = resolve(given, launcher, " + ".join(command.configs) or "configs")
    lay = setup.layout(world, options, environ, topology)
    shape = setup.shape_of(world, lay)
    payload = run_parser(
        load_parser(options.config_parser), command.configs, command.overrides, shape
    )
    log_dir = options.log_dir or setup.default_log_dir(world)
    setup.check_log_dir(log_dir)
    return Job(dict(launcher), payload, log_dir, lay.world_size, lay.nproc_per_node), options


def launch_spec(
    command, world, options, job: Job, attempt: int, port: int, config_file: str
) -> Launch:
    cmd, script_at = setup.script_command(
        command.script, command.script_args, job.payload.argv, options
    )
    return Launch(
        job_id=world.job_id,
        step_id=world.step_id,
        world_size=job.world_size,
        nnodes=world.nnodes,
        master_addr=world.master_addr,
        master_port=port,
        attempt=attempt,
        max_restarts=options.max_restarts,
        log_dir=os.path.abspath(job.log_dir),
        config_file=config_file,
        command=cmd,
        script_at=script_at,
        extra_env=job.payload.env,
        deepspeed=options.deepspeed,
        rank_prefix=options.rank_prefix,
        prefix_ranks=parse_rank_set(options.rank_prefix_ranks, "--rank-prefix-ranks"),
        agent_store=world.agents > 1,
    )


def rank_specs(
    command, world, options, job, environ, topology, attempt, port, config_file
) -> tuple[RankSpec, ...]:
    lay = setup.layout(world, options, environ, topology)
    if world.task is None and lay.nproc_per_node != job.nproc_per_node:
        raise AgentError(
            f"{world.host} would start {lay.nproc_per_node} ranks but node 0 planned {job.nproc_per_node} per node; "
            "give every node the same GPUs, or pass --nproc-per-node"
        )
    launch = launch_spec(command, world, options, job, attempt, port, config_file)
    return node_ranks(
        launch,
        world.node_rank,
        world.host,
        lay.first_rank,
        lay.local_ranks,
        lay.local_world_size,
        lay.placements,
        environ,
    )
