"""`python -m agent logs LOG_DIR`: show or follow a job's rank files as `host:rank: ` prefixed lines.

Without --follow, files are printed one after the other in rank order (within a rank: attempt,
then .out before .err), every line prefixed; there is no time order to merge by, as the agent
writes raw bytes. With --follow, the same is printed first, then new lines of every selected file
as they arrive, merged in arrival order (files are polled by size every --interval seconds: no
inotify, which network filesystems lack). Files, and LOG_DIR itself, that do not exist yet are
waited for. A line is printed once complete; a partial line once its file stopped growing for a
second, or at exit. Following ends at Ctrl-C, or by itself when the job writes summary.json, when
nothing new was written to LOG_DIR for --idle-exit seconds, or when no process of the job is left
on this machine (see agent.logs.ending for what can be seen from here).

Hosts come from LOG_DIR/ranks.json ({"ranks": [{"rank", "host", "node"}]}), else summary.json,
else the agent logs' "starting ranks" lines; when none names a rank, its prefix is `rank N: `.
Everything goes to stdout, .err lines too, so pipes and pagers see the tracebacks. The rank files'
lines are printed as they are; what is taken from other files (hosts, summary fields) has its
control characters escaped, and JSON files are read bounded (agent.logs.logdir).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import BinaryIO

from agent.errors import AgentError
from agent.logs.hosts import where_from_agent_logs, where_from_ranks_json, where_from_summary
from agent.logs.selection import (
    STREAMS,
    LogsCommand,
    RankFile,
    Selection,
    Where,
    parse_name,
    prefix,
    split_lines,
    wanted,
)
from agent.plan.rank_set import parse_rank_set
from agent.text import printable
from agent.usage import Parser

__all__ = [  # the CLI, and the pure parts that callers and tests reach as agent.logs.X
    "LogsCommand",
    "RankFile",
    "Selection",
    "Where",
    "build_parser",
    "main",
    "parse",
    "parse_name",
    "prefix",
    "split_lines",
    "wanted",
    "where_from_agent_logs",
    "where_from_ranks_json",
    "where_from_summary",
]


def build_parser() -> Parser:
    parser = Parser(
        prog="python -m agent logs",
        subcommand="logs",
        description="Show or follow the per-rank log files of a running or finished job.",
        epilog="Without --follow: one rank after the other, in rank order. With --follow: then "
        "new lines of all selected files as they arrive, until Ctrl-C, the job's summary.json, "
        "--idle-exit seconds without a new byte in LOG_DIR, or no process of the job left on "
        "this machine.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "log_dir",
        metavar="LOG_DIR",
        help="the job's --log-dir (default logs/ID), or its id (8.0, 8.0.r3: as agent history "
        "lists it)",
    )
    parser.add_argument("--rank", help="ranks to show, e.g. 0,3-5 (default: all)")
    parser.add_argument(
        "--node", help="only ranks of these nodes, e.g. 0,2 (needs ranks.json or summary.json)"
    )
    parser.add_argument(
        "--stream",
        choices=tuple(STREAMS),
        default="both",
        help="stdout, stderr or both files (default: both)",
    )
    parser.add_argument(
        "--grep", metavar="RE", help="only lines matching this Python regular expression"
    )
    parser.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new lines as they arrive"
    )
    parser.add_argument(
        "--attempt",
        default="latest",
        metavar="K|all",
        help="which restart's files (default: the latest)",
    )
    parser.add_argument(
        "-n",
        "--lines",
        type=int,
        metavar="N",
        help="start with the last N lines of each file (default: all)",
    )
    parser.add_argument(
        "--summary", action="store_true", help="pretty-print summary.json, root cause first"
    )
    parser.add_argument(
        "--timeline",
        metavar="FILE.svg",
        help="draw the finished job (summary.json) as an SVG picture into FILE.svg",
    )
    parser.add_argument(
        "--no-prefix", dest="prefix", action="store_false", help="print lines without `host:rank: `"
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=0.25,
        metavar="SECONDS",
        help="--follow poll interval (default: 0.25)",
    )
    parser.add_argument(
        "--idle-exit",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="--follow ends after this long without a new byte in any file of LOG_DIR, counted "
        "once LOG_DIR has files; 0: never (default: 600)",
    )
    return parser


def parse(argv: Sequence[str]) -> LogsCommand:
    ns = build_parser().parse_args(list(argv))
    if ns.lines is not None and ns.lines < 0:
        raise AgentError(f"logs --lines {ns.lines}: pass a number of lines, 0 or more")
    if not 0 < ns.interval <= 60:
        raise AgentError(f"logs --interval {ns.interval:g}: pass seconds in (0, 60]")
    if ns.timeline is not None and (ns.follow or ns.summary):
        raise AgentError(
            "logs --timeline draws a finished job: it does not combine with --follow or --summary"
        )
    if not ns.idle_exit >= 0:
        raise AgentError(f"logs --idle-exit {ns.idle_exit:g}: pass seconds, 0 or more (0: never)")
    selection = Selection(
        ranks=parse_rank_set(ns.rank, "--rank"),
        nodes=parse_rank_set(ns.node, "--node"),
        streams=STREAMS[ns.stream],
        attempt=_attempt(ns.attempt),
        grep=_regex(ns.grep),
    )
    return LogsCommand(
        ns.log_dir, selection, ns.follow, ns.summary, ns.prefix, ns.lines, ns.interval,
        ns.idle_exit, ns.timeline,
    )  # fmt: skip


def _attempt(text: str) -> int | str:
    if text in ("all", "latest"):
        return text
    if not text.isdigit():
        raise AgentError(
            f"logs --attempt {text!r}: pass a restart number (0 is the first run), 'all' or 'latest'"
        )
    return int(text)


def _regex(text: str | None) -> re.Pattern[str] | None:
    if text is None:
        return None
    try:
        return re.compile(text)
    except re.error as exc:
        raise AgentError(f"logs --grep {text!r} is not a regular expression: {exc}") from None


def main(argv: Sequence[str], out: BinaryIO | None = None, colour: bool | None = None) -> int:
    try:
        command = parse(argv)
        from agent.history import log_dir_of

        command = replace(command, log_dir=log_dir_of(command.log_dir, os.environ))
        sink = out if out is not None else sys.stdout.buffer
        if colour is None:
            colour = sys.stdout.isatty() and "NO_COLOR" not in os.environ
        if command.timeline:
            from agent.logs.picture import write_timeline

            sink.write(write_timeline(command.log_dir, command.timeline).encode() + b"\n")
            return 0
        if command.summary:
            from agent.logs.summary_view import show_summary

            return show_summary(command, sink, colour)
        from agent.logs.follow import Tail

        return Tail(command, sink, colour).run()
    except AgentError as exc:
        print(f"agent: error: {printable(exc.message)}", file=sys.stderr)
        return int(exc.code)
    except BrokenPipeError:
        # The reader went away (`| head`): done. Point stdout at /dev/null so that the final
        # flush at interpreter exit does not raise again.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
