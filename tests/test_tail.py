"""`python -m agent logs`: names, selection, lines (pure); printing, --summary, --follow in a pty."""

from __future__ import annotations

import io
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import logs as tail
from agent.logs import RankFile, Selection, Where
from agent.logs import follow as tail_follow
from agent.run.summary import RankExit, build_summary, rank_failure

REPO = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
WRITTEN = re.compile(r"line \d+ t=")  # the writer's lines, as opposed to the agent's notes
ALL = Selection(None, None, ("out", "err"), "latest", None)


# --- pure ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("rank-00003.out", RankFile(3, 0, "out", "rank-00003.out")),
        ("rank-00012.r2.err", RankFile(12, 2, "err", "rank-00012.r2.err")),
        ("rank-00003.error.json", None),
        ("rank-00003.out.tmp", None),
        ("agent-00000.log", None),
        ("summary.json", None),
    ],
)
def test_parse_name(name, parsed) -> None:
    assert tail.parse_name(name) == parsed


@pytest.mark.parametrize(
    ("file", "selection", "where", "following", "shown"),
    [
        (
            RankFile(1, 0, "err", ""),
            Selection(None, None, ("out",), "latest", None),
            {},
            False,
            False,
        ),
        (
            RankFile(2, 0, "out", ""),
            Selection(frozenset({1, 3}), None, ("out", "err"), "latest", None),
            {},
            False,
            False,
        ),
        (RankFile(1, 1, "out", ""), ALL, {}, False, True),
        (RankFile(1, 0, "out", ""), Selection(None, None, ("out",), "all", None), {}, False, True),
        (RankFile(1, 0, "out", ""), Selection(None, None, ("out",), 0, None), {}, False, True),
        (
            RankFile(1, 2, "out", ""),
            Selection(None, None, ("out",), "latest", None),
            {},
            True,
            True,
        ),
        (
            RankFile(1, 0, "out", ""),
            Selection(None, frozenset({1}), ("out",), "all", None),
            {1: Where("n2", 1)},
            False,
            True,
        ),
        (
            RankFile(1, 0, "out", ""),
            Selection(None, frozenset({0}), ("out",), "all", None),
            {1: Where("n2", 1)},
            False,
            False,
        ),
        (
            RankFile(1, 0, "out", ""),
            Selection(None, frozenset({0}), ("out",), "all", None),
            {},
            False,
            None,
        ),
    ],
)
def test_wanted(file, selection, where, following, shown) -> None:
    assert tail.wanted(file, selection, where, 1, following) is shown


def test_latest_attempt_alone_unless_following() -> None:
    first = RankFile(0, 0, "out", "")
    assert tail.wanted(first, ALL, {}, latest=1, following=False) is False
    assert tail.wanted(first, ALL, {}, latest=0, following=True) is True


@pytest.mark.parametrize(
    ("partial", "data", "lines", "rest"),
    [
        (b"", b"a\nb\n", [b"a", b"b"], b""),
        (b"he", b"llo\nwor", [b"hello"], b"wor"),
        (b"", b"no newline", [], b"no newline"),
        (b"", b"x" * (1 << 17), [b"x" * (1 << 17)], b""),
    ],
)
def test_split_lines(partial, data, lines, rest) -> None:
    assert tail.split_lines(partial, data) == (lines, rest)


def test_prefix() -> None:
    where = {3: Where("n1", 0)}
    assert tail.prefix(RankFile(3, 0, "out", ""), where, colour=False) == b"n1:3: "
    assert tail.prefix(RankFile(3, 1, "out", ""), where, colour=False) == b"n1:3.r1: "
    assert tail.prefix(RankFile(4, 0, "out", ""), where, colour=False) == b"rank 4: "
    assert tail.prefix(RankFile(3, 0, "out", ""), where, colour=True).startswith(b"\x1b[")


