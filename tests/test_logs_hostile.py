"""`python -m agent logs` against careless and hostile log dirs: --follow ends when the job is
gone, files are read bounded, metadata from files is printed escaped, rank sets are only asked
`in`."""

from __future__ import annotations

import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import logs as tail
from agent.logs import RankFile, Selection, Where
from agent.logs.ending import Ending, local_writers
from agent.logs.follow import Tail
from agent.logs.logdir import MAX_JSON, read_json
from agent.logs.selection import LogsCommand, safe_text, selected
from agent.logs.summary_view import summary_view
from agent.plan.rank_set import parse_rank_set

REPO = Path(__file__).resolve().parents[1]
HERE = socket.gethostname()


def _job(log_dir: Path, host: str = "n1") -> Path:
    log_dir.mkdir(parents=True, exist_ok=True)
    for rank in range(2):
        (log_dir / f"rank-{rank:05d}.out").write_text(f"rank {rank} hello\n")
    (log_dir / "agent-00000.log").write_text(f"x INFO attempt 0: starting ranks 0-1 on {host}\n")
    ranks = [{"rank": r, "host": host, "node": 0} for r in range(2)]
    (log_dir / "ranks.json").write_text(json.dumps({"ranks": ranks}))
    return log_dir


def _logs(*argv: str) -> tuple[int, str]:
    out = io.BytesIO()
    code = tail.main(list(argv), out=out, colour=False)
    return code, out.getvalue().decode()


def _agent_logs(*argv: str) -> list[str]:
    return [sys.executable, "-m", "agent", "logs", *argv]


