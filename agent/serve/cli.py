"""`python -m agent serve|run|status|down` command lines (pure, torch-free).

`serve` takes what a node needs before any run exists (world, rendezvous, --preload, --cold);
`run` takes what the one-shot command takes for one run. A client parses `run` itself (for
--help and one-line errors before anything is sent); node 0 parses the same argv again.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.launch.cli import Command, add_option_flags, add_script_arguments, parse
from agent.plan.log_dir import LogDir
from agent.plan.options import OPTIONS, OptionScope
from agent.usage import Parser

# The resident agents' own options (fixed when they start: the option table's NODE scope) and a
# run's (RUN); BOTH are taken by either.
SERVE_OPTIONS = tuple(o for o in OPTIONS if o.scope is not OptionScope.RUN)
RUN_OPTIONS = tuple(o for o in OPTIONS if o.scope is not OptionScope.NODE)
_CLIENT_HELP = (
    "the connection file of the resident agents (default: SLURM_JOB_ID's, else the only one in "
    "the state dir)"
)
_SERVE_EPILOG = """\
Inside an allocation:
  srun --ntasks-per-node=1 python -m agent serve &     one resident agent per node
  python -m agent run [OPTIONS] train.py a.yml          a run on them (warm ranks)
  python -m agent status                                nodes, warm or not, the current run
  python -m agent down                                  stop the resident agents
Without a scheduler: `python -m agent serve &`, then the same clients (they find the state
dir's only connection file; with several, pass --serve FILE)."""


@dataclass(frozen=True)
class ServeCommand:
    options: dict[str, Any]  # only the flags given


@dataclass(frozen=True)
class ClientCommand:
    action: str  # run | status | down
    serve_file: str | None
    argv: tuple[str, ...] = ()  # run: its arguments as given; node 0 parses them again
    run: Command | None = None
    log_dir: str | None = None  # stacks: the LOG_DIR given
    attach: bool = False  # run: open a pdb session with the first paused rank


def serve_parser() -> Parser:
    parser = Parser(
        prog="python -m agent serve",
        subcommand="serve",
        description="Resident agents: one per node, waiting for runs from `python -m agent run`.",
        epilog=_SERVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add_option_flags(parser, list(SERVE_OPTIONS))
    return parser


def run_parser() -> Parser:
    parser = Parser(
        prog="python -m agent run",
        subcommand="run",
        description="Run a job on the resident agents of this allocation (`agent serve`).",
        epilog=_SERVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--serve", metavar="FILE", help=_CLIENT_HELP)
    parser.add_argument(
        "--attach",
        action="store_true",
        help="open a pdb session with the run's first paused rank at once (breakpoint(), "
        "--pdb), in this terminal; the run's output waits until you detach",
    )
    add_option_flags(parser, list(RUN_OPTIONS))
    add_script_arguments(parser)
    return parser


def parse_serve(argv: Sequence[str]) -> ServeCommand:
    ns = serve_parser().parse_args(list(argv))
    names = [o.name for o in SERVE_OPTIONS]
    return ServeCommand({n: getattr(ns, n) for n in names if getattr(ns, n) is not None})


def parse_run(argv: Sequence[str]) -> Command:
    """A run's argv (no --serve) → the one-shot Command; node 0 calls this for every run."""
    return parse(argv, run_parser())


def parse_client(action: str, argv: Sequence[str]) -> ClientCommand:
    if action == "stacks":
        return _parse_stacks(argv)
    if action == "top":
        return _parse_top(argv)
    if action != "run":
        parser = Parser(
            prog=f"python -m agent {action}",
            subcommand=action,
            description={
                "status": "Nodes, hosts, warm or not, and the current run of the resident agents.",
                "down": "Stop the resident agents of this allocation (and any run they execute).",
            }[action],
            allow_abbrev=False,
        )
        parser.add_argument("--serve", metavar="FILE", help=_CLIENT_HELP)
        return ClientCommand(action, parser.parse_args(list(argv)).serve)
    ns = run_parser().parse_args(list(argv))
    return ClientCommand("run", ns.serve, tuple(argv), parse_run(argv), attach=ns.attach)


def _parse_stacks(argv: Sequence[str]) -> ClientCommand:
    parser = Parser(
        prog="python -m agent stacks",
        subcommand="stacks",
        description="Every rank's Python stack in a live job, collated: identical stacks grouped, "
        "the odd ones out first. Finds the job from LOG_DIR (control.json) or, inside an "
        "allocation, from SLURM_JOB_ID (resident agents).",
        allow_abbrev=False,
    )
    parser.add_argument(
        "log_dir", nargs="?", metavar="LOG_DIR", help="the job's log dir, or its id (8.0, 8.0.r3)"
    )
    parser.add_argument("--native", action="store_true", help="add C/C++ frames (py-spy --native)")
    parser.add_argument("--ranks", default="all", help="only these ranks, e.g. 0,3-5")
    parser.add_argument("--serve", metavar="FILE", help=_CLIENT_HELP)
    ns = parser.parse_args(list(argv))
    from agent.plan.rank_set import parse_rank_set

    parse_rank_set(ns.ranks, "--ranks")  # a bad list is refused here, before any connection
    serve_file = ns.serve
    if ns.log_dir is not None and serve_file is None:
        serve_file = LogDir(ns.log_dir).control
    argv_out = ("--native",) if ns.native else ()
    return ClientCommand("stacks", serve_file, (*argv_out, "--ranks", ns.ranks), None, ns.log_dir)


def _parse_top(argv: Sequence[str]) -> ClientCommand:
    parser = Parser(
        prog="python -m agent top",
        subcommand="top",
        description="Every rank of a live job, one row each (host, state, pid, cpu %, rss, "
        "seconds silent; steps with --progress-regex), redrawn every second until the job ends "
        "or Ctrl-C. Finds the job from LOG_DIR (control.json) or, inside an allocation, from "
        "SLURM_JOB_ID (resident agents).",
        allow_abbrev=False,
    )
    parser.add_argument(
        "log_dir", nargs="?", metavar="LOG_DIR", help="the job's log dir, or its id (8.0, 8.0.r3)"
    )
    parser.add_argument("--once", action="store_true", help="print the table once, plain, and exit")
    parser.add_argument("--serve", metavar="FILE", help=_CLIENT_HELP)
    ns = parser.parse_args(list(argv))
    serve_file = ns.serve
    if ns.log_dir is not None and serve_file is None:
        serve_file = LogDir(ns.log_dir).control
    return ClientCommand("top", serve_file, ("--once",) if ns.once else (), None, ns.log_dir)
