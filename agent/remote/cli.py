"""`python -m agent exec` command line → ExecCommand (pure)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from agent.errors import AgentError
from agent.usage import Parser
from agent.world import SOURCES, WorldFlags


@dataclass(frozen=True)
class ExecCommand:
    flags: WorldFlags
    rdzv_timeout: float
    timeout: float | None
    argv: tuple[str, ...]


def build_parser() -> Parser:
    parser = Parser(
        prog="python -m agent exec",
        subcommand="exec",
        description="Run CMD once on every node of the job step; node 0 prints the outputs "
        "collated like `pdsh CMD | dshbak -c`. Run it as `srun --ntasks-per-node=1 python -m "
        "agent exec -- CMD`.",
        epilog="Exit status on node 0: 0 every command succeeded, 1 a command failed, 2 bad "
        "input, 3 a node never reported, 4 a forged result, 128+N interrupted by signal N. "
        "Other nodes exit with their own command's status (124: timed out).",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--world",
        choices=SOURCES,
        default="auto",
        help="where the node list comes from (default: auto)",
    )
    parser.add_argument("--nnodes", type=int, help="number of nodes (explicit world)")
    parser.add_argument("--node-rank", type=int, help="this node's index (explicit world)")
    parser.add_argument("--master-addr", help="node 0's address (explicit world)")
    parser.add_argument(
        "--master-port",
        type=int,
        help="the exec store's port on node 0 (default: derived, see the module doc)",
    )
    parser.add_argument(
        "--rdzv-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long to wait for every node to join (default: 300)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="kill CMD after this long on each node (default: none)",
    )
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- CMD ...",
        help="the command and its arguments",
    )
    return parser


def parse(argv: Sequence[str]) -> ExecCommand:
    ns = build_parser().parse_args(list(argv))
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not command:
        raise AgentError("exec needs a command: python -m agent exec [OPTIONS] -- CMD [ARGS...]")
    for flag, value in (("--rdzv-timeout", ns.rdzv_timeout), ("--timeout", ns.timeout)):
        if value is not None and value <= 0:
            raise AgentError(f"exec {flag}={value:g}: pass a number of seconds above 0")
    flags = WorldFlags(ns.world, ns.nnodes, ns.node_rank, ns.master_addr, ns.master_port)
    return ExecCommand(flags, ns.rdzv_timeout, ns.timeout, tuple(command))
