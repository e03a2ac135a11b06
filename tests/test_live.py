"""The live per-rank view on a terminal; plain, escape-free lines when redirected."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time

import pytest
from cluster import REPO, base_env

pytestmark = pytest.mark.e2e

SPIN = "import os, time\nfor i in range(4):\n    print('tick', i, flush=True); time.sleep(0.4)\n"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _run_in_pty(argv, env, cwd, timeout=90) -> tuple[int, str]:
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd, close_fds=True
    )
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child side closed
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(10), b"".join(chunks).decode("utf-8", "replace")


def test_live_view_renders_every_rank_and_the_log_lines(tmp_path):
    (tmp_path / "spin.py").write_text(SPIN)
    env = base_env(tmp_path)
    env.update({"COLUMNS": "120", "LINES": "40", "TERM": "xterm-256color"})
    code, screen = _run_in_pty(
        [sys.executable, "-m", "agent", "--nproc-per-node", "2", "spin.py"], env, tmp_path
    )
    assert code == 0, screen
    plain = ANSI.sub("", screen)
    assert "\x1b[" in screen  # it really drew on the terminal
    assert re.search(r"rank\s+host\s+state\s+pid\s+cpu %\s+rss\s+silent", plain), plain
    for rank in (0, 1):
        assert re.search(rf"^\s*{rank}\s+\S+\s+(running|exited 0)\s+\d+", plain, re.M), plain
        assert re.search(rf":{rank}: tick 3", plain), plain


def test_live_view_has_step_columns_with_a_step_group(tmp_path):
    (tmp_path / "spin.py").write_text(SPIN)
    env = base_env(tmp_path)
    env.update({"COLUMNS": "140", "LINES": "40", "TERM": "xterm-256color"})
    argv = [sys.executable, "-m", "agent", "--nproc-per-node", "2", "--progress-regex",
            r"tick (?P<step>\d+)", "spin.py"]  # fmt: skip
    code, screen = _run_in_pty(argv, env, tmp_path)
    assert code == 0, screen
    plain = ANSI.sub("", screen)
    assert re.search(r"silent\s+step\s+s/step\s+behind", plain), plain
    # every frame is the whole table: none drawn before the ranks and their steps were known
    headers = re.findall(r"rank\s+host\s+state\s+pid\s+cpu %\s+rss\s+silent(\s+step)?", plain)
    assert headers and all(headers), plain
    # a rank's row: its step, about 0.4 s per step, how many steps behind the furthest rank
    row = r"^\s*[01]\s+\S+\s+(running|exited 0)\s.*\s[1-3]\s+0\.[3-7]\d*\s+[0-2]\s*$"
    assert re.search(row, plain, re.M), plain
    # the last frame, drawn once both ranks ended: each at step 3, the last tick it printed
    # (`print('tick', i)` reaches the pipe in pieces: a pattern must see the whole line)
    last = plain.rsplit("s/step", 1)[1]
    for rank in (0, 1):
        assert re.search(rf"^\s*{rank}\s+\S+\s+exited 0\s.*\s3\s+0\.\d+\s+0\s*$", last, re.M), last


def test_redirected_output_has_no_escape_codes(tmp_path):
    (tmp_path / "spin.py").write_text(SPIN)
    proc = subprocess.run(
        [sys.executable, "-m", "agent", "--nproc-per-node", "2", "spin.py"],
        env=base_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        timeout=90,
    )
    assert proc.returncode == 0
    assert b"\x1b[" not in proc.stdout + proc.stderr
    assert proc.stdout.count(b": tick ") == 8


def test_a_pause_notice_is_a_line_of_its_own_above_the_table(tmp_path):
    """A rank pausing while the table is up: its notice stays on the screen, on a line of its
    own, and the table's header on another (a notice written past the table shared its last
    line, and the next redraw wiped it)."""
    go, log_dir = tmp_path / "go", tmp_path / "logs"
    env = base_env(tmp_path)
    env.update({"COLUMNS": "200", "LINES": "40", "TERM": "xterm-256color", "PAUSE_WHEN": str(go)})
    master, slave = pty.openpty()
    argv = [sys.executable, "-m", "agent", "--nproc-per-node", "2", "--log-dir", str(log_dir),
            str(REPO / "tests" / "fixtures" / "pause_job.py")]  # fmt: skip
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=tmp_path)
    os.close(slave)
    raw, went_on = b"", None
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the agent exited
            break
        raw += data
        plain = ANSI.sub("", raw.decode("utf-8", "replace"))
        if not go.exists() and "silent" in plain:  # the table is up: now rank 1 pauses
            go.touch()
        if went_on is None and "rank 1 paused at" in plain:  # the table redraws meanwhile
            went_on = subprocess.Popen(
                [sys.executable, "-m", "agent", "debug", str(log_dir), "--all", "-c", "c"],
                env=base_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
    os.close(master)
    assert proc.wait(30) == 0 and went_on is not None and went_on.wait(30) == 0
    lines = _screen(raw.decode("utf-8", "replace"))
    notice = [n for n, line in enumerate(lines) if line.startswith("rank 1 paused at ")]
    assert len(notice) == 1, "\n".join(lines)
    assert lines[notice[0]].endswith(f"python -m agent debug {log_dir} --rank 1"), lines
    header = r"rank\s+host\s+state\s+pid\s+cpu %\s+rss\s+silent"
    tables = [n for n, line in enumerate(lines) if re.fullmatch(header, line.strip())]
    assert len(tables) == 1 and tables[0] > notice[0], "\n".join(lines)  # one table, below it


def _screen(text: str) -> list[str]:
    """What a terminal shows after `text`: lines, with the cursor moves and line erasures
    rich's live display makes (up, erase line, carriage return); colours dropped."""
    lines, row, col = [""], 0, 0
    for token in re.findall(r"\x1b\[[0-9;?]*[A-Za-z]|\r|\n|[^\x1b\r\n]+", text):
        if token == "\r":
            col = 0
        elif token == "\n":
            row += 1
            lines += [""] * (row + 1 - len(lines))
        elif token.startswith("\x1b["):
            if token[-1] == "A":
                row = max(0, row - int(token[2:-1] or 1))
            elif token == "\x1b[2K":
                lines[row] = ""
        else:
            line = lines[row].ljust(col)
            lines[row] = line[:col] + token + line[col + len(token) :]
            col += len(token)
    return [line.rstrip() for line in lines if line.strip()]
