"""`python -m agent logs LOG_DIR`: show or follow a job's rank files as `host:rank: ` prefixed lines.

Without --follow, files are printed one after the other in rank order (within a rank: attempt,
then .out before .err), every line prefixed; there is no time order to merge by, as the agent
writes raw bytes. With --follow, the same is printed first, then new lines of every selected file
as they arrive, merged in arrival order (files are polled by size every --interval seconds: no
inotify, which network filesystems lack). Files, and LOG_DIR itself, that do not exist yet are
waited for. A line is printed once complete; a partial line once its file stopped growing for a
second, or at exit. Following ends at Ctrl-C, or by itself when the job writes summary.json.

Hosts come from LOG_DIR/ranks.json ({"ranks": [{"rank", "host", "node"}]}), else summary.json,
else the agent logs' "starting ranks" lines; when none names a rank, its prefix is `rank N: `.
Everything goes to stdout, .err lines too, so pipes and pagers see the tracebacks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

from agent.errors import AgentError
from agent.logs import PALETTE
from agent.plan import parse_rank_set

RANK_FILE = re.compile(r"rank-(\d+)(?:\.r(\d+))?\.(out|err)")
AGENT_LOG = re.compile(r"agent-\d+\.log")
_STARTING = re.compile(rb"attempt \d+: starting ranks (\d+)(?:-(\d+))? on (\S+)")
STREAMS = {"out": ("out",), "err": ("err",), "both": ("out", "err")}
_MAX_PARTIAL = 1 << 16  # a line longer than this is shown in pieces


@dataclass(frozen=True)
class RankFile:
    """One rank file: rank-00003.r1.err is rank 3, attempt 1, stream err."""

    rank: int
    attempt: int
    stream: str
    name: str

    @property
    def order(self) -> tuple[int, int, int]:
        return self.rank, self.attempt, 0 if self.stream == "out" else 1


@dataclass(frozen=True)
class Where:
    """Where a rank ran; node None when only the host is known."""

    host: str
    node: int | None


@dataclass(frozen=True)
class Selection:
    ranks: frozenset[int] | None  # None: every rank
    nodes: frozenset[int] | None  # None: every node
    streams: tuple[str, ...]
    attempt: int | str  # K, "all", or "latest" (following: the latest at start and later ones)
    grep: re.Pattern[str] | None


@dataclass(frozen=True)
class LogsCommand:
    log_dir: str
    selection: Selection
    follow: bool
    summary: bool
    prefix: bool
    lines: int | None  # only the last N lines of what exists at start; None: everything
    interval: float


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, no usage dump
        raise AgentError(f"logs: {message} (see python -m agent logs --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m agent logs",
        description="Show or follow the per-rank log files of a running or finished job.",
        epilog="Without --follow: one rank after the other, in rank order. With --follow: then "
        "new lines of all selected files as they arrive, until Ctrl-C or the job's end.",
        allow_abbrev=False,
    )
    parser.add_argument("log_dir", metavar="LOG_DIR", help="the job's --log-dir (default logs/<job-id>)")
    parser.add_argument("--rank", help="ranks to show, e.g. 0,3-5 (default: all)")
    parser.add_argument("--node", help="only ranks of these nodes, e.g. 0,2 (needs ranks.json or summary.json)")
    parser.add_argument("--stream", choices=tuple(STREAMS), default="both", help="stdout, stderr or both files (default: both)")
    parser.add_argument("--grep", metavar="RE", help="only lines matching this Python regular expression")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing new lines as they arrive")
    parser.add_argument("--attempt", default="latest", metavar="K|all", help="which restart's files (default: the latest)")
    parser.add_argument("-n", "--lines", type=int, metavar="N", help="start with the last N lines of each file (default: all)")
    parser.add_argument("--summary", action="store_true", help="pretty-print summary.json, root cause first")
    parser.add_argument("--no-prefix", dest="prefix", action="store_false", help="print lines without `host:rank: `")
    parser.add_argument("--interval", type=float, default=0.25, metavar="SECONDS", help="--follow poll interval (default: 0.25)")
    return parser


def parse(argv: Sequence[str]) -> LogsCommand:
    ns = build_parser().parse_args(list(argv))
    if ns.lines is not None and ns.lines < 0:
        raise AgentError(f"logs --lines {ns.lines}: pass a number of lines, 0 or more")
    if not 0 < ns.interval <= 60:
        raise AgentError(f"logs --interval {ns.interval:g}: pass seconds in (0, 60]")
    selection = Selection(
        ranks=parse_rank_set(ns.rank, "--rank"),
        nodes=parse_rank_set(ns.node, "--node"),
        streams=STREAMS[ns.stream],
        attempt=_attempt(ns.attempt),
        grep=_regex(ns.grep),
    )
    return LogsCommand(ns.log_dir, selection, ns.follow, ns.summary, ns.prefix, ns.lines, ns.interval)


def _attempt(text: str) -> int | str:
    if text in ("all", "latest"):
        return text
    if not text.isdigit():
        raise AgentError(f"logs --attempt {text!r}: pass a restart number (0 is the first run), 'all' or 'latest'")
    return int(text)


def _regex(text: str | None) -> re.Pattern[str] | None:
    if text is None:
        return None
    try:
        return re.compile(text)
    except re.error as exc:
        raise AgentError(f"logs --grep {text!r} is not a regular expression: {exc}") from None


# --- pure: names, selection, hosts, lines --------------------------------------------------


def parse_name(name: str) -> RankFile | None:
    match = RANK_FILE.fullmatch(name)
    if match is None:
        return None
    rank, attempt, stream = match.groups()
    return RankFile(int(rank), int(attempt or 0), stream, name)


def latest_attempt(files: Iterable[RankFile]) -> int:
    return max((f.attempt for f in files), default=0)


def wanted(file: RankFile, selection: Selection, where: Mapping[int, Where], latest: int, following: bool) -> bool | None:
    """Whether to show the file; None while --node is asked and the rank's node is not known yet."""
    if file.stream not in selection.streams:
        return False
    if selection.ranks is not None and file.rank not in selection.ranks:
        return False
    if not _attempt_matches(file.attempt, selection.attempt, latest, following):
        return False
    if selection.nodes is None:
        return True
    place = where.get(file.rank)
    if place is None or place.node is None:
        return None
    return place.node in selection.nodes


