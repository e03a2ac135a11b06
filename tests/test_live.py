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
from cluster import base_env

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
    # a rank's row: its step, about 0.4 s per step, how many steps behind the furthest rank
    row = r"^\s*[01]\s+\S+\s+(running|exited 0)\s.*\s[1-3]\s+0\.[34]\d*\s+[0-2]\s*$"
    assert re.search(row, plain, re.M), plain


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