def test_where_from_each_source() -> None:
    assert tail.where_from_ranks_json(
        {"ranks": [{"rank": 0, "host": "n1", "node": 0}, {"rank": 1, "host": "n2"}]}
    ) == {0: Where("n1", 0), 1: Where("n2", None)}
    summary = {
        "attempts": [
            {
                "ranks": [
                    {"rank": 2, "host": "n2", "node_rank": 1},
                    {"rank": -1, "host": "n9", "node_rank": 3},
                ]
            }
        ]
    }
    assert tail.where_from_summary(summary) == {2: Where("n2", 1)}
    logs = [
        b"x INFO attempt 0: starting ranks 2-3 on n2\n",
        b"x INFO attempt 0: starting ranks 0-1 on n1\n",
    ]
    assert tail.where_from_agent_logs(logs) == {
        0: Where("n1", 0),
        1: Where("n1", 0),
        2: Where("n2", 1),
        3: Where("n2", 1),
    }
    assert tail.where_from_ranks_json(None) == tail.where_from_summary([]) == {}


@pytest.mark.parametrize(
    ("text", "count", "offset"),
    [
        (b"a\nb\nc\n", 1, 4),
        (b"a\nb\nc\n", 2, 2),
        (b"a\nb\nc", 1, 4),
        (b"a\nb\nc\n", 9, 0),
        (b"a\nb\n", 0, 4),
        (b"", 3, 0),
    ],
)
def test_last_lines_offset(tmp_path, text, count, offset) -> None:
    path = tmp_path / "f"
    path.write_bytes(text)
    assert tail_follow.last_lines_offset(str(path), count) == offset


# --- printing a finished job (in process) --------------------------------------------------


def _job(log_dir: Path, ranks_json: bool = True) -> Path:
    log_dir.mkdir(parents=True, exist_ok=True)
    for rank in range(4):
        (log_dir / f"rank-{rank:05d}.out").write_text(f"rank {rank} step 1\nrank {rank} step 2\n")
        (log_dir / f"rank-{rank:05d}.err").write_text(
            f"rank {rank} warning\n" + ("Boom" if rank == 3 else "")
        )
    if ranks_json:
        ranks = [{"rank": r, "host": f"n{r // 2 + 1}", "node": r // 2} for r in range(4)]
        (log_dir / "ranks.json").write_text(json.dumps({"ranks": ranks}))
    return log_dir


def _logs(*argv: str) -> tuple[int, str]:
    out = io.BytesIO()
    code = tail.main(list(argv), out=out, colour=False)
    return code, out.getvalue().decode()


def test_prints_every_rank_in_rank_order(tmp_path) -> None:
    code, text = _logs(str(_job(tmp_path)))
    assert code == 0
    assert text.splitlines() == [
        f"n{r // 2 + 1}:{r}: {line}"
        for r in range(4)
        for line in (f"rank {r} step 1", f"rank {r} step 2", f"rank {r} warning")
        + (("Boom",) if r == 3 else ())
    ]


def test_filters(tmp_path) -> None:
    log_dir = str(_job(tmp_path))
    assert (
        _logs(log_dir, "--rank", "1,3", "--stream", "err")[1]
        == "n1:1: rank 1 warning\nn2:3: rank 3 warning\nn2:3: Boom\n"
    )
    assert _logs(log_dir, "--node", "1", "--grep", r"step \d")[1].splitlines() == [
        "n2:2: rank 2 step 1",
        "n2:2: rank 2 step 2",
        "n2:3: rank 3 step 1",
        "n2:3: rank 3 step 2",
    ]
    assert (
        _logs(log_dir, "--rank", "0", "--stream", "out", "--no-prefix", "-n", "1")[1]
        == "rank 0 step 2\n"
    )


def test_attempts(tmp_path) -> None:
    log_dir = _job(tmp_path)
    (log_dir / "rank-00000.r1.out").write_text("again\n")
    assert _logs(str(log_dir), "--rank", "0")[1] == "n1:0.r1: again\n"
    assert (
        _logs(str(log_dir), "--rank", "0", "--attempt", "0", "--stream", "out")[1].count("\n") == 2
    )
    assert (
        _logs(str(log_dir), "--rank", "0", "--attempt", "all", "--stream", "out")[1].count("\n")
        == 3
    )


def test_hosts_from_agent_logs_or_none(tmp_path) -> None:
    log_dir = _job(tmp_path, ranks_json=False)
    assert _logs(str(log_dir), "--rank", "0", "--stream", "out")[1].startswith("rank 0: ")
    (log_dir / "agent-00000.log").write_text("2024 INFO attempt 0: starting ranks 0-1 on gpu7\n")
    assert _logs(str(log_dir), "--rank", "0", "--stream", "out")[1].startswith("gpu7:0: ")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["{dir}", "--rank", "1,x"], "--rank"),
        (["{dir}", "--grep", "("], "--grep"),
        (["{dir}/missing"], "does not exist"),
        (["{dir}", "--attempt", "last"], "--attempt"),
        (["{dir}", "--stream", "all"], "--stream"),
        (["{dir}", "--summary"], "no summary.json"),
    ],
)
def test_errors_are_one_line_exit_2(tmp_path, capsys, argv, needle) -> None:
    code, text = _logs(*(a.format(dir=_job(tmp_path)) for a in argv))
    err = capsys.readouterr().err
    assert (code, text) == (2, "")
    assert err.startswith("agent: error: ") and err.count("\n") == 1 and needle in err


