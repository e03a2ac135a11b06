"""`agent history`: the record built from summary.json (pure, table-tested), the SQLite database
(appends from concurrent processes, pruning, the fallback), and the CLI as a user runs it."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster import REPO, base_env

from agent.history import store
from agent.history.record import AttemptRecord, JobRecord, from_summary
from agent.history.view import job_rows, safe

NOW = 1_700_000_000.0


def rank(r, state="succeeded", start=100.0, end=110.0, node=0, rc=0, attempt=0):
    return {
        "rank": r, "local_rank": r, "node_rank": node, "host": f"n{node}", "pid": 1,
        "returncode": rc, "state": state, "start": start, "end": end, "attempt": attempt,
    }  # fmt: skip


CAUSE = {"kind": "rank", "rank": 1, "host": "n0", "node_rank": 0, "how": "exit code 3"}
SUMMARY_OK = {
    "job": {
        "id": "77", "step": "0", "nnodes": 1, "world_size": 2, "log_dir": "/l/77",
        "command": ["train.py", "a.yml", "--lr", "1"],
    },
    "status": "succeeded",
    "exit_code": 0,
    "root_cause": None,
    "attempts": [
        {"attempt": 0, "root_cause": None, "ranks": [rank(0), rank(1, end=112.5)],
         "nodes": [{"node": 0, "agent": 0, "host": "n0", "ranks": [0, 1]}], "spares": []},
    ],
}  # fmt: skip
SUMMARY_RESTART = {
    "job": {"id": "78", "step": "1", "nnodes": 2, "world_size": 2, "log_dir": "/l/78"},
    "exit_code": 1,
    "root_cause": CAUSE,
    "attempts": [
        {"attempt": 0, "root_cause": {"kind": "lost", "node_rank": 1, "host": "n1", "how": "lost"},
         "ranks": [rank(0, "terminated", 100, 105), rank(1, "lost", 0, None, node=1)],
         "lost_nodes": [1],
         "nodes": [{"host": "n0"}, {"host": "n1"}], "spares": ["n2"]},
        {"attempt": 1, "root_cause": CAUSE,
         "ranks": [rank(0, "terminated", 106, 120), rank(1, "failed", 106, 119, node=1, rc=3)],
         "nodes": [{"host": "n0"}, {"host": "n2"}], "spares": []},
    ],
}  # fmt: skip
SUMMARY_EARLY = {  # ended before any attempt: a node never joined
    "job": {"id": "79", "nnodes": 4, "world_size": 8},
    "exit_code": 3,
    "root_cause": {"kind": "join", "how": "node 3 never arrived"},
    "attempts": [],
}
SUMMARY_BYTES = {  # a script whose name is not UTF-8: Python's argv holds lone surrogates
    "job": {"id": "80", "command": ["tr\udcffain.py", "--tag", "x\ud800"], "log_dir": "/l/\udcff"},
    "exit_code": 0,
    "attempts": [],
}
SUMMARY_GARBAGE = {
    "job": ["not", "a", "map"],
    "exit_code": "zero",
    "root_cause": "a string",
    "attempts": [7, {"ranks": "x", "attempt": True}, {"ranks": [rank(0, start=float("nan"))]}],
    "stragglers": [{"rank": 3, "host": "n1\x1b[31m"}, "n9"],
}


@pytest.mark.parametrize(
    "summary, expect",
    [
        (SUMMARY_OK, dict(job_id="77", step="0", command="train.py a.yml --lr 1", start=100.0,
                          end=112.5, nodes=1, ranks=2, spares_used=(), exit_code=0,
                          status="succeeded", cause=None, restarts=0, stragglers=(),
                          log_dir="/l/77")),
        (SUMMARY_RESTART, dict(job_id="78", step="1", start=100.0, end=120.0, nodes=2, ranks=2,
                               spares_used=("n2",), exit_code=1, status="failed",
                               cause="rank 1 on n0 (node 0) exit code 3", restarts=1)),
        (SUMMARY_EARLY, dict(job_id="79", start=NOW, end=NOW, nodes=4, ranks=8, exit_code=3,
                             cause="join: node 3 never arrived", restarts=0,
                             attempts=())),
        (SUMMARY_BYTES, dict(job_id="80", command="tr\\udcffain.py --tag x\\ud800",
                             log_dir="/l/\\udcff", status="succeeded")),
        (SUMMARY_GARBAGE, dict(job_id="local", step="", command="", exit_code=1,
                               status="failed", cause=None, restarts=1, start=NOW, end=NOW,
                               stragglers=("rank 3 on n1\x1b[31m",))),  # "n9": no record
    ],
    ids=["ok", "restart-with-spare", "before-first-attempt", "file-name-bytes", "garbage"],
)  # fmt: skip
def test_record_from_summary(summary, expect):
    record = from_summary(summary, NOW)
    assert isinstance(record, JobRecord)
    for field, value in expect.items():
        assert getattr(record, field) == value, field


def test_attempt_records():
    attempts = from_summary(SUMMARY_RESTART, NOW).attempts
    assert attempts == (
        AttemptRecord(0, 100.0, 105.0, 2, 2, 1, ("n2",), (1,), "node 1 (n1) lost"),
        AttemptRecord(1, 106.0, 120.0, 2, 2, 1, (), (), "rank 1 on n0 (node 0) exit code 3"),
    )
    with pytest.raises(AttributeError):
        attempts[0].attempt = 5  # frozen


def test_rows_escape_what_came_from_files():
    record = from_summary(SUMMARY_GARBAGE, NOW)
    stored = store.Stored(0, record)
    (cells, style), *_ = job_rows([stored])
    assert "\x1b" not in "".join(cells) and style == "red"
    assert safe("a\x1b[2Jb\u202e") == "a\\x1b[2Jb\\u202e"


def _append(path: Path, summary, warnings: list[str] | None = None, cap=store.ROW_CAP, **env):
    environ = {"AGENT_STATE_DIR": str(path), "TMPDIR": str(path.parent / "tmp"), **env}
    sink = warnings if warnings is not None else []
    return store.append(
        from_summary(summary, NOW), environ, path, os.getuid(), sink.append, cap=cap
    )


def test_append_and_read_back(tmp_path):
    state = tmp_path / "state"
    assert _append(state, SUMMARY_OK) == state / "history.sqlite"
    _append(state, SUMMARY_RESTART)
    _append(state, SUMMARY_OK)  # the same job id again: its next run
    jobs = store.read(state / "history.sqlite")
    assert [(s.record.job_id, s.run) for s in jobs] == [("77", 0), ("78", 0), ("77", 1)]
    assert jobs[1].record.attempts == ()  # the list reads no attempts
    (one,) = store.read(state / "history.sqlite", "78")
    assert one.record == from_summary(SUMMARY_RESTART, NOW)
    assert [s.run for s in store.read(state / "history.sqlite", "77", 1)] == [1]
    con = sqlite3.connect(state / "history.sqlite")
    assert con.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert oct(state.stat().st_mode & 0o777) == "0o700"


def test_pruned_to_the_cap_oldest_first(tmp_path):
    state = tmp_path / "state"
    for i in range(7):
        _append(state, {**SUMMARY_RESTART, "job": {"id": f"j{i}"}}, cap=3)
    jobs = store.read(state / "history.sqlite")
    assert [s.record.job_id for s in jobs] == ["j4", "j5", "j6"]
    con = sqlite3.connect(state / "history.sqlite")
    assert con.execute("SELECT count(*) FROM attempts").fetchone() == (6,)  # 2 per kept job


APPENDER = """
import json, os, sys
from pathlib import Path
from agent.history import store
from agent.history.record import from_summary
state, who, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
summary = json.loads(sys.argv[4])
sys.stdin.readline()  # the go: both start at once
for i in range(count):
    summary["job"] = {"id": "p" + who, "step": str(i)}
    warnings = []
    environ = {"AGENT_STATE_DIR": str(state), "TMPDIR": str(state.parent / "tmp")}
    where = store.append(from_summary(summary, 1.0), environ, state, os.getuid(), warnings.append)
    assert where == state / "history.sqlite" and not warnings, (where, warnings)
