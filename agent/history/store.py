"""The history database: the one place that touches SQLite (append on node 0, read for the CLI).

Where: `$AGENT_STATE_DIR/history.sqlite` (default `~/.cache/launch-agent/history.sqlite`, the
state dir resident agents use too). WAL journal (on a network filesystem, where WAL's shared
memory index would be per host, the rollback journal and its fcntl locks), a busy timeout (BUSY_TIMEOUT) so that two jobs
ending at the same moment wait for each other instead of failing, and every append one
`BEGIN IMMEDIATE` transaction: the job, its attempts, then pruning of the oldest jobs beyond
ROW_CAP. A job is appended twice: its running record when it starts, then its final one, which
takes the running one's place (the same row id and run number).

When that database cannot be written or locked (a read-only or full directory, an NFS home
without working locks, a file that is not a database), the job goes to the fallback
`$TMPDIR/launch-agent-<uid>/history.sqlite` (TMPDIR default /tmp) with one warning line; `agent
history` reads both. Nothing here raises to the job: a job is never failed or held up by its
history.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from agent.history.record import AttemptRecord, JobRecord
from agent.plan.run_id import run_id
from agent.world.state_dir import dir_problem, state_dir

FILE_NAME = "history.sqlite"
ROW_CAP = 10_000  # jobs kept per database; the oldest beyond it are pruned at each append
BUSY_TIMEOUT = 5.0  # seconds an append or a read waits for another job's transaction

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, run INTEGER NOT NULL,
        step TEXT, command TEXT, start_time REAL, end_time REAL, nodes INTEGER, ranks INTEGER,
        spares_used TEXT, exit_code INTEGER, status TEXT, cause TEXT, restarts INTEGER,
        stragglers TEXT, log_dir TEXT)""",
    """CREATE TABLE IF NOT EXISTS attempts (
        job INTEGER NOT NULL, attempt INTEGER NOT NULL, start_time REAL, end_time REAL,
        nodes INTEGER, ranks INTEGER, failed INTEGER, spares TEXT, lost_nodes TEXT, cause TEXT,
        PRIMARY KEY (job, attempt))""",
    "CREATE INDEX IF NOT EXISTS jobs_by_job_id ON jobs (job_id, run)",
)
# Columns later versions added to `jobs`: added to an older database at its next append; a
# reader of one without them reads NULL.
_ADDED = {
    "run_id": "TEXT",
    "node0": "TEXT",
    "max_restarts": "INTEGER",
    "max_infra_restarts": "INTEGER",
    "stop": "TEXT",  # a stop for preemption (agent.run.preemption's line)
}
_ADDED_TO_ATTEMPTS = {"failure_class": "TEXT", "held": "TEXT"}  # the same, for `attempts`
VERSION = 1  # PRAGMA user_version, set at an append; 0: kept none (_ADDED columns may miss)


@dataclass(frozen=True)
class Stored:
    """A job as read back: its record and the run number the database gave it (the job id's
    records numbered from 0 in the order they were appended)."""

    run: int
    record: JobRecord


def history_path(environ: Mapping[str, str], home: Path) -> Path:
    return state_dir(environ, home) / FILE_NAME


def fallback_path(environ: Mapping[str, str], uid: int) -> Path:
    return Path(environ.get("TMPDIR") or "/tmp") / f"launch-agent-{uid}" / FILE_NAME


def paths(environ: Mapping[str, str], home: Path, uid: int) -> tuple[Path, ...]:
    """Where this user's history may be: the database, then the fallback."""
    primary, fallback = history_path(environ, home), fallback_path(environ, uid)
    return (primary,) if fallback == primary else (primary, fallback)


def append(
    record: JobRecord,
    environ: Mapping[str, str],
    home: Path,
    uid: int,
    warn: Callable[[str], None],
    cap: int = ROW_CAP,
    busy: float = BUSY_TIMEOUT,
) -> Path | None:
    """Record the job; the database it went to, or None (warned) when none would take it."""
    where = paths(environ, home, uid)
    problems = []
    for path in where:
        problem = dir_problem(path.parent, uid)
        if problem:  # another user could rewrite what this job records: not there
            problems.append(problem)
            continue
        try:
            _append_at(path, record, path != where[0], uid, cap, busy)
        except (sqlite3.Error, OSError) as exc:
            problems.append(f"{path}: {_reason(exc)}")
            continue
        if problems:
            warn(f"history: cannot write {problems[0]}; this job is recorded in {path} instead")
        return path
    warn(f"history: this job is not recorded ({'; '.join(problems)})")
    return None


