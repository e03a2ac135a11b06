"""`python -m bootstrap --requeue` end to end on the real local Slurm (2 nodes, CPU only).

`scancel --batch --signal=USR2` stands in for the time-limit warning (`--signal=B:USR2@LEAD`
sends the same signal to the same process: the batch shell). The shell passes it to srun, srun
to the agents, the agents to every rank; the ranks checkpoint and exit 0; the script requeues
the job; the second run (SLURM_RESTART_COUNT=1) resumes from the checkpoint.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime

import pytest
from cluster import REPO, job_processes, wait_for
from slurm_local import job_state, processes_naming, slurm_env

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]

RANK = str(REPO / "tests" / "fixtures" / "requeue_rank.py")


def test_requeue_checkpoints_on_usr2_and_resumes(slurm, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "job.sbatch"
    gen = subprocess.run(
        [
            sys.executable,
            "-m",
            "bootstrap",
            "-J",
            "la-requeue",
            "-N",
            "2",
            "--gpus-per-node",
            "0",
            "--requeue",
            "--max-requeues",
            "1",
            "--sbatch-output",
            str(tmp_path / "job-%j.out"),
            # one log dir per run: the job id stays the same across a requeue
            f"--agent-opts=--nproc-per-node 1 --log-dir {tmp_path}/logs-${{SLURM_RESTART_COUNT:-0}}",
            "-o",
            str(script),
            RANK,
            "--",
            str(work),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=slurm_env(),
        timeout=60,
    )
    assert gen.returncode == 0, gen.stderr
    sub = subprocess.run(
        ["sbatch", "--parsable", str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=slurm_env(),
        timeout=60,
    )
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    log = tmp_path / f"job-{job}.out"
    try:
        ready = [work / f"ready-{rank}" for rank in range(2)]
        wait_for(lambda: all(p.exists() for p in ready), 60, "both ranks to run", interval=0.2)
        # the time-limit warning: USR2 to the batch shell only (not to srun, not to the ranks)
        subprocess.run(["scancel", "--batch", "--signal=USR2", job], check=True, timeout=30)
        checkpoints = [work / f"checkpoint-{rank}" for rank in range(2)]
        try:
            wait_for(lambda: all(p.exists() for p in checkpoints), 90, "checkpoints", interval=0.2)
        except AssertionError:
            logs = "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in tmp_path.rglob("*.log"))
            raise AssertionError(f"no checkpoints:\n{log.read_text()[-3000:]}\n{logs}") from None
        wait_for(
            lambda: (
                job_state(job).get("Restarts") == "1"
                and job_state(job).get("JobState") == "PENDING"
            ),
            60,
            "the job to be requeued",
            interval=0.2,
        )
        # Slurm holds a requeued job back until the old run's credential has expired
        # (EligibleTime = requeue + cred_expire + 1 s: 11 s with scripts/slurm's AuthInfo, 121 s
        # by default; starting it sooner fails it: "credential revoked").
        # Wait that out, then have the scheduler look at it at once instead of on its next pass.
        eligible = datetime.fromisoformat(job_state(job)["EligibleTime"])
        wait_for(lambda: datetime.now() > eligible, 150, f"EligibleTime {eligible}", interval=0.5)
        subprocess.run(
            ["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True, timeout=30
        )
        state = wait_for(
            lambda: (
                (s := job_state(job)).get("JobState") not in ("PENDING", "RUNNING", "COMPLETING")
                and s
            ),
            90,
            "the second run to finish",
            interval=0.2,
        )
        output = log.read_text()
        assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", output
        assert state["Restarts"] == "1", state
        for rank in range(2):
            # once: the agents must not pass on what Slurm's proctrack/linuxproc gave the ranks
            assert (work / f"checkpoint-{rank}").read_text().endswith(" warnings 1\n"), output
            assert (
                (work / f"resumed-{rank}")
                .read_text()
                .startswith("resumed from checkpoint, restart 1")
            ), output
        assert output.count("started:") == 2, output  # --open-mode=append: both runs, one log
        assert "warning:     USR2" in output and "requeue:     restart 1 of at most 1" in output
        assert "n1:0: resumed from checkpoint, restart 1" in output, output
        wait_for(
            lambda: not job_processes(f"{job}.0") and not processes_naming(tmp_path),
            30,
            "no process of the job left",
        )
    finally:
        subprocess.run(["scancel", job], timeout=30, check=False)
