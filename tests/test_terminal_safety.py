"""Text that reaches the terminal from files, the environment, the store or the network is shown,
never interpreted; a state dir another user could write to is refused (exit 2, the fix named)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cluster import FIXTURE, base_env, slurm_env

from agent.control import connection
from agent.text import ESCAPED, printable

ESC = "\x1b"


@pytest.mark.parametrize(
    ("text", "shown", "one_line"),
    [
        ("plain host-1.example", "plain host-1.example", False),
        ("\x1b[2J127.0.0.1", "\\x1b[2J127.0.0.1", False),  # clear screen
        ("\x1b]0;owned\x07", "\\x1b]0;owned\\x07", False),  # window title, bell
        ("a\rb\x08c\x00", "a\\x0db\\x08c\\x00", False),  # carriage return, backspace, NUL
        ("\x9b31m", "\\x9b31m", False),  # C1 CSI
        ("del\x7f", "del\\x7f", False),
        ("evil\u202etxt.exe", "evil\\u202etxt.exe", False),  # right-to-left override
        ("two\nlines\tand a tab", "two\nlines\tand a tab", False),
        ("two\nlines\tand a tab", "two\\x0alines\\x09and a tab", True),
        ("ünïcödé ✓", "ünïcödé ✓", False),
        ("no\xa0break\u3000space", "no\xa0break\u3000space", False),  # unprintable, harmless
        ("line\u2028break\u2029", "line\\u2028break\\u2029", False),  # line separators
        ("a\u200fb\u061cc", "a\\u200fb\\u061cc", False),  # right-to-left and Arabic marks
        ("tr\udcffain.py", "tr\\udcffain.py", False),  # a file name's non-UTF-8 byte
    ],
)
def test_printable(text, shown, one_line) -> None:
    assert printable(text, one_line=one_line) == shown


def test_every_code_point_printable_escapes_is_one_python_calls_unprintable() -> None:
    """printable returns printable text as it is, without its table: right only while no code
    point the table escapes is printable, and each one it holds is escaped."""
    assert len(ESCAPED) > 2048  # the C0 and C1 controls, the surrogates, the direction marks
    assert [hex(c) for c in sorted(ESCAPED) if chr(c).isprintable()] == []
    assert all(printable(chr(c), one_line=True) != chr(c) for c in ESCAPED)


@pytest.mark.parametrize(
    ("mode", "other_owner", "fragment"),
    [
        (0o700, False, None),
        (0o755, False, None),
        (0o777, False, "`chmod go-w "),
        (0o1777, False, "`chmod go-w "),  # sticky like /tmp: still anyone's to fill
        (0o720, False, "`chmod go-w "),
        (0o700, True, "`chown "),
    ],
)
def test_a_state_dir_must_be_the_users_own_and_not_writable_by_others(
    tmp_path, mode, other_owner, fragment
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, mode)
    uid = os.getuid() + 1 if other_owner else None  # as another user would see this dir
    problem = connection.dir_problem(state, uid)
    if fragment is None:
        assert problem == ""
    else:
        assert fragment in problem and str(state) in problem and "\n" not in problem
    assert connection.dir_problem(tmp_path / "absent") == ""  # created 0700 when written


def _agent(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agent", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.e2e
def test_an_open_state_dir_is_refused_by_the_clients(tmp_path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o777)
    env = {**base_env(tmp_path), "AGENT_STATE_DIR": str(state), "SLURM_JOB_ID": "5"}
    done = _agent(["status"], env, tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and f"`chmod go-w {state}`" in done.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("where", ["control.json host", "SLURMD_NODENAME"])
def test_escape_codes_from_files_and_env_reach_the_terminal_escaped(tmp_path, where) -> None:
    env = base_env(tmp_path)
    if where == "control.json host":
        log_dir = tmp_path / "logs"
        log_dir.mkdir(mode=0o700)
        record = {"host": "\x1b[2J127.0.0.1", "port": 9, "job": "5", "step": "0"}
        record |= {"pid": 1, "hostname": "\x1b]0;owned\x07", "started": 1.0}
        (log_dir / "control.json").write_text(json.dumps(record))
        done = _agent(["stacks", str(log_dir)], env, tmp_path)
        assert done.returncode == 3, done.stderr
    else:
        env |= slurm_env("5", 1, 0) | {"SLURMD_NODENAME": "\x1b[2J\x1b[31mevil"}
        done = _agent(["--nproc-per-node", "1", FIXTURE], env, tmp_path)
        assert done.returncode == 2, done.stderr
        assert "SLURMD_NODENAME=\\x1b[2J\\x1b[31mevil" in done.stderr
    assert ESC not in done.stderr + done.stdout and "\x07" not in done.stderr
    assert "\\x1b[2J" in done.stderr and done.stderr.count("\n") == 1, done.stderr
