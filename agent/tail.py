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
import time
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
_CHUNK = 1 << 20  # bytes read per file per poll: one chatty rank cannot starve the others
_MAX_PARTIAL = 1 << 16  # a line longer than this is shown in pieces
_STALE = 1.0  # seconds without growth before a partial line is shown
_AGENT_LOG_HEAD = 1 << 14  # the "starting ranks" line is near the top of an agent log
_REMAP = 2.0  # seconds between re-reads of the rank → host sources while a rank is unnamed


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


class _Followed:
    """Reading state of one shown file."""

    def __init__(self, file: RankFile, path: str, offset: int) -> None:
        self.file = file
        self.path = path
        self.offset = offset
        self.partial = b""
        self.grown = time.monotonic()


class Tail:
    """The rank files of one log dir: scan, select, read what is new, print prefixed lines."""

    def __init__(self, command: LogsCommand, out: BinaryIO, colour: bool) -> None:
        self.command = command
        self.selection = command.selection
        self.out = out
        self.colour = colour
        self.where: dict[int, Where] = {}
        self.where_read = -1e9
        self.remap = _REMAP
        self.seen: set[str] = set()  # every name in the dir that was looked at once
        self.pending: list[RankFile] = []  # rank files waiting to learn their node (--node)
        self.ordered: list[_Followed] = []  # the shown files, in rank order
        self.unnamed = False  # some shown rank has no host yet: re-read the rank map now and then
        self.latest: int | None = None  # fixed at the first scan that finds rank files
        self.started = False

    def run(self) -> int:
        log_dir = self.command.log_dir
        if not self.command.follow or os.path.exists(log_dir):
            check_dir(log_dir)
        if not self.command.follow:
            self.poll(to_eof=True, final=True)
            if not self.ordered:
                print(f"agent logs: no rank file in {log_dir} matches the selection", file=sys.stderr)
            return 0
        if not os.path.exists(log_dir):
            print(f"agent logs: waiting for {log_dir} to appear (Ctrl-C to stop)", file=sys.stderr)
        summary = os.path.join(log_dir, "summary.json")
        before = _signature(summary)  # a summary.json from before we started does not count
        try:
            while True:
                busy = self.poll(to_eof=not self.started)
                self.started = True
                if _signature(summary) != before:
                    self.poll(to_eof=True, final=True)  # the job ended: all is in the files now
                    return 0
                if not busy:
                    time.sleep(self.command.interval)
        except KeyboardInterrupt:
            self.flush_partials()
            return 0

    # -- one poll -------------------------------------------------------------------------
    def poll(self, to_eof: bool, final: bool = False) -> bool:
        """Scan, then read what is new in every shown file; True when a file had more to read.
        final: nothing more will come, so a file's partial last line is shown right after it."""
        names = _listdir(self.command.log_dir)
        fresh = [f for f in map(parse_name, set(names) - self.seen) if f is not None]
        self.seen.update(names)
        if fresh and self.latest is None:
            self.latest = latest_attempt(fresh)
        self.pending = sorted(self.pending + fresh, key=lambda f: f.order)
        if self.pending or self.unnamed:
            self._track(names)
        busy = False
        now = time.monotonic()
        for followed in self.ordered:
            busy |= self._read(followed, now, to_eof)
            if final and followed.partial:
                self._emit(followed, [followed.partial])
                followed.partial = b""
        self.out.flush()
        return busy

    def _track(self, names: list[str]) -> None:
        """Decide on the pending files; those whose node is not known yet stay pending."""
        named = self.command.prefix or self.selection.nodes is not None
        if named and (self.unnamed or any(f.rank not in self.where for f in self.pending)):
            self._load_where(names)
        undecided = []
        for file in self.pending:
            shown = wanted(file, self.selection, self.where, self.latest or 0, self.command.follow)
            if shown is None and not self.where and not self.command.follow:
                raise AgentError(
                    f"--node: nothing in {self.command.log_dir} says which node ran which rank "
                    "(no ranks.json, summary.json or agent logs naming hosts); select with --rank"
                )
            if shown is None:
                undecided.append(file)
            elif shown:
                path = os.path.join(self.command.log_dir, file.name)
                self.ordered.append(_Followed(file, path, self._start_offset(path)))
        self.pending = undecided if self.command.follow else []
        self.ordered.sort(key=lambda f: f.file.order)
        self.unnamed = self.command.prefix and any(f.file.rank not in self.where for f in self.ordered)

    def _start_offset(self, path: str) -> int:
        """Where a newly seen file is read from: its start, or its last --lines lines at startup."""
        if self.command.lines is None or self.started:
            return 0
        return last_lines_offset(path, self.command.lines)

    def _load_where(self, names: list[str]) -> None:
        now = time.monotonic()
        if now - self.where_read < self.remap:
            return  # a rank that no source names must not make every poll re-read them all
        self.where_read = now
        before = len(self.where)
        self.where = read_where(self.command.log_dir, names)
        # Backs off while nothing new turns up (an agent that writes no ranks.json, say).
        self.remap = _REMAP if len(self.where) > before else min(self.remap * 2, 60.0)

    def _read(self, followed: _Followed, now: float, to_eof: bool) -> bool:
        try:
            size = os.stat(followed.path).st_size
        except FileNotFoundError:
            return False
        if size < followed.offset:  # truncated or replaced: start over
            followed.offset, followed.partial = 0, b""
        if size == followed.offset:
            if followed.partial and now - followed.grown >= _STALE:
                self._emit(followed, [followed.partial])
                followed.partial = b""
            return False
        followed.grown = now
        limit = size if to_eof else min(size, followed.offset + _CHUNK)
        with open(followed.path, "rb") as f:
            f.seek(followed.offset)
            while followed.offset < limit:
                data = f.read(min(_CHUNK, limit - followed.offset))
                if not data:
                    break
                followed.offset += len(data)
                lines, followed.partial = split_lines(followed.partial, data)
                self._emit(followed, lines)
        return followed.offset < size

    def _emit(self, followed: _Followed, lines: list[bytes]) -> None:
        grep = self.selection.grep
        if grep is not None:
            lines = [line for line in lines if grep.search(line.decode("utf-8", "replace"))]
        if not lines:
            return
        head = prefix(followed.file, self.where, self.colour) if self.command.prefix else b""
        self.out.write(b"".join(head + line + b"\n" for line in lines))

    def flush_partials(self) -> None:
        for followed in self.ordered:
            if followed.partial:
                self._emit(followed, [followed.partial])
                followed.partial = b""
        self.out.flush()