def _append_at(
    path: Path, record: JobRecord, private: bool, uid: int, cap: int, busy: float
) -> None:
    """One append, tried again while another job holds the database, for up to `busy` seconds:
    SQLite's own busy handler does not cover every case (switching a new database to WAL while
    another connection creates it answers "locked" at once)."""
    _make_dir(path.parent, private, uid)
    _keep_private(path, uid)
    deadline = time.monotonic() + busy
    pause = 0.01
    while True:
        try:
            _append_once(path, record, cap, max(deadline - time.monotonic(), 0.05))
            return
        except sqlite3.OperationalError as exc:
            if not _busy(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(pause * (1 + random.random()))  # backoff with jitter: the other job commits
        pause = min(pause * 2, 0.2)


def _busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+; 5, 6: SQLITE_BUSY, _LOCKED
    busy = code & 0xFF in (5, 6) if code is not None else None
    return busy if busy is not None else "locked" in str(exc) or "busy" in str(exc)


def _append_once(path: Path, record: JobRecord, cap: int, busy: float) -> None:
    con = sqlite3.connect(str(path), timeout=busy, isolation_level=None)
    try:
        # WAL's shared memory index is per host: on a network filesystem several nodes' jobs
        # would corrupt it, so there the rollback journal (fcntl locks; none: the fallback).
        # Switched only when it differs: the switch needs the database to itself.
        mode = "delete" if _on_network(path.parent) else "wal"
        (current,) = con.execute("PRAGMA journal_mode").fetchone()
        if str(current).lower() != mode:
            con.execute(f"PRAGMA journal_mode={mode.upper()}")
        con.execute("BEGIN IMMEDIATE")
        migrate(con)
        (last,) = con.execute(
            "SELECT max(run) FROM jobs WHERE job_id = ? AND typeof(run) = 'integer'",
            (record.job_id,),
        ).fetchone()
        key, run = _running_row(con, record) or (None, 0 if last is None else last + 1)
        job = con.execute(
            "INSERT INTO jobs (id, job_id, run, step, command, start_time, end_time, nodes, "
            "ranks, spares_used, exit_code, status, cause, restarts, stragglers, log_dir, run_id, "
            "node0, max_restarts, max_infra_restarts, stop) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                key, record.job_id, run, record.step, record.command,
                record.start, record.end, record.nodes, record.ranks,
                json.dumps(record.spares_used), record.exit_code, record.status, record.cause,
                record.restarts, json.dumps(record.stragglers), record.log_dir, record.run_id,
                json.dumps(record.node0) if record.node0 is not None else None,
                record.max_restarts, record.max_infra_restarts, record.stop,
            ),
        ).lastrowid  # fmt: skip
        con.executemany(
            "INSERT INTO attempts (job, attempt, start_time, end_time, nodes, ranks, failed, "
            "spares, lost_nodes, cause, failure_class, held) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    job, a.attempt, a.start, a.end, a.nodes, a.ranks, a.failed,
                    json.dumps(a.spares), json.dumps(a.lost_nodes), a.cause, a.failure_class,
                    a.held,
                )
                for a in _unique(record.attempts)
            ],
        )  # fmt: skip
        old = "SELECT id FROM jobs ORDER BY id DESC LIMIT -1 OFFSET ?"
        con.execute(f"DELETE FROM attempts WHERE job IN ({old})", (cap,))
        con.execute(f"DELETE FROM jobs WHERE id IN ({old})", (cap,))
        con.execute("COMMIT")
    except BaseException:
        if con.in_transaction:
            con.execute("ROLLBACK")
        raise
    finally:
        con.close()


def migrate(con: sqlite3.Connection) -> int:
    """In the append's transaction: the database brought to VERSION (created, or its missing
    columns added) and marked so; the version it had. A newer agent's keeps its version."""
    (version,) = con.execute("PRAGMA user_version").fetchone()
    version = version if isinstance(version, int) else 0
    for statement in _SCHEMA:
        con.execute(statement)
    # any version, a newer one too: a column this agent writes is added (that breaks no reader)
    for table, added in (("jobs", _ADDED), ("attempts", _ADDED_TO_ATTEMPTS)):
        have = _columns(con, table)
        for column, kind in added.items():
            if column not in have:
                con.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
    if version < VERSION:
        con.execute(f"PRAGMA user_version = {VERSION}")
    return version


def version_of(path: Path) -> int:
    """The version of the database at `path` (0: none kept, or no database)."""
    if not path.is_file():
        return 0
    con = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT)
    try:
        (version,) = con.execute("PRAGMA user_version").fetchone()
    finally:
        con.close()
    return version


