"""End to end on a real local Slurm (slurmctld + 2 slurmd on this machine).

The session fixture starts the cluster with scripts/slurm/start-cluster.sh (idempotent). In CI
(CI=true) a cluster that cannot start is a failure with the daemon logs, never a skip.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cluster import CHECK_ARGS, FIXTURE, REPO, job_processes, wait_for
from slurm_local import job_state, processes_naming, slurm_env

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]

CONFIGS = [str(REPO / "configs" / "data.yml"), str(REPO / "configs" / "model.yml")]


def _finished(job: str) -> dict[str, str] | None:
    state = job_state(job)
    return (
        state
        if state.get("JobState") not in (None, "PENDING", "RUNNING", "CONFIGURING", "COMPLETING")
        else None
    )


def test_generated_sbatch_runs_check_args_on_every_rank(slurm, tmp_path):
    script = tmp_path / "job.sbatch"
    logs = tmp_path / "logs"
    gen = subprocess.run(
        [
            sys.executable,
            "-m",
            "bootstrap",
            "-J",
            "la-e2e",
            "-N",
            "2",
            "--gpus-per-node",
            "0",
            "--cpus-per-task",
            "2",
            "--sbatch-output",
            str(tmp_path / "job-%j.out"),
            f"--agent-opts=--nproc-per-node 2 --log-dir {logs}",
            "-o",
            str(script),
            CHECK_ARGS,
            *CONFIGS,
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
    state = wait_for(lambda: _finished(job), 240, f"job {job} to finish", interval=0.5)
    output = (tmp_path / f"job-{job}.out").read_text()
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", output
    for rank in range(4):
        assert "check_args: OK" in (logs / f"rank-{rank:05d}.out").read_text()
    summary = (logs / "summary.json").read_text()
    assert '"status": "succeeded"' in summary and '"n2"' in summary
    assert "master node: n1" in output


def test_srun_from_an_salloc_shell(slurm, tmp_path):
    logs = tmp_path / "logs"
    proc = subprocess.run(
        [
            "salloc",
            "-N2",
            "--immediate=60",
            "srun",
            "--ntasks-per-node=1",
            sys.executable,
            "-m",
            "agent",
            "--nproc-per-node",
            "1",
            "--log-dir",
            str(logs),
            FIXTURE,
            "--stdout",
            "hello from slurm",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=slurm_env(),
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "n1:0: hello from slurm" in proc.stdout and "n2:1: hello from slurm" in proc.stdout
    assert (logs / "rank-00001.out").read_text() == "hello from slurm\n"


def test_scancel_leaves_no_process_behind(slurm, tmp_path):
    ready = tmp_path / "ready"
    ready.mkdir()
    script = tmp_path / "sleepy.sbatch"
    script.write_text(
        "#!/bin/bash\n#SBATCH -N 2\n#SBATCH --ntasks-per-node=1\n"
        f"#SBATCH --output={tmp_path}/sleepy-%j.out\n"
        f"srun {sys.executable} -m agent --nproc-per-node 2 --log-dir {tmp_path}/logs "
        f"{FIXTURE} --ready-to {ready} --others-wait --exit 1 --on\n"
    )
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
    wait_for(lambda: len(list(ready.iterdir())) == 4, 180, "all 4 ranks to run", interval=0.2)
    marker = f"{job}.0"
    assert len(job_processes(marker)) >= 4
    subprocess.run(["scancel", job], check=True, timeout=30)
    wait_for(lambda: _finished(job), 60, "the job to end", interval=0.2)
    wait_for(
        lambda: not job_processes(marker) and not processes_naming(tmp_path),
        30,
        "no process of the job left",
    )
    assert _finished(job)["JobState"] == "CANCELLED"


def test_resident_agents_in_an_salloc(slurm, tmp_path):
    """`srun ... agent serve &` in an salloc shell, two runs from that shell, then `down`."""
    state = tmp_path / "state"
    py = sys.executable
    session = tmp_path / "session.sh"
    session.write_text(
        f"srun --ntasks-per-node=1 {py} -m agent serve 2> {tmp_path}/serve.err &\n"
        # Await the agents (bounded): the connection file, then every node ready.
        f"for i in $(seq 900); do {py} -m agent status 2>/dev/null | grep -q '(2 ready' "
        "&& break; sleep 0.2; done\n"
        f"{py} -m agent run --nproc-per-node 1 {FIXTURE} --stdout 'first run'; echo rc1=$?\n"
        f"{py} -m agent run --nproc-per-node 1 {FIXTURE} --stdout 'second run'; echo rc2=$?\n"
        f"{py} -m agent down; echo rc3=$?\n"
        "wait; echo srun=$?; echo job=$SLURM_JOB_ID\n"
    )
    proc = _salloc_session(session, state)
    out = proc.stdout
    serve_err = (tmp_path / "serve.err").read_text(errors="replace")
    assert "rc1=0" in out and "rc2=0" in out and "rc3=0" in out, out + proc.stderr + serve_err
    assert "srun=0" in out, out + serve_err
    for text in ("first run", "second run"):
        assert f"n1:0: {text}" in out and f"n2:1: {text}" in out, out
    job = out.split("job=", 1)[1].split()[0]
    assert not (state / f"serve-{job}.json").exists()
    wait_for(
        lambda: not job_processes(f"{job}.0") and not processes_naming(tmp_path),
        30,
        "no process of the job left",
    )


def test_a_breakpoint_under_slurm_is_debugged_from_the_salloc_shell(slurm, tmp_path):
    """`srun ... python -m agent job.py &` in an salloc shell; rank 1 (on the second node)
    stops at breakpoint(); from the same shell `agent top LOG_DIR --once` shows both ranks on
    their nodes, `agent debug LOG_DIR` lists rank 1, prints a local and continues it; the job
    then ends 0 with the rank's last line in its file."""
    job = str(REPO / "tests" / "fixtures" / "pause_job.py")
    logs, py = tmp_path / "logs", sys.executable
    session = tmp_path / "session.sh"
    session.write_text(
        f"srun --ntasks-per-node=1 {py} -m agent --nproc-per-node 1 --log-dir {logs} {job} "
        f"> {tmp_path}/job.out 2> {tmp_path}/job.err &\n"
        # Await the pause (bounded): the job's control.json, then rank 1 listed as paused.
        f"for i in $(seq 900); do {py} -m agent debug {logs} --list 2>/dev/null "
        "| grep -q '^rank 1 ' && break; sleep 0.2; done\n"
        f"{py} -m agent top {logs} --once; echo top=$?\n"
        f"{py} -m agent debug {logs} --list; echo list=$?\n"
        f"{py} -m agent debug {logs} --rank 1 -c 'p x'; echo p=$?\n"
        f"{py} -m agent debug {logs} --rank 1 -c c; echo c=$?\n"
        "wait; echo srun=$?\n"
    )
    proc = _salloc_session(session, tmp_path / "state")
    out = proc.stdout
    told = out + proc.stderr + (tmp_path / "job.err").read_text(errors="replace")
    assert "top=0" in out, told
    rows = [line.split() for line in out.split("top=0")[0].splitlines()]
    ranks = {int(cells[0]): cells[1] for cells in rows if cells and cells[0].isdigit()}
    assert ranks == {0: "n1", 1: "n2"}, told  # every rank's row, from the node that runs it
    assert "list=0" in out and "p=0" in out and "c=0" in out and "srun=0" in out, told
    listed = out.split("top=0")[1].split("list=0")[0]
    assert listed.strip().splitlines()[-1].startswith("rank 1 (n2): "), told
    assert "pause_job.py:" in listed and "(breakpoint)" in listed, told
    assert "42\n" in out.split("list=0")[1].split("p=0")[0], told
    assert "after 42" in (logs / "rank-00001.out").read_text()
    assert "rank 1 paused at pause_job.py:" in (tmp_path / "job.out").read_text() + told


def _salloc_session(session: Path, state: Path) -> subprocess.CompletedProcess:
    """`salloc -N2 bash SESSION` from SESSION's directory, the agents' state dir and secret
    the session's own (its commands and the agents it starts find each other by them)."""
    env = slurm_env()
    env.update({"AGENT_STATE_DIR": str(state), "AGENT_SECRET": "salloc-" + session.parent.name})
    return subprocess.run(
        ["salloc", "-N2", "--immediate=60", "bash", str(session)],
        capture_output=True,
        text=True,
        cwd=session.parent,
        env=env,
        timeout=300,
    )