def test_node_filter_needs_a_rank_map(tmp_path, capsys) -> None:
    code, _ = _logs(str(_job(tmp_path, ranks_json=False)), "--node", "0")
    assert code == 2 and "--node" in capsys.readouterr().err


def _summary(log_dir: Path) -> None:
    exits = [
        RankExit(
            r,
            r % 2,
            r // 2,
            f"n{r // 2 + 1}",
            100 + r,
            1 if r == 3 else -15,
            "failed" if r == 3 else "terminated",
            10.0,
            12.5,
            0,
        )
        for r in range(4)
    ]
    cause = rank_failure(
        exits[3], ["Traceback (most recent call last):", "ValueError: boom"], None
    ).to_json()
    attempts = [
        {"attempt": 0, "root_cause": cause, "ranks": [e.to_json() for e in exits], "lost_nodes": []}
    ]
    summary = build_summary({"id": "77", "step": "0", "nnodes": 2, "world_size": 4}, attempts, 1)
    (log_dir / "summary.json").write_text(json.dumps(summary))


def test_summary_root_cause_first(tmp_path) -> None:
    log_dir = _job(tmp_path)
    _summary(log_dir)
    code, text = _logs(str(log_dir), "--summary")
    assert code == 0 and "\x1b[" not in text
    lines = text.splitlines()
    assert lines[0] == "job failed (exit 1) after 1 attempt(s)"
    assert "rank 3 on n2 (node 1) exit code 1" in lines[2]
    assert text.index("ValueError: boom") < text.index("terminated")
    assert re.search(r"3\s+│\s+n2\s+│\s+1\s+│\s+failed\s+│\s+exit code 1", text)


def test_summary_lists_the_nccl_flight_recorder_dumps(tmp_path) -> None:
    log_dir = _job(tmp_path)
    _summary(log_dir)
    for name in ("nccl-trace.a0.rank-3", "nccl-trace.a0.rank-1"):
        (log_dir / name).write_bytes(b"\x80pickled by torch")
    code, text = _logs(str(log_dir), "--summary")
    assert code == 0
    listed = text[text.index("NCCL flight recorder dumps (2):") :].splitlines()[1:3]
    assert [line.strip() for line in listed] == [
        str(log_dir / "nccl-trace.a0.rank-1"),
        str(log_dir / "nccl-trace.a0.rank-3"),
    ]


def test_summary_without_dumps_says_nothing_of_them(tmp_path) -> None:
    log_dir = _job(tmp_path)
    _summary(log_dir)
    assert "flight recorder" not in _logs(str(log_dir), "--summary")[1]


# --- processes: redirected, pty, --help ----------------------------------------------------


def _agent_logs(*argv: str) -> list[str]:
    return [sys.executable, "-m", "agent", "logs", *argv]