def _run(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        _agent_logs(*argv), cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


# --- 1. --follow ends without summary.json -------------------------------------------------


def _drive(ending: Ending, names: list[str], until: float, grew_at=()) -> tuple[float, str] | None:
    """Feed one poll a second from t=0 to `until`; when and why it said stop, or None."""
    for now in range(int(until) + 1):
        why = ending.why(names, now in grew_at, float(now))
        if why is not None:
            return now, why
    return None


@pytest.mark.parametrize(
    ("host", "answers", "idle_exit", "until", "grew_at", "stops_at", "because"),
    [
        pytest.param(HERE, [False], 600, 700, (), 2, "job is over", id="died-here"),
        pytest.param("n1", [False], 600, 700, (), 600, "--idle-exit", id="elsewhere-idle"),
        pytest.param("n1", [False], 0, 5000, (), None, None, id="idle-exit-0-never"),
        pytest.param("n1", [True, True, False], 600, 700, (), 8, "job is over", id="writer-gone"),
        pytest.param(HERE, [True], 600, 590, (), None, None, id="writer-alive"),
        pytest.param(HERE, [None], 600, 700, (), 600, "--idle-exit", id="cannot-tell"),
        pytest.param("n1", [False], 10, 30, range(0, 31, 3), None, None, id="bytes-keep-coming"),
        pytest.param("n1", [False], 10, 60, range(0, 21), 30, "--idle-exit", id="bytes-stop"),
    ],
)
def test_ending_rules(tmp_path, host, answers, idle_exit, until, grew_at, stops_at, because):
    """answers: what each look at this machine's processes finds (the last one repeats)."""
    log_dir = _job(tmp_path / "job", host)
    looks: list[str] = []

    def writers(path: str) -> bool | None:
        assert path == str(log_dir)
        looks.append(path)
        return answers[min(len(looks), len(answers)) - 1]

    ending = Ending(str(log_dir), idle_exit, writers)
    stopped = _drive(ending, os.listdir(log_dir), until, set(grew_at))
    if stops_at is None:
        assert stopped is None
    else:
        assert stopped is not None and stopped[0] == stops_at and because in stopped[1]
    assert len(looks) <= 2 + until / 2  # looks back off: not one per poll


def test_ending_waits_for_a_job_that_has_not_started(tmp_path) -> None:
    ending = Ending(str(tmp_path / "later"), 1, lambda _: False)
    assert _drive(ending, [], 10_000) is None


def test_bytes_in_a_file_not_shown_keep_it_going(tmp_path) -> None:
    log_dir = _job(tmp_path / "job")
    ending = Ending(str(log_dir), 10, lambda _: False)
    for now in range(40):  # rank 1 (not shown: grew=False) writes a line every 3 s
        if now % 3 == 0:
            with open(log_dir / "rank-00001.out", "a") as f:
                f.write(f"line {now}\n")
        assert ending.why(os.listdir(log_dir), False, float(now)) is None


def _holder(path: Path, mode: str) -> subprocess.Popen:
    """A process that holds `path` open in `mode` until its stdin closes; started when it says so."""
    code = f"import sys\nf = open({str(path)!r}, {mode!r})\nprint('ready', flush=True)\nsys.stdin.read()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def _release(proc: subprocess.Popen) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=30)


def test_local_writers_sees_processes_that_write_to_the_log_dir(tmp_path) -> None:
    log_dir = _job(tmp_path / "job")
    assert local_writers(str(log_dir)) is False
    reader = _holder(log_dir / "rank-00000.out", "r")
    try:
        assert local_writers(str(log_dir)) is False  # `tail -f`, another `agent logs`: not the job
        writer = _holder(log_dir / "agent-00000.log", "a")
        assert local_writers(str(log_dir)) is True
        _release(writer)
        assert local_writers(str(log_dir)) is False
    finally:
        _release(reader)


@pytest.mark.e2e  # a real `agent logs --follow`, waiting out its own clocks
def test_follow_of_a_job_that_died_here_ends(tmp_path) -> None:
    """ranks.json names this machine, nothing writes to the dir, no summary.json: it ends."""
    log_dir = _job(tmp_path / "job", HERE)
    done = _run(str(log_dir), "--follow", "--interval", "0.05", timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{HERE}:0: rank 0 hello", f"{HERE}:1: rank 1 hello"]
    assert "the job is over" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.e2e  # a real `agent logs --follow`, waiting out its own clocks
def test_follow_idle_exit(tmp_path) -> None:
    log_dir = _job(tmp_path / "job", "n1")  # elsewhere: only the idle time can end it
    done = _run(str(log_dir), "--follow", "--interval", "0.05", "--idle-exit", "1", timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--idle-exit" in done.stderr and done.stdout.count("\n") == 2


@pytest.mark.e2e  # a real `agent logs --follow`, waiting out its own clocks
def test_follow_ends_when_the_local_writer_exits(tmp_path) -> None:
    """The job's agent runs here (seen holding its log), then dies without summary.json."""
    log_dir = _job(tmp_path / "job", "n1")
    code = (
        "import sys\nf = open(sys.argv[1], 'a', buffering=1)\n"
        "for line in sys.stdin:\n    f.write(line)\n"
    )
    writer = subprocess.Popen(
        [sys.executable, "-c", code, str(log_dir / "rank-00000.out")],
        stdin=subprocess.PIPE,
        text=True,
    )
    follow = subprocess.Popen(
        _agent_logs(str(log_dir), "--follow", "--interval", "0.05"),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert follow.stdout is not None and writer.stdin is not None
        seen = _Reader(follow.stdout.fileno())
        seen.until("n1:1: rank 1 hello\n", 30)  # first poll printed: its look at processes follows
        writer.stdin.write("second\n")
        writer.stdin.flush()
        seen.until("n1:0: second\n", 30)  # a later poll: the first look saw the writer
        assert follow.poll() is None
        _release(writer)
        assert follow.wait(timeout=60) == 0
        assert follow.stderr is not None and b"the job is over" in follow.stderr.read()
    finally:
        for proc in (writer, follow):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_ctrl_c_still_exits_cleanly(tmp_path) -> None:
    log_dir = _job(tmp_path / "job", "n1")
    follow = subprocess.Popen(
        _agent_logs(str(log_dir), "--follow", "--interval", "0.05"),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert follow.stdout is not None and follow.stderr is not None
    _Reader(follow.stdout.fileno()).until("n1:1: rank 1 hello\n", 30)
    follow.send_signal(signal.SIGINT)
    assert follow.wait(timeout=30) == 0
    assert follow.stderr.read() == b""


class _Reader:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.text = ""

    def until(self, needle: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for {needle!r}; got:\n{self.text}"
            if select.select([self.fd], [], [], left)[0]:
                chunk = os.read(self.fd, 65536)
                assert chunk, f"output ended before {needle!r}; got:\n{self.text}"
                self.text += chunk.decode("utf-8", "replace")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--follow", "--idle-exit", "-1"], "--idle-exit"),
        (["--follow", "--idle-exit", "nan"], "--idle-exit"),
        (["--rank", "x"], "--rank"),
        (["--rank", "1-x"], "--rank"),
        (["--rank", "1.5"], "--rank"),
        (["--node", "a-b"], "--node"),
    ],
)
def test_bad_options_are_one_line_exit_2(tmp_path, capsys, argv, needle) -> None:
    code, text = _logs(str(_job(tmp_path / "job")), *argv)
    err = capsys.readouterr().err
    assert (code, text) == (2, "")
    assert err.startswith("agent: error: ") and err.count("\n") == 1 and needle in err


# --- 2. JSON read bounded ------------------------------------------------------------------


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def _write(path: Path, content: str | bytes | None) -> None:
    if content is None:
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)


HOSTILE_JSON = [
    pytest.param(_deep(100_000), "nested deeper", id="deep-100000"),
    pytest.param('{"a":' * 50_000 + "1" + "}" * 50_000, "nested deeper", id="deep-dicts"),
    pytest.param('{"ranks": ' + _deep(65) + "}", "nested deeper", id="deep-65"),
    pytest.param(b"\xff\xfe\xfa{", "not JSON", id="not-utf8"),
    pytest.param('{"ranks": [{"rank": ' + "1" * 5000 + "}]}", "not JSON", id="huge-int"),
    pytest.param("", "not JSON", id="empty"),
    pytest.param(None, "not a regular file", id="a-directory"),
]


@pytest.mark.parametrize(("content", "why"), HOSTILE_JSON)
def test_hostile_json_is_refused_or_ignored(tmp_path, capsys, content, why) -> None:
    log_dir = _job(tmp_path / "job")
    for name in ("ranks.json", "summary.json"):
        (log_dir / name).unlink(missing_ok=True)
        _write(log_dir / name, content)
    (log_dir / "agent-00000.log").unlink()
    assert _logs(str(log_dir), "--rank", "0") == (0, "rank 0: rank 0 hello\n")  # map ignored
    code, text = _logs(str(log_dir), "--summary")
    err = capsys.readouterr().err
    assert (code, text) == (2, "")
    assert err.startswith(f"agent: error: cannot read {log_dir / 'summary.json'}: ")
    assert err.count("\n") == 1 and why in err


def test_json_larger_than_the_cap(tmp_path) -> None:
    path = tmp_path / "summary.json"
    with open(path, "wb") as f:
        f.truncate(MAX_JSON + 1)  # sparse: costs no disk
    with pytest.raises(ValueError, match="larger than 64 MiB"):
        read_json(str(path))


def test_fifo_named_like_a_json_or_rank_file_does_not_hang(tmp_path) -> None:
    log_dir = _job(tmp_path / "job")
    for name in ("ranks.json", "summary.json", "agent-00000.log", "rank-00001.out"):
        (log_dir / name).unlink(missing_ok=True)
        os.mkfifo(log_dir / name)
    (log_dir / "rank-00002.out").mkdir()
    done = _run(str(log_dir), "-n", "1", timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "rank 0: rank 0 hello\n", "")
    done = _run(str(log_dir), "--summary", timeout=60)
    assert done.returncode == 2 and "not a regular file" in done.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_rank_file_is_said_once(tmp_path) -> None:
    log_dir = _job(tmp_path / "job")
    (log_dir / "rank-00000.out").chmod(0)
    done = _run(str(log_dir), timeout=60)
    assert done.returncode == 0 and done.stdout == "n1:1: rank 1 hello\n"
    assert done.stderr.count("cannot read") == 1 and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("source", "data"),
    [
        (tail.where_from_ranks_json, {"ranks": 5}),
        (tail.where_from_ranks_json, {"ranks": "n1"}),
        (tail.where_from_ranks_json, {"ranks": [{"rank": True, "host": "n1"}]}),
        (tail.where_from_ranks_json, {"ranks": [{"rank": 0, "host": "n" * 300}]}),
        (tail.where_from_summary, {"attempts": 5}),
        (tail.where_from_summary, {"attempts": [{"ranks": 5}]}),
        (tail.where_from_summary, {"attempts": [{"ranks": {"rank": 0, "host": "n1"}}]}),
    ],
)
def test_rank_maps_of_the_wrong_shape_name_nothing(source, data) -> None:
    assert source(data) == {}


@pytest.mark.parametrize(
    "line",
    [
        b"attempt 0: starting ranks 0-9999999999 on n1\n",  # would be 10^10 entries
        b"attempt 0: starting ranks 0-999999999 on n1\n",
        b"attempt 0: starting ranks " + b"1" * 5000 + b" on n1\n",  # int() refuses 5000 digits
        b"attempt 0: starting ranks 7-3 on n1\n",
    ],
)
def test_agent_log_lines_claiming_absurd_ranks_are_ignored(line) -> None:
    assert tail.where_from_agent_logs([line]) == {}


# --- 3. metadata from files is printed escaped ---------------------------------------------


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("n1", "n1"),
        ("\x1b[2J\x1b]0;owned\x07n1", "\\x1b[2J\\x1b]0;owned\\x07n1"),
        ("a\tb\nc\rd\x00\x7f\x9b", "a\\x09b\\x0ac\\x0dd\\x00\\x7f\\x9b"),
        ("evil\u202egnp.exe", "evil\\u202egnp.exe"),
        ("line\u2028break", "line\\u2028break"),
        ("\ud800", "\\ud800"),
        ("ünïcödé 名前", "ünïcödé 名前"),
        ("no\xa0break\u3000space", "no\xa0break\u3000space"),  # not printable, yet harmless
        (["x", 1], "['x', 1]"),
        ("x" * 300, "x" * 256 + "…"),
    ],
)
def test_safe_text(value, shown) -> None:
    assert safe_text(value) == shown


