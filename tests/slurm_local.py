"""The real local Slurm for tests (slurmctld + 2 slurmd on this machine): the session fixture
that starts it (idempotent; in CI a cluster that cannot start fails, never skips) and helpers."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from cluster import REPO


@pytest.fixture(scope="session")
def slurm():
    script = REPO / "scripts" / "slurm" / "start-cluster.sh"
    have = shutil.which("slurmctld") or shutil.which("apt-get")
    if not have and os.environ.get("CI") != "true":
        pytest.skip("no Slurm here and no apt-get to install it")
    proc = subprocess.run(["bash", str(script), "2"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"local Slurm did not start:\n{proc.stdout}\n{proc.stderr}")
    return True


def slurm_env() -> dict[str, str]:
    """This process's env without any SLURM_* (tests are not a step), our package first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
    return env


def job_state(job: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30
    ).stdout
    return dict(re.findall(r"(\w+)=(\S+)", out))


def processes_naming(path) -> list[int]:
    """Live processes (but this one) whose command line names `path`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(path).encode() in f.read() and int(pid) != os.getpid():
                    found.append(int(pid))
        except OSError:
            continue
    return found
