"""Every job and resident run of this user, and each of their attempts, in a SQLite database.

Node 0 calls `record_job(summary, environ)` when a job starts (its running record) and once it has
written summary.json (agent.run.outputs): the final record takes the running one's place;
`python -m agent history [ID] [--last N] [--failed] [--json]` reads it back (ID: a job's or
run's id, agent.plan.run_id, or its log dir). Layer: below
run, serve and launch (none of which it imports), beside logs; it never imports torch.

`record` builds the row from the summary (agent.history.record, pure) and appends it
(agent.history.store, the SQLite side effects); the CLI parses, reads, then draws
(agent.history.view, pure).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from agent.errors import AgentError
from agent.usage import Parser

DEFAULT_LAST = 20


@dataclass(frozen=True)
class HistoryCommand:
    job: str | None  # an id or a log dir as typed: show that job's attempts
    last: int
    failed: bool
    as_json: bool


_WARNED: set[tuple[str, str]] = set()  # (log dir, warning): a job's record warns once


def record_job(summary: Mapping[str, Any], environ: Mapping[str, str]) -> Path | None:
    """Node 0, a job or run started or ended: append it (never raises; one warning line per job
    when it has to use the fallback database or cannot record at all)."""
    import logging

    job = summary.get("job")
    log_dir = str(job.get("log_dir")) if isinstance(job, Mapping) else ""

    def warn(text: str) -> None:
        if (log_dir, text) not in _WARNED:
            _WARNED.add((log_dir, text))
            logging.getLogger("agent").warning(text)

    try:
        from agent.history.record import from_summary
        from agent.history.store import append

        home = _home(environ)
        return append(from_summary(summary, time.time()), environ, home, os.getuid(), warn)
    except Exception as exc:  # a history must never fail the job it records
        warn(f"history: this job is not recorded ({type(exc).__name__}: {exc})")
        return None


def build_parser() -> Parser:
    parser = Parser(
        prog="python -m agent history",
        subcommand="history",
        description="Every job and resident run of this user: exit code, root cause, restarts. "
        "With an ID: that job's attempts.",
        epilog="The database: $AGENT_STATE_DIR/history.sqlite (default ~/.cache/launch-agent/), "
        "and $TMPDIR/launch-agent-<uid>/history.sqlite where a job could not write there.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "job",
        nargs="?",
        metavar="ID",
        help="a job's or run's id as listed (8.0, 8.0.r3; 8: every step and run of job 8), or "
        "its log dir",
    )
    parser.add_argument(
        "--last", default=str(DEFAULT_LAST), metavar="N",
        help=f"the N most recent jobs (default {DEFAULT_LAST}; 0: all)",
    )  # fmt: skip
    parser.add_argument("--failed", action="store_true", help="only jobs that did not succeed")
    parser.add_argument("--json", dest="as_json", action="store_true", help="JSON, not a table")
    return parser


def parse(argv: Sequence[str]) -> HistoryCommand:
    ns = build_parser().parse_args(list(argv))
    if not re.fullmatch(r"\d{1,9}", ns.last):
        raise AgentError(f"history --last {ns.last!r}: pass a number of jobs, 0 or more (0: all)")
    if ns.job is not None and not re.fullmatch(r"[\w.:@+/-]{1,4096}", ns.job):
        raise AgentError(f"history: {ns.job!r} is not a job id (8.0, 8.0.r3) or a log dir")
    return HistoryCommand(ns.job, int(ns.last), ns.failed, ns.as_json)


def main(argv: Sequence[str], environ: Mapping[str, str], out: TextIO | None = None) -> int:
    from agent.history.store import Stored, paths

    command = parse(argv)
    out = out if out is not None else sys.stdout
    where = paths(environ, _home(environ), os.getuid())
    if command.job is not None:
        found = _lookup(where, command.job)
        if not found:
            raise AgentError(
                f"history: no job {command.job} recorded (in {', '.join(map(str, where))})"
            )
        return _show_job(judged(found), command, out)
    jobs: list[Stored] = []
    for path in where:
        jobs += _read(path)
    jobs = judged(jobs)
    jobs.sort(key=lambda s: (s.record.end, s.record.start))
    if command.failed:  # killed ones too; not those running
        jobs = [s for s in jobs if s.record.status not in ("succeeded", "running")]
    if command.last:
        jobs = jobs[-command.last :]
    if command.as_json:
        from agent.history.view import as_json

        json.dump([as_json(s) for s in jobs], out, indent=1)
        out.write("\n")
        return 0
    if not jobs:
        what = "no failed jobs" if command.failed else "no jobs"
        out.write(f"{what} recorded in {', '.join(map(str, where))}\n")
        return 0
    from agent.history.view import JOB_COLUMNS, job_rows

    _draw(f"{len(jobs)} job(s), oldest first", job_rows(jobs), JOB_COLUMNS, out)
    return 0


def judged(jobs: Sequence[Any]) -> list[Any]:
    """The jobs, each running record judged (agent.history.liveness): still running, or killed
    (status "killed"). Node 0's agents on other machines are asked at once, not in turn."""
    from concurrent.futures import ThreadPoolExecutor
    from dataclasses import replace

    from agent.history.liveness import KILLED, alive

    running = [i for i, s in enumerate(jobs) if s.record.status == "running"]
    if not running:
        return list(jobs)
    with ThreadPoolExecutor(max_workers=min(32, len(running))) as pool:
        answers = list(pool.map(lambda i: alive(jobs[i].record.node0), running))
    out = list(jobs)
    for i, up in zip(running, answers, strict=True):
        if not up:
            out[i] = replace(out[i], record=replace(out[i].record, status=KILLED))
    return out


