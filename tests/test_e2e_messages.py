"""What the user is told is true: each hint names a command that works, as real processes."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest
from cluster import base_env, wait_for

pytestmark = pytest.mark.e2e


def _client(argv: list[str], env: dict[str, str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_serve_outside_slurm_names_the_client_command_that_works(tmp_path):
    env = base_env(tmp_path)  # no SLURM_*, no job id: the local world
    env.pop("AGENT_JOB_ID", None)
    err = tmp_path / "serve.err"
    with open(err, "wb") as e:
        serve = subprocess.Popen(
            [sys.executable, "-m", "agent", "serve", "--cold"], env=env, cwd=tmp_path,
            stdout=subprocess.DEVNULL, stderr=e, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    try:
        said = re.compile(r"clients: `([^`]+)`")
        wait_for(lambda: said.search(err.read_text()), 90, "serve to name its clients")
        hint = said.search(err.read_text()).group(1)
        assert "--serve" not in hint, hint
        words = shlex.split(hint)
        assert words[-1] == "run|status|down", hint
        assigns = [w for w in words if "=" in w and not w.startswith("-")]
        settings = dict(w.split("=", 1) for w in assigns)
        command = [sys.executable if w == "python" else w for w in words if w not in assigns]
        shell = {k: v for k, v in env.items() if k != "AGENT_STATE_DIR"} | settings
        status = _client([*command[:-1], "status"], shell, tmp_path)
        assert status.returncode == 0, status.stderr
        assert "1 resident agent" in status.stdout, status.stdout
        down = _client([*command[:-1], "down"], shell, tmp_path)
        assert down.returncode == 0 and "stopped 1 resident agent" in down.stdout, down.stderr
        assert serve.wait(60) == 0, err.read_text()
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