def test_safe_text_keeps_tabs_if_asked() -> None:
    assert safe_text("a\tb\x1b", tabs=True) == "a\tb\\x1b"


def test_hosts_are_escaped_but_rank_lines_are_not(tmp_path) -> None:
    log_dir = _job(tmp_path / "job", "\x1b]0;owned\x07n1\x1b[2J")
    (log_dir / "rank-00000.out").write_text("\x1b[31mred\x1b[0m\n")
    code, text = _logs(str(log_dir), "--rank", "0")
    assert code == 0
    assert text == "\\x1b]0;owned\\x07n1\\x1b[2J:0: \x1b[31mred\x1b[0m\n"
    (log_dir / "ranks.json").unlink()  # the agent log names the same host: escaped too
    assert _logs(str(log_dir), "--rank", "0")[1].startswith("\\x1b]0;owned\\x07n1\\x1b[2J:0: ")
    assert (
        tail.prefix(RankFile(0, 0, "out", ""), {0: Where("\x1b[2J", 0)}, False) == b"\\x1b[2J:0: "
    )


EVIL = "\x1b]0;owned\x07[bold red]x[/] [/oops]\x1b[2J\u202e\ud800"
HOSTILE_SUMMARIES = [
    pytest.param({"status": EVIL, "exit_code": EVIL, "attempts": EVIL}, id="strings"),
    pytest.param({"attempts": 5, "root_cause": [], "job": 3}, id="wrong-types"),
    pytest.param(
        {
            "attempts": [
                {"attempt": EVIL, "root_cause": {"kind": "rank", "host": EVIL, "how": EVIL}},
                {"attempt": EVIL, "ranks": 5},
            ],
            "root_cause": {"kind": EVIL, "host": EVIL, "stderr_tail": {"a": EVIL}},
            "job": {"id": EVIL, "log_dir": [EVIL], "nnodes": {"x": EVIL}},
        },
        id="nested",
    ),
    pytest.param(
        {
            "attempts": [
                {
                    "ranks": [
                        {"rank": EVIL, "host": EVIL, "node_rank": [1], "state": EVIL, "how": EVIL},
                        {"rank": 1.5, "start": 1, "end": 10**400},
                        {"rank": [0], "start": True, "end": float("inf")},
                        {"rank": -1, "host": 7, "state": None},
                        EVIL,
                    ]
                }
            ],
            "root_cause": {"kind": "rank", "traceback": EVIL + "\n\tline\x1b[0m"},
        },
        id="ranks",
    ),
]


