"""The agent's options: one table drives the CLI flags and the configs' `launcher:` section."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from agent.errors import AgentError


@dataclass(frozen=True)
class Option:
    name: str  # launcher key; the flag is --name-with-dashes
    kind: type  # int | float | str | bool
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    in_config: bool = True  # False: every node needs it before node 0's configs arrive


OPTIONS: tuple[Option, ...] = (
    Option(
        "nproc_per_node",
        str,
        "auto",
        "ranks per node: N, 'gpu' (one per visible GPU, error if none) or 'auto' (GPUs, else 1)",
    ),
    Option(
        "log_dir",
        str,
        None,
        "where rank files, agent logs and summary.json go (default logs/<job-id>)",
    ),
    Option(
        "console_ranks",
        str,
        "all",
        "ranks shown on the console: 'all', 'none' or a list like 0,3-5 (files always get every rank)",
    ),
    Option("grace", float, 5.0, "seconds between SIGTERM and SIGKILL at teardown"),
    Option(
        "max_restarts", int, 0, "restart the whole world together up to K times after a failure"
    ),
    Option(
        "numa_binding",
        str,
        "auto",
        "bind each rank's CPUs and memory: auto, off, node, socket, exclusive",
        ("auto", "off", "node", "socket", "exclusive"),
    ),
    Option("numa_strict", bool, False, "strict memory binding (membind) instead of preferred"),
    Option(
        "config_parser",
        str,
        "default",
        "how configs become the payload: default, savanna, or module:function",
    ),
    Option(
        "deepspeed", bool, False, "pass --local_rank=N to the script, as DeepSpeed's launcher does"
    ),
    Option("no_python", bool, False, "run the script as a program, not with python"),
    Option("module", bool, False, "the script is a module name: run it like python -m"),
    Option(
        "rank_prefix",
        str,
        None,
        "command prefix per rank, e.g. 'nsys profile -o out-{rank}' ({rank}, {local_rank}, {node})",
    ),
    Option(
        "rank_prefix_ranks", str, "all", "which ranks get --rank-prefix: 'all' or a list like 0,8"
    ),
    Option("hang_warning", float, 300.0, "warn when a rank prints nothing for this many seconds"),
    Option("live", bool, True, "on a terminal, a live per-rank status table above the log lines"),
    Option(
        "sysfs_root",
        str,
        "/",
        "where sys/ is read from for GPU/NUMA topology (a host sysfs mounted elsewhere, or a fake tree in tests)",
    ),
    Option(
        "world",
        str,
        "auto",
        "where the world comes from",
        ("auto", "slurm", "slurm-task", "k8s", "mpi", "mpi-task", "explicit", "local"),
        False,
    ),
    Option(
        "nnodes",
        int,
        None,
        "number of nodes (explicit world, e.g. ssh/tmux launches)",
        in_config=False,
    ),
    Option("node_rank", int, None, "this node's rank (explicit world)", in_config=False),
    Option("master_addr", str, None, "node 0's address (explicit world, OpenMPI)", in_config=False),
    Option(
        "master_port",
        int,
        None,
        "the job store's port on node 0 (default: derived from job and step id)",
        in_config=False,
    ),
    Option(
        "job_id",
        str,
        None,
        "this job's identity where the scheduler gives none (explicit, k8s, mpi, local): every agent of the job passes the same; two jobs on one master stay apart (store keys and derived port)",
        in_config=False,
    ),
    Option(
        "rdzv_timeout", float, 300.0, "seconds to wait for every node to arrive", in_config=False
    ),
    Option(
        "heartbeat_timeout", float, 6.0, "a node silent this long is declared lost", in_config=False
    ),
)
_BY_NAME = {o.name: o for o in OPTIONS}


@dataclass(frozen=True)
class Options:
    nproc_per_node: str = "auto"
    log_dir: str | None = None
    console_ranks: str = "all"
    grace: float = 5.0
    max_restarts: int = 0
    numa_binding: str = "auto"
    numa_strict: bool = False
    config_parser: str = "default"
    deepspeed: bool = False
    no_python: bool = False
    module: bool = False
    rank_prefix: str | None = None
    rank_prefix_ranks: str = "all"
    hang_warning: float = 300.0
    sysfs_root: str = "/"
    live: bool = True
    world: str = "auto"
    nnodes: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    job_id: str | None = None
    rdzv_timeout: float = 300.0
    heartbeat_timeout: float = 6.0


assert {f.name for f in fields(Options)} == set(_BY_NAME), "OPTIONS and Options disagree"


def resolve(cli: Mapping[str, Any], launcher: Mapping[str, Any], where: str = "configs") -> Options:
    """CLI (values given) > the configs' `launcher:` section > defaults; everything validated."""
    values: dict[str, Any] = {}
    for key, value in launcher.items():
        option = _BY_NAME.get(key)
        if option is None:
            valid = ", ".join(o.name for o in OPTIONS if o.in_config)
            raise AgentError(f"unknown launcher key {key!r} in {where}; valid keys: {valid}")
        if not option.in_config:
            raise AgentError(
                f"launcher key {key!r} in {where} cannot come from a config: every node needs it "
                f"before node 0's configs arrive; pass --{key.replace('_', '-')} instead"
            )
        values[key] = _typed(option, value, f"launcher key {key} in {where}")
    for key, value in cli.items():
        if value is not None:
            values[key] = _typed(_BY_NAME[key], value, f"--{key.replace('_', '-')}")
    options = replace(Options(), **values)
    _check(options)
    return options


def _typed(option: Option, value: Any, what: str) -> Any:
    if option.name == "nproc_per_node":
        text = str(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else None
        if text is None or not (text in ("auto", "gpu") or text.lstrip("-").isdigit()):
            raise AgentError(f"{what}: expected a number of ranks, 'gpu' or 'auto', got {value!r}")
        return text
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
    }[option.kind]
    if not ok:
        expected = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[
            option.kind
        ]
        raise AgentError(f"{what}: expected {expected}, got {value!r}")
    if option.choices and value not in option.choices:
        raise AgentError(f"{what}: {value!r} is not one of {', '.join(option.choices)}")
    return float(value) if option.kind is float else value


def _check(o: Options) -> None:
    if o.nproc_per_node.lstrip("-").isdigit() and int(o.nproc_per_node) < 1:
        raise AgentError(f"--nproc-per-node {o.nproc_per_node}: needs at least 1 rank per node")
    if o.master_port is not None and not 1 <= o.master_port <= 65535:
        raise AgentError(f"--master-port {o.master_port}: a port is between 1 and 65535")
    for name in ("grace", "rdzv_timeout", "heartbeat_timeout", "hang_warning"):
        if getattr(o, name) < 0:
            raise AgentError(
                f"--{name.replace('_', '-')} {getattr(o, name):g}: must not be negative"
            )
    if o.max_restarts < 0:
        raise AgentError(f"--max-restarts {o.max_restarts}: must not be negative")
    from agent.plan.ranks import parse_rank_set

    parse_rank_set(o.console_ranks, "--console-ranks")
    parse_rank_set(o.rank_prefix_ranks, "--rank-prefix-ranks")
    if o.module and o.no_python:
        raise AgentError("--module and --no-python exclude each other: pick one")