def _attempt_matches(attempt: int, wanted_attempt: int | str, latest: int, following: bool) -> bool:
    if wanted_attempt == "all":
        return True
    if wanted_attempt == "latest":
        # Following, a restart's files appear later: they are the new latest, so show them too.
        return attempt >= latest if following else attempt == latest
    return attempt == wanted_attempt


def prefix(file: RankFile, where: Mapping[int, Where], colour: bool) -> bytes:
    """b"n1:3: ", b"n1:3.r1: " for a restart, b"rank 3: " when the host is not known."""
    place = where.get(file.rank)
    name = f"{place.host}:{file.rank}" if place else f"rank {file.rank}"
    text = name + (f".r{file.attempt}" if file.attempt else "") + ": "
    if colour:
        text = f"\x1b[{PALETTE[file.rank % len(PALETTE)]}m{text}\x1b[0m"
    return text.encode()


def split_lines(partial: bytes, data: bytes) -> tuple[list[bytes], bytes]:
    """Complete lines (without "\\n") of partial + data, and what is left after the last newline."""
    lines = (partial + data).split(b"\n")
    rest = lines.pop()
    if len(rest) > _MAX_PARTIAL:
        lines.append(rest)
        rest = b""
    return lines, rest


def where_from_ranks_json(data: Any) -> dict[int, Where]:
    """{"ranks": [{"rank": 0, "host": "n1", "node": 0}, ...]} → {0: Where("n1", 0)}."""
    entries = data.get("ranks") if isinstance(data, dict) else None
    return _where_from_entries(entries or [], "node")


def where_from_summary(data: Any) -> dict[int, Where]:
    """summary.json: every attempt's ranks carry rank, host and node_rank."""
    attempts = data.get("attempts") if isinstance(data, dict) else None
    entries = [r for a in attempts or [] if isinstance(a, dict) for r in a.get("ranks") or []]
    return _where_from_entries(entries, "node_rank")


def _where_from_entries(entries: Iterable[Any], node_key: str) -> dict[int, Where]:
    where: dict[int, Where] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        rank, host, node = entry.get("rank"), entry.get("host"), entry.get(node_key)
        if isinstance(rank, int) and rank >= 0 and isinstance(host, str) and host:
            where[rank] = Where(host, node if isinstance(node, int) and node >= 0 else None)
    return where


def where_from_agent_logs(texts: Iterable[bytes]) -> dict[int, Where]:
    """"attempt 0: starting ranks 4-7 on n2" lines; nodes numbered by each host's lowest rank,
    since a node's ranks follow node 0's (global rank = node * nproc + local rank)."""
    hosts: dict[int, str] = {}
    for text in texts:
        for match in _STARTING.finditer(text):
            low, high, host = int(match[1]), int(match[2] or match[1]), match[3].decode("utf-8", "replace")
            hosts.update({rank: host for rank in range(low, high + 1)})
    first: dict[str, int] = {}
    for _, host in sorted(hosts.items()):
        first.setdefault(host, len(first))
    return {rank: Where(host, first[host]) for rank, host in hosts.items()}


# --- act -----------------------------------------------------------------------------------


def main(argv: Sequence[str], out: BinaryIO | None = None, colour: bool | None = None) -> int:
    try:
        command = parse(argv)
        sink = out if out is not None else sys.stdout.buffer
        if colour is None:
            colour = sys.stdout.isatty() and "NO_COLOR" not in os.environ
        if command.summary:
            from agent.summary_view import show_summary

            return show_summary(command, sink, colour)
        from agent.tail_follow import Tail

        return Tail(command, sink, colour).run()
    except AgentError as exc:
        print(f"agent: error: {exc.message}", file=sys.stderr)
        return int(exc.code)
    except BrokenPipeError:
        # The reader went away (`| head`): done. Point stdout at /dev/null so that the final
        # flush at interpreter exit does not raise again.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def read_json(path: str) -> Any:
    """The file's JSON, None when it does not exist; ValueError when it is not JSON."""
    try:
        with open(path, "rb") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def check_dir(log_dir: str) -> None:
    if not os.path.isdir(log_dir):
        what = "is not a directory" if os.path.exists(log_dir) else "does not exist"
        raise AgentError(f"log dir {log_dir} {what}: pass the job's --log-dir (default logs/<job-id>)")