def last_lines_offset(path: str, count: int) -> int:
    """The offset of the last `count` lines of the file (a final unterminated line counts)."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        if count == 0:
            return end
        position, seen = end, 0
        while position > 0:
            step = min(1 << 16, position)
            position -= step
            f.seek(position)
            block = f.read(step)
            if position + step == end and block.endswith(b"\n"):
                block = block[:-1]  # the file's last newline ends the last line, not a new one
            for index in range(len(block) - 1, -1, -1):
                if block[index] == 0x0A:
                    seen += 1
                    if seen == count:
                        return position + index + 1
        return 0


def read_where(log_dir: str, names: Iterable[str]) -> dict[int, Where]:
    """rank → host from ranks.json, else summary.json, else the agent logs' first lines."""
    for source, name in ((where_from_ranks_json, "ranks.json"), (where_from_summary, "summary.json")):
        try:
            found = source(read_json(os.path.join(log_dir, name)))
        except (OSError, ValueError):
            found = {}  # being written, or damaged: the next source may know
        if found:
            return found
    return where_from_agent_logs(_heads(log_dir, sorted(n for n in names if AGENT_LOG.fullmatch(n))))


def _listdir(log_dir: str) -> list[str]:
    try:
        return os.listdir(log_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _heads(log_dir: str, names: Iterable[str]) -> list[bytes]:
    heads = []
    for name in names:
        with contextlib.suppress(OSError), open(os.path.join(log_dir, name), "rb") as f:
            heads.append(f.read(_AGENT_LOG_HEAD))
    return heads


def _signature(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size
