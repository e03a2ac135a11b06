"""The --requeue script's end, run by bash with stand-ins for srun, scontrol and sbatch on PATH:
after the warning it requeues the job, or, where `scontrol requeue` is refused, submits the same
script again after this job — within --max-requeues counted across both ways (the real Slurm
runs both in tests/test_slurm_requeue.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bootstrap.render import render
from bootstrap.spec import JobSpec, RequeueSpec, SlurmSpec, StepSpec

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")

# srun: the warning reaches the batch shell while the step runs; the shell's trap passes it on
# to srun, which then ends (no sleep decides the order: each waits for the other's signal). It
# warns again until passed on: the first may land before the shell knows srun's pid.
_SRUN = """#!/bin/bash
trap 'exit 0' USR2
while :; do kill -USR2 "$PPID"; sleep 0.2; done
"""
_SCONTROL = """#!/bin/bash
echo "$*" >> "$CALLS/scontrol"
exit "${SCONTROL_RC:-0}"
"""
_SBATCH = """#!/bin/bash
echo "$* AGENT_RESUBMITS=${AGENT_RESUBMITS:-} SLURM_JOB_ID=${SLURM_JOB_ID:-}" >> "$CALLS/sbatch"
"""


def _script(tmp_path: Path, max_requeues: int) -> Path:
    slurm = SlurmSpec(job_name="t", gpus_per_node=0, requeue=RequeueSpec(max_requeues))
    path = tmp_path / "job.sbatch"
    path.write_text(render(JobSpec(slurm=slurm, step=StepSpec(script="train.py"))))
    return path


def _run(tmp_path: Path, max_requeues: int, env: dict[str, str]) -> tuple[str, str, str]:
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    calls.mkdir()
    for name, text in (("srun", _SRUN), ("scontrol", _SCONTROL), ("sbatch", _SBATCH)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    script = _script(tmp_path, max_requeues)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "AGENT_"))}
    done = subprocess.run(
        ["bash", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, "PATH": f"{bin_dir}:{base['PATH']}", "CALLS": str(calls),
             "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_NUM_NODES": "1",
             **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr

    def read(name: str) -> str:
        path = calls / name
        return path.read_text() if path.exists() else ""

    return done.stdout, read("scontrol"), read("sbatch")


@pytest.mark.parametrize(
    ("env", "max_requeues", "scontrol", "sbatch", "said"),
    [
        # requeued while under the limit: Slurm's own requeue, nothing submitted
        ({}, 1, "requeue 77\n", "", "restart 1 of at most 1"),
        # refused: the same script again, after this job, its count in AGENT_RESUBMITS and
        # none of this job's SLURM_* in its environment
        ({"SCONTROL_RC": "1"}, 1, "requeue 77\n", "SCRIPT AGENT_RESUBMITS=1 SLURM_JOB_ID=\n",
         "submitting this script again"),
        # both ways count: requeued once, resubmitted once — the third comes back as 3
        ({"SCONTROL_RC": "1", "SLURM_RESTART_COUNT": "1", "AGENT_RESUBMITS": "1"}, 3,
         "requeue 77\n", "SCRIPT AGENT_RESUBMITS=3 SLURM_JOB_ID=\n", "restart 3 of at most 3"),
        # the budget spent across both ways: neither is tried
        ({"SLURM_RESTART_COUNT": "1", "AGENT_RESUBMITS": "1"}, 2, "", "",
         "not again, 2 restarts already"),
    ],
)  # fmt: skip
def test_requeue_or_resubmit_within_max_requeues(
    tmp_path, env, max_requeues, scontrol, sbatch, said
):
    out, scontrol_calls, sbatch_calls = _run(tmp_path, max_requeues, env)
    script = str(tmp_path / "job.sbatch")
    assert scontrol_calls == scontrol, out
    expect = sbatch.replace("SCRIPT", f"--dependency=afterany:77 {script}")
    assert sbatch_calls == expect, out
    assert said in out and "warning:     USR2" in out, out