"""


def test_two_processes_appending_at_once_both_recorded(tmp_path):
    state = tmp_path / "state"
    count = 25
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                APPENDER,
                str(state),
                str(who),
                str(count),
                json.dumps(SUMMARY_RESTART),
            ],
            stdin=subprocess.PIPE,
            env=env,
            text=True,
        )  # fmt: skip
        for who in (0, 1)
    ]
    for p in procs:  # both are blocked on stdin until now
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        p.stdin.close()
        assert p.wait(120) == 0
    jobs = store.read(state / "history.sqlite")
    for who in (0, 1):
        assert sorted(s.run for s in jobs if s.record.job_id == f"p{who}") == list(range(count))
    con = sqlite3.connect(state / "history.sqlite")
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert con.execute("SELECT count(*) FROM attempts").fetchone() == (2 * count * 2,)


def test_unwritable_database_falls_back_with_one_warning(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    state = blocker / "state"  # a directory under a regular file: cannot be made, even by root
    warnings: list[str] = []
    where = _append(state, SUMMARY_RESTART, warnings, TMPDIR=str(tmp_path / "tmp"))
    assert where == tmp_path / "tmp" / f"launch-agent-{os.getuid()}" / "history.sqlite"
    assert len(warnings) == 1 and str(state) in warnings[0] and str(where) in warnings[0]
    assert [s.record.job_id for s in store.read(where)] == ["78"]


def test_a_database_locked_too_long_falls_back_instead_of_waiting(tmp_path):
    state = tmp_path / "state"
    _append(state, SUMMARY_OK)
    holder = sqlite3.connect(state / "history.sqlite", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another job's transaction that does not end
    warnings: list[str] = []
    environ = {"AGENT_STATE_DIR": str(state), "TMPDIR": str(tmp_path / "tmp")}
    record = from_summary(SUMMARY_RESTART, NOW)
    started = time.monotonic()
    where = store.append(record, environ, state, os.getuid(), warnings.append, busy=0.2)
    assert time.monotonic() - started < 30  # a hang bound only; the wait is `busy` seconds
    assert where == tmp_path / "tmp" / f"launch-agent-{os.getuid()}" / "history.sqlite"
    assert len(warnings) == 1 and "locked" in warnings[0], warnings
    holder.execute("ROLLBACK")
    assert [s.record.job_id for s in store.read(state / "history.sqlite")] == ["77"]


def test_a_file_that_is_not_a_database_falls_back(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "history.sqlite").write_bytes(b"not a database" * 100)
    warnings: list[str] = []
    where = _append(state, SUMMARY_OK, warnings)
    assert where is not None and where.parent.name == f"launch-agent-{os.getuid()}"
    assert len(warnings) == 1


@pytest.mark.skipif(os.getuid() == 0, reason="root writes into a read-only directory")
def test_read_only_directory_falls_back(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o500)
    warnings: list[str] = []
    try:
        where = _append(state, SUMMARY_OK, warnings)
    finally:
        state.chmod(0o700)
    assert where is not None and where != state / "history.sqlite" and len(warnings) == 1


def test_nowhere_to_write_is_one_warning_not_an_exception(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    warnings: list[str] = []
    environ = {"AGENT_STATE_DIR": str(blocker / "s"), "TMPDIR": str(blocker / "t")}
    assert (
        store.append(from_summary(SUMMARY_OK, NOW), environ, tmp_path, 0, warnings.append) is None
    )
    assert len(warnings) == 1 and "not recorded" in warnings[0]


MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
40 27 0:50 / /home rw,relatime - nfs4 srv:/home rw,vers=4.2
41 40 0:51 / /home/a\\040b rw,relatime - lustre srv@tcp:/fs rw
42 27 0:52 / /homework rw,relatime - xfs /dev/sdb rw
"""


