"""`sbatch --parsable SCRIPT` → the job id; the only place bootstrap starts a process."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable

from agent.errors import AgentError

Run = Callable[..., subprocess.CompletedProcess]


def submit(script: str, *, sbatch: str = "sbatch", run: Run = subprocess.run) -> str:
    """Submit one script; sbatch's refusal becomes one AgentError line with its last message."""
    argv = [*shlex.split(sbatch), "--parsable", script]
    try:
        done = run(argv, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise AgentError(
            f"{argv[0]} not found: submit from a Slurm login node, or pass --sbatch-command"
        ) from None
    if done.returncode != 0:
        lines = (done.stderr or done.stdout or "").strip().splitlines()
        why = lines[-1] if lines else "no message"
        raise AgentError(f"sbatch {script} failed (exit {done.returncode}): {why}")
    # --parsable prints "jobid" or "jobid;cluster"
    job_id = done.stdout.strip().split(";")[0]
    if not job_id:
        raise AgentError(f"sbatch {script} printed no job id")
    return job_id