@pytest.mark.parametrize("summary", HOSTILE_SUMMARIES)
@pytest.mark.parametrize("selection", [[], ["--rank", "0-3"], ["--node", "0"]])
def test_hostile_summary_is_shown_escaped(tmp_path, capsys, summary, selection) -> None:
    log_dir = _job(tmp_path / "job")
    (log_dir / "summary.json").write_text(json.dumps(summary))
    code, text = _logs(str(log_dir), "--summary", *selection)
    assert code == 0, capsys.readouterr().err
    assert not any(c in text for c in "\x1b\x07\u202e\ud800")
    if "owned" in json.dumps(summary):
        assert "\\x1b]0;owned\\x07[bold red]x[/] [/oops]" in text  # no rich markup either


# --- 4. rank selections are only asked `in` ------------------------------------------------


class _Range:
    """A rank set that can only be asked `in`, as a range-based parse_rank_set result would be."""

    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int) and self.low <= value <= self.high

    def __iter__(self):
        raise AssertionError("agent logs iterated over a rank selection")

    def __len__(self) -> int:
        raise AssertionError("agent logs took len() of a rank selection")


@pytest.mark.parametrize("follow", [False, True])
def test_rank_and_node_sets_are_only_asked_in(tmp_path, follow) -> None:
    log_dir = _job(tmp_path / "job")
    (log_dir / "summary.json").write_text("{}")  # present at start: following waits for a new one
    huge = _Range(1, 10**10)
    selection = Selection(huge, _Range(0, 10**10), ("out", "err"), "latest", None)
    out = io.BytesIO()
    command = LogsCommand(str(log_dir), selection, follow, False, True, None, 0.01, 0.5)
    assert Tail(command, out, colour=False).run() == 0  # following: ends after --idle-exit 0.5
    assert out.getvalue() == b"n1:1: rank 1 hello\n"
    summary = {"attempts": [{"ranks": [{"rank": r, "host": "n1", "node_rank": 0} for r in (0, 1)]}]}
    assert len(summary_view(summary, selection)) == 2