def _running_row(con: sqlite3.Connection, record: JobRecord) -> tuple[int, int] | None:
    """The job's running record (inserted when it started), taken out to make room for this one
    under the same id and run number: (id, run); None when it has none. A log dir holds one job
    (agent.run.outputs.claim_log_dir): with the id, it names the record."""
    if not record.log_dir:
        return None
    found = con.execute(
        "SELECT id, run FROM jobs WHERE status = 'running' AND log_dir = ? AND run_id = ? "
        "AND typeof(run) = 'integer' ORDER BY id DESC LIMIT 1",
        (record.log_dir, record.run_id),
    ).fetchone()
    if found is None:
        return None
    con.execute("DELETE FROM attempts WHERE job = ?", (found[0],))
    con.execute("DELETE FROM jobs WHERE id = ?", (found[0],))
    return found[0], found[1]


NETWORK_FS = frozenset(
    ("nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs",
     "fuse.sshfs", "fuse.glusterfs", "fuse.cephfs", "9p", "afs", "panfs", "wekafs", "orangefs")
)  # fmt: skip


def filesystem_of(mountinfo: str, path: str) -> str | None:
    """The type of the filesystem `path` (absolute, resolved) is on, from /proc/self/mountinfo
    text (pure): the longest mount point that contains it; None when nothing matches."""
    best, kind = -1, None
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if " - " not in line or len(fields) < 5:
            continue
        mount = fields[4].replace("\\040", " ")
        fstype = line.split(" - ", 1)[1].split(" ", 1)[0]
        inside = path == mount or path.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) > best:
            best, kind = len(mount), fstype
    return kind


def _on_network(directory: Path) -> bool:
    try:
        with open("/proc/self/mountinfo") as f:
            text = f.read()
    except OSError:
        return False
    return filesystem_of(text, os.path.realpath(directory)) in NETWORK_FS


def _unique(attempts: Sequence[AttemptRecord]) -> list[AttemptRecord]:
    seen: dict[int, AttemptRecord] = {}
    for a in attempts:
        seen.setdefault(a.attempt, a)
    return list(seen.values())


def _make_dir(path: Path, private: bool, uid: int) -> None:
    """The state dir, created 0700; the fallback under a shared /tmp must be ours, not a link."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if private:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            raise OSError(f"{path} is not a directory of user {uid}")


def _keep_private(path: Path, uid: int) -> None:
    """The database 0600 before SQLite opens it (every command line of this user is in it):
    SQLite gives its -wal, -shm and -journal the database's mode. Files an older version left
    readable by others are made private too."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)  # empty: a new database
    try:
        _private(fd, uid)
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm", "-journal"):
        try:
            fd = os.open(f"{path}{suffix}", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # none (the usual case), or not a file to touch
            continue
        try:
            _private(fd, uid)
        finally:
            os.close(fd)


def _private(fd: int, uid: int) -> None:
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) and st.st_uid == uid and st.st_mode & 0o077:
        os.fchmod(fd, 0o600)


def read(
    path: Path,
    job_id: str | None = None,
    run: int | None = None,
    match: Callable[[JobRecord], bool] | None = None,
    warn: Callable[[str], None] | None = None,
) -> list[Stored]:
    """Every job in the database (or those of `job_id`, and `run`; or those `match` keeps, with
    their attempts), oldest first; none when the file does not exist. sqlite3.Error when it
    cannot be read. SQLite keeps any type in any column: a row whose job id, run, run id, times
    or exit code are not what this module writes is skipped (one `warn` line for them all); any
    other odd value is shown as what fits."""
    if not path.is_file():
        return []
    con = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT)
    skipped = 0
    try:
        if not con.execute("SELECT 1 FROM sqlite_master WHERE name = 'jobs'").fetchone():
            return []
        where, args = "", ()  # type: tuple[str, tuple[object, ...]]
        if job_id is not None:
            where, args = "WHERE job_id = ?", (job_id,)
            if run is not None:
                where, args = where + " AND run = ?", (job_id, run)
        added = ", ".join(c if c in _columns(con, "jobs") else "NULL" for c in _ADDED)
        rows = con.execute(
            "SELECT id, run, job_id, step, command, start_time, end_time, nodes, ranks, "
            f"spares_used, exit_code, status, cause, restarts, stragglers, log_dir, {added} "
            f"FROM jobs {where} ORDER BY id",
            args,
        ).fetchall()
        jobs: list[tuple[int, Stored]] = []
        for row in rows:
            stored = _job_from_row(row[1:])
            if stored is None:
                skipped += 1
            else:
                jobs.append((row[0], stored))
        if match is not None:
            jobs = [(key, stored) for key, stored in jobs if match(stored.record)]
        if job_id is not None or match is not None:  # the attempts are shown for one job only
            attempts, odd = _attempts(con, [key for key, _ in jobs])
            skipped += odd
            jobs = [
                (key, replace(s, record=replace(s.record, attempts=attempts.get(key, ()))))
                for key, s in jobs
            ]
    finally:
        con.close()
    if skipped and warn is not None:
        warn(f"{skipped} row(s) of {path} skipped: not as agent history writes them")
    return [stored for _, stored in jobs]