@pytest.mark.parametrize(
    "path, kind",
    [
        ("/", "ext4"),
        ("/tmp/x", "ext4"),
        ("/home", "nfs4"),
        ("/home/u/.cache/launch-agent", "nfs4"),
        ("/home/a b/state", "lustre"),
        ("/homework/state", "xfs"),  # a prefix of the string, not of the path
    ],
)
def test_filesystem_of_a_path(path, kind):
    assert store.filesystem_of(MOUNTINFO, path) == kind


def test_a_state_dir_others_can_write_is_not_written(tmp_path):
    """Another user could rewrite what the job records there: the job goes to the fallback,
    with one warning that says what to run (the same rule as the resident agents' files)."""
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)
    warnings: list[str] = []
    where = _append(state, SUMMARY_RESTART, warnings)
    assert where == tmp_path / "tmp" / f"launch-agent-{os.getuid()}" / "history.sqlite"
    assert not (state / "history.sqlite").exists()
    assert len(warnings) == 1 and "chmod go-w" in warnings[0], warnings


def test_history_sits_below_run_serve_launch():
    from test_structure import import_graph

    graph, _ = import_graph()
    for module, imports in graph.items():
        if module == "agent.history" or module.startswith("agent.history."):
            upward = [m for m in imports if m.split(".")[1] in ("run", "serve", "launch")]
            assert not upward, (module, upward)