@pytest.mark.parametrize(
    ("value", "chosen", "shown"),
    [
        (3, None, True),
        ("x", None, True),
        (3, _Range(0, 10**12), True),
        (-1, _Range(0, 10**12), False),
        (True, _Range(0, 10**12), False),
        ([3], _Range(0, 10**12), False),
        ([3], frozenset({3}), False),  # unhashable: no TypeError
        ({"a": 1}, frozenset({3}), False),
    ],
)
def test_selected(value, chosen, shown) -> None:
    assert selected(value, chosen) is shown


_MATERIALISES = isinstance(parse_rank_set("0-3", "--rank"), (set, frozenset))


@pytest.mark.skipif(_MATERIALISES, reason="agent.plan.ranks.parse_rank_set still builds the set")
@pytest.mark.parametrize("option", ["--rank", "--node"])
def test_huge_rank_ranges_in_bounded_memory(tmp_path, option) -> None:
    """Under a 1 GiB address-space limit, so that a set of 10^10 ranks fails fast."""
    log_dir = _job(tmp_path / "job")
    limit = (
        "import resource, runpy, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "sys.argv = ['agent', *sys.argv[1:]]\n"
        "runpy.run_module('agent', run_name='__main__')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", limit, "logs", str(log_dir), option, "0-9999999999"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "n1:0: rank 0 hello\nn1:1: rank 1 hello\n"