def _job_from_row(row: Sequence[object]) -> Stored | None:
    """A jobs row (from `run` on, then the _ADDED columns) as read back, without its attempts;
    None when what identifies or orders it (job id, run, run id, times, exit code) does not
    fit. A job's running record has no exit code yet."""
    (run, job_id, step, command, start, end, nodes, ranks, spares, exit_code, status, cause,
     restarts, stragglers, log_dir, rid, node0, max_restarts, max_infra, stop) = row  # fmt: skip
    start, end = _time(start), _time(end)
    if not isinstance(job_id, str) or not _is_int(run) or start is None or end is None:
        return None
    if rid is not None and not isinstance(rid, str):
        return None
    status = _text(status)
    if not (_is_int(exit_code) or (exit_code is None and status == "running")):
        return None
    return Stored(
        run,  # type: ignore[arg-type]  # checked above
        JobRecord(
            # older rows (no run_id): the id their job and step make
            run_id=rid if isinstance(rid, str) and rid else run_id(job_id, _text(step)),
            job_id=job_id, step=_text(step), command=_text(command), start=start, end=end,
            nodes=_count(nodes), ranks=_count(ranks), spares_used=_texts(spares),
            exit_code=exit_code,  # type: ignore[arg-type]  # checked above
            status=status, cause=_text(cause) or None, restarts=_count(restarts),
            stragglers=_texts(stragglers), log_dir=_text(log_dir), attempts=(),
            node0=_map(node0),
            max_restarts=max_restarts if _is_int(max_restarts) else None,  # type: ignore[arg-type]
            max_infra_restarts=max_infra if _is_int(max_infra) else None,  # type: ignore[arg-type]
            stop=_text(stop) or None,
        ),
    )  # fmt: skip


def _attempts(
    con: sqlite3.Connection, keys: Sequence[int]
) -> tuple[dict[int, tuple[AttemptRecord, ...]], int]:
    """The attempts of the jobs `keys` name, and how many of their rows were skipped."""
    found: dict[int, list[AttemptRecord]] = {}
    skipped = 0
    have = _columns(con, "attempts")
    added = ", ".join(c if c in have else "NULL" for c in _ADDED_TO_ATTEMPTS)
    for at in range(0, len(keys), 500):  # SQLite's bound on the variables of one statement
        chunk = keys[at : at + 500]
        for row in con.execute(
            "SELECT job, attempt, start_time, end_time, nodes, ranks, failed, spares, "
            f"lost_nodes, cause, {added} FROM attempts WHERE job IN ({', '.join('?' * len(chunk))}) "
            "ORDER BY job, attempt",
            chunk,
        ):
            attempt = _attempt_from_row(row[1:])
            if attempt is None:
                skipped += 1
            else:
                found.setdefault(row[0], []).append(attempt)
    return {key: tuple(records) for key, records in found.items()}, skipped


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in con.execute(f"PRAGMA table_info({table})")}


def _map(text: object) -> dict | None:
    if not isinstance(text, (str, bytes)):
        return None
    try:
        value = json.loads(text) if text else None
    except (ValueError, RecursionError):  # UnicodeDecodeError included; {{{{... nested deep
        return None
    return value if isinstance(value, dict) else None


def _attempt_from_row(row: Sequence[object]) -> AttemptRecord | None:
    """An attempts row (from `attempt` on); None when its number does not fit."""
    attempt, start, end, nodes, ranks, failed, spares, lost_nodes, cause, failure_class, held = row
    if not _is_int(attempt):
        return None
    lost = tuple(n for n in _json(lost_nodes) if _is_int(n))
    return AttemptRecord(
        attempt, _time(start), _time(end), _count(nodes), _count(ranks), _count(failed),  # type: ignore[arg-type]
        _texts(spares), lost, _text(cause) or None,
        failure_class if failure_class in ("program", "infrastructure") else None,
        _text(held) or None,
    )  # fmt: skip


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


LATEST = 1e11  # seconds since the epoch: year 5138; beyond, localtime() overflows


def _time(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0 <= value < LATEST else None  # NaN fails both


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _texts(value: object) -> tuple[str, ...]:
    """A JSON list of names, as written by append; what is not a name is left out."""
    return tuple(v for v in _json(value) if isinstance(v, str))


def _json(text: object) -> list:
    if not isinstance(text, (str, bytes)):
        return []
    try:
        value = json.loads(text or "[]")
    except (ValueError, RecursionError):  # UnicodeDecodeError included; [[[[... nested deep
        return []
    return value if isinstance(value, list) else []


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__
