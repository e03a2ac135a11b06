"""Paths that do not need torch never import it: help, logs, bootstrap, doctor, and the clients
of resident agents (`run`, `status`, `down`, `stacks`, `top`, `debug`) — checked with `python -X importtime`."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cluster import REPO


def imports(argv: list[str], cwd) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run `python -X importtime ARGV` in a bare environment: its result, and every module it
    imported, in order."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        capture_output=True, text=True, cwd=cwd, env=env, timeout=60,
    )  # fmt: skip
    return done, [line.split("|")[-1].strip() for line in done.stderr.splitlines() if "|" in line]


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "agent", "--help"],
        ["-m", "agent", "--version"],
        ["-m", "agent"],
        ["-m", "agent", "serve", "--help"],
        ["-m", "agent", "run", "--help"],
        ["-m", "agent", "stacks", "--help"],
        ["-m", "agent", "logs", "--help"],
        ["-m", "agent", "status", "--serve", "/nonexistent/serve.json"],
        ["-m", "agent", "run", "--serve", "/nonexistent/serve.json", "train.py"],
        ["-m", "agent", "stacks", "/nonexistent-log-dir"],
        ["-m", "agent", "top", "--help"],
        ["-m", "agent", "top", "/nonexistent-log-dir", "--once"],
        ["-m", "agent", "top", "--serve", "/nonexistent/serve.json"],
        ["-m", "agent", "debug", "--help"],
        ["-m", "agent", "debug", "/nonexistent-log-dir", "--list"],
        ["-m", "agent", "debug", "--serve", "/nonexistent/serve.json", "--all", "-c", "p x"],
        ["-m", "agent", "history"],
        ["-m", "agent", "history", "--json", "--failed"],
        ["-m", "agent", "logs", "/nonexistent-log-dir", "--timeline", "/nonexistent/x.svg"],
        ["-m", "bootstrap", "--help"],
    ],
)
def test_no_torch_import(argv, tmp_path):
    done, imported = imports(argv, tmp_path)
    assert done.returncode in (0, 2, 3), done.stderr[-2000:]
    assert imported, "importtime printed nothing"
    assert not [m for m in imported if m == "torch" or m.startswith("torch.")], argv
    assert "Traceback" not in done.stderr


# What a client of the resident agents needs is the wire and its parser: not the logging
# machinery (it prints, never logs), nor the scheduler parsers and host lists, nor `secrets`
# (only who writes the connection record or the secret needs it). A client's start is part of
# every `agent run` (BENCHMARKS.md, the relaunch breakdown).
CLIENT_NEVER = ("logging", "secrets", "hostlist", "agent.world.detect", "agent.world.slurm",
                "agent.world.types", "agent.plan.run_plan", "agent.warm")  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "agent", "run", "--serve", "/nonexistent/serve.json", "train.py"],
        ["-m", "agent", "status", "--serve", "/nonexistent/serve.json"],
    ],
)
def test_a_client_starts_light(argv, tmp_path):
    done, imported = imports(argv, tmp_path)
    assert done.returncode == 3, done.stderr[-2000:]  # no resident agents there: it got that far
    assert "agent.serve.client" in imported and "agent.control.wire" in imported
    heavy = sorted(m for m in imported if m.startswith(CLIENT_NEVER))
    assert not heavy, heavy
