"""Whether Slurm signals the ranks itself (proctrack/linuxproc): slurm.conf read as Slurm does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.world.proctrack import proctrack_type, slurm_signals_ranks


@pytest.mark.parametrize(
    "text, expected",
    [
        ("ProctrackType=proctrack/linuxproc\n", "proctrack/linuxproc"),
        ("proctracktype = Proctrack/Cgroup\n", "proctrack/cgroup"),
        ("  ProctrackType=proctrack/pgid  # groups\n", "proctrack/pgid"),
        ('ProctrackType="proctrack/linuxproc"\n', "proctrack/linuxproc"),
        ("#ProctrackType=proctrack/linuxproc\n", None),
        ("ClusterName=x\nTaskPlugin=task/none\n", None),
        ("ProctrackType=\n", None),
        (
            "ProctrackType=proctrack/cgroup\nProctrackType=proctrack/linuxproc\n",
            "proctrack/linuxproc",
        ),
        ("ProctrackTypeX=proctrack/linuxproc\n", None),
        ("", None),
    ],
)
def test_proctrack_type(text, expected):
    assert proctrack_type(text) == expected


STEPD = ["slurmstepd", "slurmstepd", "systemd"]  # srun's task: its parent is the step daemon
LINUXPROC = "ProctrackType=proctrack/linuxproc\n"


@pytest.mark.parametrize(
    "conf, step, ancestors, expected",
    [
        (LINUXPROC, True, STEPD, True),
        (LINUXPROC, True, ["bash", "slurmstepd", "systemd"], True),  # srun bash -c '...'
        ("ProctrackType=proctrack/cgroup\n", True, STEPD, False),
        ("ProctrackType=proctrack/pgid\n", True, STEPD, False),
        ("ClusterName=x\n", True, STEPD, False),  # not set: Slurm's default, cgroup
        (LINUXPROC, False, STEPD, False),  # no job step: not under srun
        (LINUXPROC, True, ["python", "bash", "sshd"], False),  # SLURM_* faked: no slurmstepd
        (None, True, STEPD, False),  # no readable slurm.conf: the agent passes signals on
    ],
)
def test_slurm_signals_ranks(tmp_path, conf, step, ancestors, expected):
    path = tmp_path / "slurm.conf"
    if conf is not None:
        path.write_text(conf)
    env = {"SLURM_JOB_ID": "7", "SLURM_CONF": str(path)}
    if step:
        env["SLURM_STEP_ID"] = "0"
    assert slurm_signals_ranks(env, lambda: ancestors) is expected


def test_ancestor_names_reads_the_real_process_tree(tmp_path):
    """A child shell named `(odd) name` (parentheses and a space, as comm may hold) asks for
    its ancestors: itself first, then this test's process."""
    odd = tmp_path / "(odd) name"
    odd.symlink_to(sys.executable)
    code = (
        "import json; from agent.world.proctrack import ancestor_names as a; print(json.dumps(a()))"
    )
    # The link is not in a virtualenv's bin/, so the interpreter it starts would not find the
    # venv's site-packages (pyvenv.cfg is looked up beside argv[0]): hand it this sys.path.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    # `; true`: the shell cannot exec the child in its place, so the child's parent is the shell
    child = subprocess.run(
        ["sh", "-c", f'"{odd}" -c "{code}"; true'],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert child.stdout, child.stderr
    names = json.loads(child.stdout)
    assert names[0] == "sh"
    assert names[1] == Path(f"/proc/{os.getpid()}/comm").read_text().strip()
