"""The README's two commands stay true: the example it shows runs, and CI runs its test command."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from cluster import REPO, base_env

pytestmark = pytest.mark.e2e


def _blocks() -> list[str]:
    return re.findall(r"```\n(.*?)```", (REPO / "README.md").read_text(), re.S)


def test_readme_example_command_runs_every_rank(tmp_path):
    install = next(b for b in _blocks() if "pip install" in b).strip()
    assert install.startswith("pip install -e '.[dev]' && python -m agent ")
    example = install.split(" && ", 1)[1].split()
    assert example[:3] == ["python", "-m", "agent"]
    argv = [sys.executable, "-m", "agent", "--log-dir", str(tmp_path / "logs"), *example[3:]]
    proc = subprocess.run(
        argv, cwd=REPO, env=base_env(tmp_path), capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr
    nproc = int(example[example.index("--nproc-per-node") + 1])
    for rank in range(nproc):
        assert re.search(rf"^\S+:{rank}: check_args: OK ", proc.stdout, re.M), proc.stdout
    assert "job succeeded" in proc.stderr
    said = proc.stdout + proc.stderr  # the README promises an example without warnings
    assert not re.search(r"warning", said, re.I), said


def test_ci_runs_the_readme_test_command():
    test_command = next(b for b in _blocks() if "pytest" in b and "pip" not in b).strip()
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(rf"^{re.escape(test_command)}$", ci, re.M), "CI runs the README's tests"
    # ... in a fresh venv of its own, installed with the README's command, nothing from the
    # system's site-packages (a venv made without --system-site-packages), then activated.
    assert re.search(r'^python3 -m venv "\$WORK/venv"$', ci, re.M)
    assert re.search(r'^\. "\$WORK/venv/bin/activate"$', ci, re.M)
    assert re.search(r"^pip install -q -e '\.\[dev\]'$", ci, re.M)
    assert "system-site-packages" not in ci
    assert re.search(r"^bash scripts/ci/wheel-smoke\.sh ", ci, re.M), "the wheel smoke test runs"


def test_help_and_readme_name_every_command_and_exit_code():
    """`python -m agent --help` lists every subcommand and exit code; the README's exit-code
    table has a row for each code the agent can return."""
    from agent.__main__ import SUBCOMMANDS
    from agent.errors import ExitCode

    shown = subprocess.run(
        [sys.executable, "-m", "agent", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    for name in SUBCOMMANDS:
        assert re.search(rf"python -m agent [^\n]*\b{name}\b", shown), name
    codes = shown.split("Exit codes:", 1)[1]
    rows = re.findall(r"^\| (\d+|128\+N) \|", (REPO / "README.md").read_text(), re.M)
    for code in ExitCode:
        assert re.search(rf"\b{int(code)} ", codes), (code, codes)
        assert str(int(code)) in rows, (code, rows)
    assert "128+N" in codes and "128+N" in rows
