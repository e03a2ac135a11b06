"""`python -m agent [OPTIONS] SCRIPT [CONFIG.yml ...] [ARGS...] [-- ARGS...]` → Command (pure)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.plan.options import OPTIONS, Option
from agent.usage import Parser, VersionAction

USAGE = "%(prog)s [OPTIONS] SCRIPT [CONFIG.yml ...] [ARGS ...] [-- ARGS ...]"

_EPILOG = """\
After SCRIPT, arguments ending in .yml/.yaml are configs (read on node 0 only); everything else,
and everything after --, goes to the script verbatim (an option of the agent's there too, with a
warning: put it before SCRIPT). Other commands:
  python -m agent logs LOG_DIR [--rank R] [--follow]   show or follow the rank files of a job
  python -m agent exec -- CMD                           run CMD on every node, output collated
  python -m agent doctor                                GPUs, NUMA, NICs, RoCE GIDs, NCCL hints
  python -m agent serve | run | status | down           resident agents and warm runs (salloc)
  python -m agent stacks [LOG_DIR]                      every rank's stack in a live job
  python -m agent top [LOG_DIR] [--once]                every rank's state, cpu, rss, live
  python -m agent debug [LOG_DIR] [--rank R]           ranks paused in pdb, a session with one
  python -m agent history [ID] [--failed]               this user's past jobs and runs
Exit codes: 0 ok, 1 a rank failed, 2 bad input (nothing started), 3 rendezvous or peer lost,
4 secret mismatch or store tampering, 5 no progress in two attempts (restarts stopped),
128+N the agent got signal N."""


@dataclass(frozen=True)
class Command:
    options: dict[str, Any]  # only the flags given on the command line
    script: str
    configs: tuple[str, ...]
    script_args: tuple[str, ...]
    overrides: tuple[str, ...]
    dry_run: bool
    misplaced: tuple[str, ...] = ()  # the agent's own options found after the script (before --)


def build_parser() -> Parser:
    parser = Parser(
        prog="python -m agent",
        usage=USAGE,
        description="Launch and supervise one node's ranks of a PyTorch job.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add_option_flags(parser, OPTIONS)
    parser.add_argument(
        "--dry-run", action="store_true", help="print the plan for every rank, start nothing"
    )
    parser.add_argument("--version", action=VersionAction)
    add_script_arguments(parser)
    return parser


def usage_text(commands: Sequence[str]) -> str:
    """What `python -m agent` without arguments prints: the ways to call it, the `commands`
    (the subcommands) named, and no argparse internals."""
    prog = "python -m agent"
    return (
        f"usage: {USAGE % {'prog': prog}}\n"
        f"       {prog} {{{','.join(commands)}}} [ARGS ...]\n"
        f"       {prog} --help | --version\n"
    )


def add_option_flags(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    """One flag per option of the table (booleans that default to on get --no-NAME)."""
    for option in options:
        flag = "--" + option.name.replace("_", "-")
        default = f" (default: {option.default})" if option.default not in (None, False) else ""
        if option.kind is bool and option.default is True:
            parser.add_argument(
                "--no-" + flag[2:],
                dest=option.name,
                action="store_const",
                const=False,
                default=None,
                help=f"turn off: {option.help}",
            )
        elif option.kind is bool:
            parser.add_argument(
                flag,
                dest=option.name,
                action="store_const",
                const=True,
                default=None,
                help=option.help,
            )
        else:
            convert: dict[str, Any] = {} if option.kind is str else {"type": option.kind}
            parser.add_argument(
                flag,
                dest=option.name,
                **convert,
                choices=option.choices or None,
                default=None,
                help=option.help + default,
                metavar=option.name.upper() if not option.choices else None,
            )


def add_script_arguments(parser: argparse.ArgumentParser) -> None:
    """-m, --set, the script and what follows it: the same for one-shot and resident runs."""
    parser.add_argument(
        "-m", dest="module", action="store_const", const=True, default=None, help="same as --module"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set optimizer.lr=0.001 (repeatable)",
    )
    parser.add_argument(
        "script", help="the training script (or module with -m, program with --no-python)"
    )
    rest = parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    rest.required = False  # else a missing script is reported as "script, rest"


def parse(argv: Sequence[str], parser: Parser | None = None) -> Command:
    parser = parser or build_parser()
    ns = parser.parse_args(list(argv))
    configs, script_args = split_rest(ns.rest)
    options = {o.name: getattr(ns, o.name) for o in OPTIONS if hasattr(ns, o.name)}
    dry_run = getattr(ns, "dry_run", False)
    misplaced = misplaced_options(ns.rest, own_flags(parser))
    return Command(
        options, ns.script, configs, script_args, tuple(ns.overrides), dry_run, misplaced
    )


def own_flags(parser: Parser) -> frozenset[str]:
    """The long options `parser` takes (one per option of the table, and --dry-run, --set ...):
    the parser's own, so `agent run`'s warning names only what `agent run` takes. --help and
    --version aside: a script's own are the likelier meaning after the script."""
    generic = ("--help", "--version")
    return frozenset(s for s in parser.flags if s.startswith("--") and s not in generic)


def misplaced_options(rest: Sequence[str], flags: frozenset[str]) -> tuple[str, ...]:
    """The agent's own options among the words after the script, up to `--` (after it a word is
    the script's by request): each once, in the order given. `--grace=3` is --grace."""
    found: list[str] = []
    for token in rest:
        if token == "--":
            break
        name = token.partition("=")[0]
        if name in flags and name not in found:
            found.append(name)
    return tuple(found)


def misplaced_warning(command: Command) -> str | None:
    """One line for options that look like the agent's but go to the script, as torchrun
    passes them on too: `--console-ranks after the script goes to train.py; put it before the
    script`; None when there are none."""
    if not command.misplaced:
        return None
    names = ", ".join(command.misplaced)
    one = len(command.misplaced) == 1
    return (
        f"{names} after the script {'goes' if one else 'go'} to {command.script}; put "
        f"{'it' if one else 'them'} before the script (or after --, to pass "
        f"{'it' if one else 'them'} on without this warning)"
    )


def split_rest(rest: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    configs: list[str] = []
    args: list[str] = []
    for i, token in enumerate(rest):
        if token == "--":
            args += rest[i + 1 :]
            break
        (configs if token.endswith((".yml", ".yaml")) else args).append(token)
    return tuple(configs), tuple(args)