# -- the CLI, as a user runs it ------------------------------------------------------------
def cli(tmp_path: Path, *argv: str, state: Path | None = None) -> subprocess.CompletedProcess:
    env = {
        "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO),
        "AGENT_STATE_DIR": str(state or tmp_path / "state"), "TMPDIR": str(tmp_path / "tmp"),
    }  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "agent", "history", *argv],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip


def test_cli_lists_shows_and_refuses(tmp_path):
    state = tmp_path / "state"
    assert "no jobs recorded" in cli(tmp_path).stdout
    for summary in (SUMMARY_OK, SUMMARY_RESTART, SUMMARY_EARLY):
        _append(state, summary)
    listed = cli(tmp_path)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert "3 job(s)" in lines[0] and "root cause" in lines[2]
    by_job = {line.split("│")[1].strip(): line for line in lines if line.startswith("│")}
    assert set(by_job) == {"77.0", "78.1", "79"}  # JOB.STEP; a summary without a step: JOB
    assert "exit code 3" in by_job["78.1"] and "│ 1 " in by_job["78.1"]  # cause, exit 1
    failed = cli(tmp_path, "--failed", "--json")
    assert [j["job"] for j in json.loads(failed.stdout)] == ["78.1", "79"]
    last = json.loads(cli(tmp_path, "--last", "1", "--json").stdout)
    assert [j["job_id"] for j in last] == ["79"]  # the one that ended last
    shown = cli(tmp_path, "78.1")
    assert shown.returncode == 0, shown.stderr
    assert "attempts of 78.1" in shown.stdout and "node 1 (n1) lost" in shown.stdout
    assert "spares used: n2" in shown.stdout
    assert cli(tmp_path, "78").stdout == shown.stdout  # JOB: all its steps and runs (one)
    for log_dir in ("/l/78", "78"):  # its log dir, by path or by name
        assert cli(tmp_path, log_dir).stdout == shown.stdout, log_dir
    for argv, words in (
        (["nope"], "no job nope recorded"),
        (["78.4"], "no job 78.4 recorded"),
        (["7"], "no job 7 recorded"),  # not a parent of 77.0
        (["--last", "x"], "--last 'x'"),
        (["--last", "-1"], "--last '-1'"),
        (["--bogus"], "unrecognized arguments"),
    ):
        bad = cli(tmp_path, *argv)
        assert bad.returncode == 2, (argv, bad.stderr)
        assert bad.stderr.count("\n") == 1 and words in bad.stderr, bad.stderr
        assert "Traceback" not in bad.stderr


