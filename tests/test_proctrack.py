"""Whether Slurm signals the ranks itself (proctrack/linuxproc): slurm.conf read as Slurm does."""

from __future__ import annotations

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


@pytest.mark.parametrize(
    "conf, step, expected",
    [
        ("ProctrackType=proctrack/linuxproc\n", True, True),
        ("ProctrackType=proctrack/cgroup\n", True, False),
        ("ProctrackType=proctrack/pgid\n", True, False),
        ("ClusterName=x\n", True, False),  # not set: Slurm's default, cgroup
        ("ProctrackType=proctrack/linuxproc\n", False, False),  # no job step: not under srun
        (None, True, False),  # no readable slurm.conf: the agent passes signals on itself
    ],
)
def test_slurm_signals_ranks(tmp_path, conf, step, expected):
    path = tmp_path / "slurm.conf"
    if conf is not None:
        path.write_text(conf)
    env = {"SLURM_JOB_ID": "7", "SLURM_CONF": str(path)}
    if step:
        env["SLURM_STEP_ID"] = "0"
    assert slurm_signals_ranks(env) is expected
