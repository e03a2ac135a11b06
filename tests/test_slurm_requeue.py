"""`python -m bootstrap --requeue --checkpoint-dir` end to end on the real local Slurm (2 nodes,
CPU only).

`scancel --batch --signal=USR2` stands in for the time-limit warning (`--signal=B:USR2@LEAD`
sends the same signal to the same process: the batch shell). The shell passes it to srun, srun
to the agents, the agents to every rank; the ranks checkpoint and exit 0; node 0's record says
the checkpoint was written; the script requeues the job; the second run (SLURM_RESTART_COUNT=1)
resumes from the checkpoint. Where the ranks ignore the warning, the record says no checkpoint
was written; where the job may not be requeued (`sbatch --no-requeue`), the script submits
itself again, and the next job's first lines name the unsaved stop.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from cluster import REPO, job_processes, wait_for
from slurm_local import job_state, processes_naming, slurm_env

from agent.history import store

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]

RANK = str(REPO / "tests" / "fixtures" / "requeue_rank.py")
STEP = "step (?P<step>[0-9]+)"  # the fixture's progress lines: the record names the step
ENDED = ("PENDING", "RUNNING", "COMPLETING", "REQUEUED")


def _env(tmp_path: Path) -> dict[str, str]:
    return {**slurm_env(), "AGENT_STATE_DIR": str(tmp_path / "state")}


def _submit(tmp_path: Path, work: Path, *rank_args: str, sbatch: tuple[str, ...] = ()) -> str:
    """The script bootstrap writes (--requeue --checkpoint-dir WORK), submitted; its job id."""
    script = tmp_path / "job.sbatch"
    gen = subprocess.run(
        [
            sys.executable, "-m", "bootstrap", "-J", "la-requeue", "-N", "2",
            "--gpus-per-node", "0", "--requeue", "--max-requeues", "1",
            "--checkpoint-dir", str(work), "--sbatch-output", str(tmp_path / "job-%j.out"),
            # one log dir per run: the job id stays the same across a requeue
            f"--agent-opts=--nproc-per-node 1 --progress-regex '{STEP}' "
            f"--log-dir {tmp_path}/logs-${{SLURM_JOB_ID}}-${{SLURM_RESTART_COUNT:-0}}",
            "-o", str(script), RANK, "--", str(work), *rank_args,
        ],
        capture_output=True, text=True, cwd=REPO, env=slurm_env(), timeout=60,
    )  # fmt: skip
    assert gen.returncode == 0, gen.stderr
    sub = subprocess.run(
        ["sbatch", "--parsable", *sbatch, str(script)],
        capture_output=True, text=True, cwd=tmp_path, env=_env(tmp_path), timeout=60,
    )  # fmt: skip
    assert sub.returncode == 0, sub.stderr
    return sub.stdout.strip().split(";")[0]


def _warn(log: Path, job: str) -> None:
    """Once both ranks printed a step: the time-limit warning, USR2 to the batch shell only."""
    wait_for(
        lambda: log.exists() and all(f":{r}: step 10" in log.read_text() for r in range(2)),
        60, "both ranks to train", interval=0.2,
    )  # fmt: skip
    subprocess.run(["scancel", "--batch", "--signal=USR2", job], check=True, timeout=30)


def _stop_record(tmp_path: Path, job: str, run: int = 0) -> dict:
    summary = json.loads((tmp_path / f"logs-{job}-{run}" / "summary.json").read_text())
    return summary["preemption"]


def _history_stops(tmp_path: Path) -> list[str | None]:
    """The stop each job's history row names (the database its node 0 wrote)."""
    path = store.history_path(_env(tmp_path), Path.home())
    return [stored.record.stop for stored in store.read(path)]


def _over(job: str) -> dict | None:
    state = job_state(job)
    return state if state.get("JobState") not in ENDED else None


def test_requeue_checkpoints_on_usr2_and_resumes(slurm, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    job = _submit(tmp_path, work)
    log = tmp_path / f"job-{job}.out"
    try:
        _warn(log, job)
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
        nudged = subprocess.run(
            ["scontrol", "update", f"JobId={job}", "StartTime=now"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        # refused only when the scheduler's own pass started it first (seen in CI)
        assert nudged.returncode == 0 or job_state(job).get("JobState") != "PENDING", nudged.stderr
        state = wait_for(lambda: _over(job), 90, "the second run to finish", interval=0.2)
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
        # the first run's record: the checkpoint was written after the signal, at the step the
        # ranks' progress lines named last; the console and the history say the same
        stop = _stop_record(tmp_path, job)
        saved = rf"stopped for preemption at step \d+; checkpoint written: {work}/checkpoint-[01]"
        assert re.fullmatch(saved, stop["line"]), stop
        assert stop["signal"] == "SIGUSR2" and stop["exits"] == {"exit code 0": "0-1"}, stop
        assert stop["line"] in output and "this job follows job" not in output, output
        assert _history_stops(tmp_path).count(stop["line"]) == 1
        wait_for(
            lambda: not job_processes(f"{job}.0") and not processes_naming(tmp_path),
            30,
            "no process of the job left",
        )
    finally:
        subprocess.run(["scancel", job], timeout=30, check=False)


def test_ranks_that_ignore_usr2_save_nothing_and_a_job_not_requeueable_resubmits(slurm, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    job = _submit(tmp_path, work, "ignore", sbatch=("--no-requeue",))
    log = tmp_path / f"job-{job}.out"
    jobs = [job]
    try:
        _warn(log, job)
        # The ranks ignore it and train on; once node 0's agent has it, the step is ended as
        # the time limit would end it (the batch shell stays: it resubmits)
        wait_for(
            lambda: re.search(r"SIGUSR2: Slurm|forwarding SIGUSR2", log.read_text()),
            60, "the agents to get USR2", interval=0.2,
        )  # fmt: skip
        subprocess.run(["scancel", "--signal=TERM", f"{job}.0"], check=True, timeout=30)
        found = wait_for(
            lambda: re.search(r"Submitted batch job (\d+)", log.read_text()),
            60, "the script to submit itself again", interval=0.2,
        )  # fmt: skip
        output = log.read_text()
        jobs.append(found[1])
        assert "scontrol requeue refused: submitting this script again" in output, output
        stop = _stop_record(tmp_path, job)
        unsaved = r"stopped for preemption at step \d+; no checkpoint written after the signal"
        assert re.fullmatch(unsaved, stop["line"]), stop
        assert stop["line"] in output, output
        # the next job: a new id, after this one (--dependency), its first lines name the stop
        following = tmp_path / f"job-{found[1]}.out"
        state = wait_for(lambda: _over(found[1]), 90, "the next job to finish", interval=0.2)
        text = following.read_text()
        assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", text
        assert f"this job follows job {job}.0, {stop['line']}" in text, text
        assert "n1:0: no checkpoint: started over, restart 1" in text, text  # AGENT_RESUBMITS
        assert job_state(job).get("Restarts") == "0"
        assert _history_stops(tmp_path).count(stop["line"]) == 1
    finally:
        for each in jobs:
            subprocess.run(["scancel", each], timeout=30, check=False)