@pytest.mark.e2e
def test_a_job_whose_script_name_is_not_utf8_is_recorded(tmp_path):
    """A careless user's file name (latin-1 bytes) reaches argv as a lone surrogate, which
    SQLite refuses: the job is recorded with the byte escaped, and `agent history` shows it."""
    script = os.path.join(os.fsencode(tmp_path), b"tr\xffain.py")
    with open(script, "w") as f:
        f.write("print('ran')\n")
    env = base_env(tmp_path)
    ran = subprocess.run(
        [sys.executable, "-m", "agent", script], cwd=tmp_path, env=env, capture_output=True,
        text=True, errors="replace", timeout=120,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert "not recorded" not in ran.stderr, ran.stderr
    listed = cli(tmp_path, "--json", state=tmp_path / "state")
    assert listed.returncode == 0, listed.stderr
    [job] = json.loads(listed.stdout)
    assert job["command"].endswith("tr\\udcffain.py"), job


def test_cli_reads_the_fallback_too(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    _append(blocker / "state", SUMMARY_RESTART, TMPDIR=str(tmp_path / "tmp"))
    listed = cli(tmp_path, "--json", state=blocker / "state")
    assert [j["job"] for j in json.loads(listed.stdout)] == ["78.1"], listed.stderr


def test_node_zero_records_every_job_of_a_long_lived_process(tmp_path):
    """A resident agent records run after run from one process (the hook is called repeatedly)."""
    from agent import history

    environ = {"AGENT_STATE_DIR": str(tmp_path / "state")}
    for summary in (SUMMARY_OK, SUMMARY_RESTART, SUMMARY_OK):
        assert history.record_job(summary, environ) == tmp_path / "state" / "history.sqlite"
    jobs = store.read(tmp_path / "state" / "history.sqlite")
    assert [(s.record.job_id, s.run) for s in jobs] == [("77", 0), ("78", 0), ("77", 1)]


def test_a_jobs_running_record_is_replaced_by_its_final_one(tmp_path):
    """Node 0 appends the job when it starts (status running) and again at its end: one row."""
    state = tmp_path / "state"
    node0 = {"host": "n0", "pid": 1, "machine": "m", "port": 5}
    started = {**SUMMARY_OK, "status": "running", "exit_code": None, "attempts": [],
               "node0": node0}  # fmt: skip
    other = {**started, "job": {**SUMMARY_OK["job"], "log_dir": "/l/77-2"}}
    for summary in (started, other):
        _append(state, summary)
    warned: list[str] = []
    running = store.read(state / "history.sqlite", warn=warned.append)
    assert [(s.record.status, s.record.exit_code, s.record.node0) for s in running] == [
        ("running", None, node0),
        ("running", None, node0),
    ]
    assert warned == []  # no exit code yet: a running record, not a row to skip
    _append(state, SUMMARY_OK)  # the end of the first: it takes its record's place
    jobs = store.read(state / "history.sqlite")
    assert [(s.record.log_dir, s.record.status, s.run) for s in jobs] == [
        ("/l/77", "succeeded", 0),
        ("/l/77-2", "running", 1),
    ]
    assert jobs[0].record.node0 is None
    (one,) = store.read(state / "history.sqlite", match=lambda r: r.log_dir == "/l/77")
    assert len(one.record.attempts) == 1
    con = sqlite3.connect(state / "history.sqlite")
    con.execute("UPDATE jobs SET run_id = ? WHERE log_dir = '/l/77-2'", (b"\xff",))
    con.execute("UPDATE jobs SET exit_code = NULL WHERE log_dir = '/l/77'")  # ended: not fit
    con.commit()
    con.close()
    assert store.read(state / "history.sqlite", match=lambda r: True, warn=warned.append) == []
    assert warned == [
        f"2 row(s) of {state / 'history.sqlite'} skipped: not as agent history writes them"
    ]


# One job per oddity, each as another program (or a hand) could have left it in the database:
# (job id, table, column, value). SQLite keeps whatever type it is given.
ODD_VALUES = [
    ("80", "jobs", "run", "x"),
    ("81", "jobs", "run", 1.5),
    ("82", "jobs", "step", 7),
    ("83", "jobs", "command", b"\xff\x00\x1b[2J"),
    ("84", "jobs", "start_time", "yesterday"),
    ("85", "jobs", "end_time", None),
    ("86", "jobs", "start_time", 1e300),
    ("87", "jobs", "nodes", "many"),
    ("88", "jobs", "exit_code", None),
    ("89", "jobs", "exit_code", "x"),
    ("90", "jobs", "status", "\x1b[2Jowned"),
    ("91", "jobs", "spares_used", '[1, null, {"x": 2}]'),
    ("92", "jobs", "spares_used", "not json"),
    ("93", "jobs", "restarts", None),
    ("94", "jobs", "stragglers", "[3]"),
    ("95", "jobs", "log_dir", 5),
    ("96", "jobs", "cause", b"\xfe"),
    ("97", "attempts", "attempt", "x"),
    ("98", "attempts", "start_time", "x"),
    ("99", "attempts", "spares", "[1]"),
    ("100", "attempts", "lost_nodes", '["a", null, 1e400]'),
    ("101", "attempts", "failed", None),
    ("102", "attempts", "cause", b"\xfe"),
    ("103", "attempts", "end_time", float("inf")),
    ("104", "jobs", "run_id", b"\xff\x1b[2J"),  # a blob (TEXT affinity makes a number text)
    ("105", "jobs", "node0", "[1]"),
]


def test_cli_survives_wrongly_typed_columns(tmp_path):
    """No traceback whatever the columns hold: a row that does not fit is skipped (one warning
    line) or shown with what fits; the other jobs are listed as ever."""
    state = tmp_path / "state"
    _append(state, SUMMARY_OK)
    for job_id, _, _, _ in ODD_VALUES:  # each in a log dir of its own, as a log dir holds one job
        job = {**SUMMARY_RESTART["job"], "id": job_id, "log_dir": f"/l/{job_id}"}
        _append(state, {**SUMMARY_RESTART, "job": job})
    con = sqlite3.connect(state / "history.sqlite")
    for job_id, table, column, value in ODD_VALUES:
        row = "SELECT id FROM jobs WHERE job_id = ?"
        where = f"id = ({row})" if table == "jobs" else f"attempt = 1 AND job = ({row})"
        con.execute(f"UPDATE {table} SET {column} = ? WHERE {where}", (value, job_id))
    con.commit()
    con.close()
    runs = [cli(tmp_path), cli(tmp_path, "--json"), cli(tmp_path, "--failed", "--last", "0")]
    runs += [cli(tmp_path, job_id) for job_id, table, _, _ in ODD_VALUES if table == "attempts"]
    runs += [cli(tmp_path, job_id, "--json") for job_id in ("90", "91", "100")]
    for run in runs:
        assert run.returncode in (0, 2), (run.args, run.stderr)
        assert "Traceback" not in run.stderr and run.stderr.count("\n") <= 1, run.stderr
        assert "\x1b" not in run.stdout, run.stdout
    listed, as_json = runs[0], json.loads(runs[1].stdout)
    assert "│ 77.0 " in listed.stdout  # the sound job
    assert "77" in [j["job_id"] for j in as_json]
    assert runs[1].stderr.count("skipped") == 1  # the rows that did not fit, said once
    shown = cli(tmp_path, "78")
    assert shown.returncode == 2 and "no job 78 recorded" in shown.stderr  # none such: fine


def _modes(state: Path) -> dict[str, str]:
    return {p.name: oct(p.stat().st_mode & 0o777) for p in state.glob("history.sqlite*")}


def test_the_database_and_its_wal_and_shm_are_private(tmp_path):
    """Every command line of this user is in them: 0600, whatever the umask, even where an
    older version left them 0644 (and open: its -wal and -shm exist)."""
    state, old = tmp_path / "state", tmp_path / "old"
    old.mkdir(mode=0o700)
    umask = os.umask(0o022)
    try:
        _append(state, SUMMARY_OK)
        reader = sqlite3.connect(state / "history.sqlite")  # keeps -wal and -shm in being
        reader.execute("SELECT count(*) FROM jobs").fetchone()
        _append(state, SUMMARY_RESTART)
        left = sqlite3.connect(old / "history.sqlite")  # as a version before this one did
        left.execute("PRAGMA journal_mode=WAL")
        left.execute("CREATE TABLE t (x)")
        assert set(_modes(old).values()) == {"0o644"} and len(_modes(old)) == 3
        _append(old, SUMMARY_OK)
    finally:
        os.umask(umask)
    names = ["history.sqlite", "history.sqlite-shm", "history.sqlite-wal"]
    assert _modes(state) == dict.fromkeys(names, "0o600")
    assert _modes(old) == dict.fromkeys(names, "0o600")
    reader.close()
    left.close()


SUMMARY_CLASSED = {
    **SUMMARY_RESTART,
    "job": {**SUMMARY_RESTART["job"], "max_restarts": 10, "max_infra_restarts": 3},
    "attempts": [
        {**SUMMARY_RESTART["attempts"][0], "failure": {"class": "infrastructure", "why": "lost"}},
        {**SUMMARY_RESTART["attempts"][1], "failure": {"class": "program", "why": "rank 1: x",
                                                       "signature": "exit code 3 from t.py"}},
    ],
}  # fmt: skip
# The schema before the restart budgets and failure classes (and before run_id, node0)
OLD_SCHEMA = (
    """CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, run INTEGER NOT NULL,
        step TEXT, command TEXT, start_time REAL, end_time REAL, nodes INTEGER, ranks INTEGER,
        spares_used TEXT, exit_code INTEGER, status TEXT, cause TEXT, restarts INTEGER,
        stragglers TEXT, log_dir TEXT)""",
    """CREATE TABLE attempts (
        job INTEGER NOT NULL, attempt INTEGER NOT NULL, start_time REAL, end_time REAL,
        nodes INTEGER, ranks INTEGER, failed INTEGER, spares TEXT, lost_nodes TEXT, cause TEXT,
        PRIMARY KEY (job, attempt))""",
    "INSERT INTO jobs VALUES (1, '70', 0, '0', 'old.py', 100, 110, 1, 1, '[]', 1, 'failed', "
    "'it broke', 1, '[]', '/l/70')",
    "INSERT INTO attempts VALUES (1, 0, 100, 105, 1, 1, 1, '[]', '[]', 'it broke')",
)


def test_budgets_and_each_attempts_class_in_the_rows_of_a_database_migrated_to_them(tmp_path):
    """A database an older version wrote gets the new columns at the next append; its old rows
    read as None there, the new job's budgets and attempt classes read back."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    con = sqlite3.connect(state / "history.sqlite")
    for statement in OLD_SCHEMA:
        con.execute(statement)
    con.commit()
    con.close()
    _append(state, SUMMARY_CLASSED)
    old, new = store.read(state / "history.sqlite", match=lambda record: True)
    assert (old.record.max_restarts, old.record.max_infra_restarts) == (None, None)
    assert [a.failure_class for a in old.record.attempts] == [None]
    assert old.record.cause == "it broke"
    assert (new.record.max_restarts, new.record.max_infra_restarts) == (10, 3)
    assert [a.failure_class for a in new.record.attempts] == ["program", "infrastructure"][::-1]
    assert new.record == from_summary(SUMMARY_CLASSED, NOW)


def test_a_guards_cause_reads_as_its_own_words():
    cause = {"kind": "same_failure", "how": "the same failure twice: ValueError at t.py:8; "
             "not restarting", "failure": CAUSE}  # fmt: skip
    record = from_summary({**SUMMARY_RESTART, "root_cause": cause}, NOW)
    assert record.cause == "the same failure twice: ValueError at t.py:8; not restarting"