def test_help_does_not_import_torch() -> None:
    probe = (
        "import sys\nfrom agent.__main__ import main\n"
        "for sub in ('logs', 'exec'):\n"
        "    try:\n        main([sub, '--help'])\n    except SystemExit as e:\n        assert e.code == 0\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "--follow" in done.stdout and "--timeout" in done.stdout


@pytest.mark.e2e  # a real `agent logs --follow`, waiting out its own clocks
def test_redirected_follow_partial_lines_and_job_end(tmp_path) -> None:
    """Piped: no colour; a partial line shows once its file stops growing; summary.json ends it."""
    log_dir = _job(tmp_path)
    proc = subprocess.Popen(
        _agent_logs(str(log_dir), "--follow", "--rank", "3", "--interval", "0.05"),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    seen = _Reader(proc.stdout.fileno())
    seen.until(lambda t: "n2:3: Boom\n" in t, 5.0)  # the unterminated last line, flushed when stale
    with open(log_dir / "rank-00003.err", "a") as f:
        f.write("ing on\nhalf")
    seen.until(lambda t: "n2:3: ing on\n" in t, 2.0)
    _summary(log_dir)
    assert proc.wait(timeout=5) == 0
    seen.until(lambda t: t.endswith("n2:3: half\n"), 2.0)
    assert "\x1b[" not in seen.text and "rank 2" not in seen.text
    assert proc.stderr is not None and proc.stderr.read() == b""


_WRITER = r"""
import json, os, sys, time
log_dir = sys.argv[1]
os.makedirs(log_dir)
with open(os.path.join(log_dir, "ranks.json"), "w") as f:
    json.dump({"ranks": [{"rank": r, "host": f"n{r // 2 + 1}", "node": r // 2} for r in range(4)]}, f)
files = {r: open(os.path.join(log_dir, f"rank-{r:05d}.out"), "a") for r in range(4)}
for i in range(10**6):
    for r, f in files.items():
        f.write(f"rank {r} line {i} t={time.time():.3f}\n")
        f.flush()
    time.sleep(0.1)
"""


@pytest.mark.e2e  # a real `agent logs --follow`, waiting out its own clocks
def test_follow_in_a_terminal(tmp_path) -> None:
    """Waits for a job that has not started, shows ranks 1 and 3 only, in colour, within 1 s."""
    log_dir = tmp_path / "job"  # does not exist yet
    master, slave = os.openpty()
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    logs = subprocess.Popen(
        _agent_logs(str(log_dir), "--follow", "--rank", "1,3", "--interval", "0.1"),
        cwd=REPO,
        env=env,
        stdin=slave,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    screen = _Reader(master)
    writer = None
    try:
        screen.until(lambda t: "waiting for" in t, 10.0)
        writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(log_dir)])
        screen.until(lambda t: "rank 1 line 8 " in t and "rank 3 line 8 " in t, 10.0)
        assert logs.poll() is None
        assert "\x1b[" in screen.text
        lines = [
            ANSI.sub("", line)
            for line in screen.text.replace("\r", "").splitlines()
            if WRITTEN.search(line)
        ]
        assert {line.split(": ", 1)[0] for line in lines} == {"n1:1", "n2:3"}
        delays = [
            screen.arrived[i] - float(line.rsplit("t=", 1)[1])
            for i, line in enumerate(lines)
            if i in screen.arrived
        ]
        assert delays and max(delays) < 10, delays  # lines arrive as written, not at the end
        logs.send_signal(signal.SIGINT)
        assert logs.wait(timeout=5) == 0
        screen.until(lambda t: False, 0.3)  # whatever it printed while exiting
        assert "Traceback" not in screen.text and "KeyboardInterrupt" not in screen.text
    finally:
        for proc in (writer, logs):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        os.close(master)


class _Reader:
    """Reads a pty or pipe with deadlines; remembers when each complete line arrived."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.text = ""
        self.arrived: dict[int, float] = {}  # index among the writer's lines → when it arrived
        self._count = 0

    def until(self, done, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not done(self.text):
            left = deadline - time.monotonic()
            if left <= 0:
                if timeout >= 1.0:
                    raise AssertionError(f"timed out; got so far:\n{self.text[-2000:]}")
                return
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                continue
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # EIO: the pty's other side is closed
                chunk = b""
            if not chunk:
                if not done(self.text) and timeout >= 1.0:
                    raise AssertionError(f"output ended; got:\n{self.text[-2000:]}")
                return
            self._note(chunk.decode("utf-8", "replace"))

    def _note(self, chunk: str) -> None:
        now = time.time()
        before = self.text.count("\n")
        self.text += chunk
        for line in self.text.split("\n")[before:-1]:
            if WRITTEN.search(line):
                self.arrived[self._count] = now
                self._count += 1