def _lookup(where: Sequence[Path], text: str) -> list[Any]:
    """The jobs and runs `text` names (`names`), oldest first."""
    found = [s for path in where for s in _read(path, match=lambda r: names(text, r))]
    return sorted(found, key=lambda s: (s.record.end, s.record.start))


def names(text: str, record: Any) -> bool:
    """Whether what a user typed names a recorded job or run: its id or a parent of it (`8`,
    `8.0` for `8.0.r3`: agent.plan.run_id.named_by), or its log dir, by path or by name."""
    from agent.plan.run_id import named_by

    if named_by(text, record.run_id) or text == record.job_id:
        return True
    log_dir = record.log_dir.rstrip("/")
    if not log_dir:
        return False
    given = text.rstrip("/")
    return given == os.path.basename(log_dir) or os.path.abspath(given) == log_dir


def log_dir_of(text: str, environ: Mapping[str, str]) -> str:
    """What `agent logs`/`stacks`/`debug` were given as LOG_DIR, as a log dir: the directory
    itself; else `logs/ID` here; else the log dir this user's history records for that id or
    log dir name (the latest); else `text` as given (the command's own error then says why)."""
    if os.path.isdir(text) or not text:
        return text
    here = os.path.join("logs", text)
    if os.sep not in text and os.path.isdir(here):
        return here
    from agent.history.store import paths

    wanted = text.rstrip("/")

    def exact(record: Any) -> bool:  # this one job, not the runs it is a parent of
        name = os.path.basename(record.log_dir.rstrip("/"))
        return bool(record.log_dir) and wanted in (record.run_id, name)

    where = paths(environ, _home(environ), os.getuid())
    found = [s for path in where for s in _read(path, match=exact)]
    if not found:
        return text
    return max(found, key=lambda s: (s.record.start, s.record.end)).record.log_dir


def _show_job(found: list[Any], command: HistoryCommand, out: TextIO) -> int:
    from agent.history.view import ATTEMPT_COLUMNS, as_json, attempt_rows, job_facts, name

    if command.as_json:
        json.dump([as_json(s) for s in found], out, indent=1)
        out.write("\n")
        return 0
    for stored in found:
        out.write("\n".join(job_facts(stored)) + "\n")
        rows = attempt_rows(stored.record.attempts)
        _draw(f"attempts of {name(stored)}", rows, ATTEMPT_COLUMNS, out)
    return 0


def _read(path: Path, match: Any = None) -> list[Any]:
    from agent.history.store import read

    def warn(line: str) -> None:
        print(f"agent: warning: {line}", file=sys.stderr)

    try:
        return read(path, match=match, warn=warn)
    except sqlite3.Error as exc:
        warn(f"cannot read the history in {path} ({exc})")
        return []


def _draw(title: str, rows: list, columns: Sequence[Any], out: TextIO) -> None:
    """As `agent logs --summary` draws its rank table: directly when it fits, else by rich; on
    a terminal, narrowed to its width first (columns dropped by priority, long texts cut)."""
    from agent.history.view import fitted_table

    tty = out.isatty()
    width = shutil.get_terminal_size((100, 24)).columns if tty else 1 << 20
    table = fitted_table(title, rows, columns, width)
    # Too narrow even for the columns never cut (the job id): past the edge, not cut by rich.
    lines = table.lines(width) or table.lines(1 << 20)
    if lines is not None:
        out.write("\n".join(lines) + "\n")
        return
    from rich.console import Console

    Console(file=out, width=width, highlight=False, no_color=True).print(table.table())


def _home(environ: Mapping[str, str]) -> Path:
    home = environ.get("HOME")
    return Path(home) if home else Path.home()
