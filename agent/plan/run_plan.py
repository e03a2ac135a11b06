"""What will run: the one plan value node 0 decides and every agent executes (and --dry-run prints).

Node 0 reads the configs once, resolves the options once (command line > `launcher:` section >
defaults), runs the config parser and fixes the world shape; the plan travels as JSON in the
broadcast, so no other node resolves anything again. Each node then derives its own ranks from
the plan and its own topology (`rank_specs`), once per attempt.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from agent.errors import AgentError, ExitCode
from agent.plan import checks
from agent.plan import config as cfg
from agent.plan.layout import NodeLayout, layout, shape_of
from agent.plan.options import Options, resolve
from agent.plan.parsers import load_parser, run_parser
from agent.plan.payload import Payload
from agent.plan.rank_set import parse_rank_set
from agent.plan.ranks import Launch, RankSpec, node_ranks, script_command
from agent.plan.roster import Roster, active_world, seated
from agent.plan.run_id import local_job, run_id
from agent.plan.topology import Topology
from agent.world import World


@dataclass(frozen=True)
class Request:
    """What the user asked for: the command line (or a client's request) before node 0 decides."""

    script: str
    configs: tuple[str, ...] = ()
    script_args: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    given: Mapping[str, Any] | None = None  # options given on the command line, by name
    cwd: str | None = (
        None  # a client's working directory: paths are relative to it, ranks start there
    )
    env: Mapping[str, str] | None = None  # a client's exported variables, for every rank
    run: int | None = None  # a resident agents' run number (None: the one-shot job)


@dataclass(frozen=True)
class RunPlan:
    """A run as node 0 decided it: every agent acts on this same value."""

    script: str
    script_args: tuple[str, ...]
    configs: tuple[str, ...]
    options: Options  # resolved once, on node 0
    payload: Payload
    log_dir: str  # absolute
    world_size: int
    nnodes: int
    nproc_per_node: int
    cwd: str | None = None  # where ranks start (None: where the agent started)
    env: Mapping[str, str] | None = None  # added to every rank's environment (a client's)
    run_id: str = ""  # the job's or run's id (agent.plan.run_id); logs/<run_id> by default

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["payload"] = self.payload.to_json()
        data["env"] = dict(self.env or {})
        return data

    @classmethod
    def from_json(cls, data: Any) -> RunPlan:
        try:
            return cls(
                script=str(data["script"]),
                script_args=tuple(str(a) for a in data["script_args"]),
                configs=tuple(str(c) for c in data["configs"]),
                options=Options(**data["options"]),
                payload=Payload.from_json(data["payload"]),
                log_dir=str(data["log_dir"]),
                world_size=int(data["world_size"]),
                nnodes=int(data["nnodes"]),
                nproc_per_node=int(data["nproc_per_node"]),
                cwd=None if data.get("cwd") is None else str(data["cwd"]),
                env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
                run_id=str(data.get("run_id") or ""),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise AgentError(
                f"node 0's run plan has an unexpected shape ({exc}); are all nodes running the "
                "same launch-agent version?",
                ExitCode.REFUSED,
            ) from None


def decide(
    request: Request,
    world: World,
    read_topology: Callable[[str], Topology],
    nodes: int | None = None,
) -> RunPlan:
    """Node 0 only: read the configs once, resolve options, check, run the config parser —
    for the agents less the spares, or (`nodes`) for the world left after exclusions."""
    given = {k: v for k, v in (request.given or {}).items() if v is not None}
    limit = resolve(given, {}, "the command line").max_config_bytes  # a flag: before configs
    cwd = request.cwd
    configs = tuple(_under(cwd, c) for c in request.configs)
    merged = cfg.load_merged(configs, request.overrides, max_bytes=limit)
    launcher, _ = cfg.split_launcher(merged)
    options = resolve(given, launcher, " + ".join(request.configs) or "configs")
    checks.check_script(request.script, options, cwd)
    world = active_world(world, options, nodes)
    topology = read_topology(options.sysfs_root)
    lay = layout(world, options, topology)
    shape = shape_of(world, lay)
    with cfg.size_limit(limit):  # the config parser reads the configs again
        payload = run_parser(load_parser(options.config_parser), configs, request.overrides, shape)
    job = world.job_id or local_job(time.time(), os.getpid())
    name = run_id(job, world.step_id, request.run)
    log_dir = _under(cwd, options.log_dir or os.path.join("logs", name))
    checks.check_log_dir(log_dir)
    return RunPlan(
        script=request.script,
        script_args=tuple(request.script_args),
        configs=configs,
        options=options,
        payload=payload,
        log_dir=os.path.abspath(log_dir),
        world_size=lay.world_size,
        nnodes=world.nnodes,
        nproc_per_node=lay.nproc_per_node,
        cwd=cwd,
        env=dict(request.env or {}),
        run_id=name,
    )


def _under(cwd: str | None, path: str) -> str:
    return os.path.join(cwd, path) if cwd else path


def node_layout(plan: RunPlan, world: World, topology: Topology) -> NodeLayout:
    """This node's share of the plan; refused when it disagrees with node 0's shape."""
    lay = layout(world, plan.options, topology)
    if world.task is None and lay.nproc_per_node != plan.nproc_per_node:
        raise AgentError(
            f"{world.host} would start {lay.nproc_per_node} ranks but node 0 planned "
            f"{plan.nproc_per_node} per node; give every node the same GPUs, or pass --nproc-per-node"
        )
    return lay


def seat_specs(
    plan: RunPlan,
    world: World,
    roster: Roster,
    topology: Topology,
    *,
    attempt: int,
    port: int,
    config_file: str,
    environ: Mapping[str, str],
    agent_store: bool | None = None,
) -> tuple[RankSpec, ...]:
    """The ranks this agent (`world.agent_index`) starts in one attempt, seated where the
    roster puts it; none for a spare or an excluded agent. The agents and `--dry-run` both
    print/spawn exactly this. `agent_store`: whether the ranks join the agent's store at
    `port` (rank_specs)."""
    if roster.role(world.agent_index) != "node":
        return ()
    here = seated(world, roster)
    lay = node_layout(plan, here, topology)
    return rank_specs(
        plan, here, lay, attempt=attempt, port=port, config_file=config_file, environ=environ,
        agent_store=agent_store,
    )  # fmt: skip


def rank_specs(
    plan: RunPlan,
    world: World,
    lay: NodeLayout,
    *,
    attempt: int,
    port: int,
    config_file: str,
    environ: Mapping[str, str],
    agent_store: bool | None = None,
) -> tuple[RankSpec, ...]:
    """Every rank this node runs in one attempt: argv, env, placement, log files.
    `agent_store`: the ranks join the agent's store at `port` (None: where several agents
    share one, as a one-agent job's rank 0 hosts its own unless its agent says otherwise)."""
    o = plan.options
    command, script_at = script_command(
        plan.script, plan.script_args, plan.payload.argv, module=o.module, no_python=o.no_python
    )
    launch = Launch(
        job_id=world.job_id,
        step_id=world.step_id,
        world_size=plan.world_size,
        nnodes=world.nnodes,
        master_addr=world.master_addr,
        master_port=port,
        attempt=attempt,
        max_restarts=o.max_restarts,
        log_dir=plan.log_dir,
        config_file=config_file,
        command=command,
        script_at=script_at,
        extra_env=plan.payload.env,
        deepspeed=o.deepspeed,
        rank_prefix=o.rank_prefix,
        prefix_ranks=parse_rank_set(o.rank_prefix_ranks, "--rank-prefix-ranks"),
        agent_store=world.agents > 1 if agent_store is None else agent_store,
        pdb_timeout=o.debug_timeout if o.pdb else None,
        flight_recorder=o.flight_recorder,
    )
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
