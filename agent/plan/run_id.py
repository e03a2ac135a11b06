"""A job's or run's id: the one string its log dir is named by, `agent history` lists, the `agent
run` client says, and `agent logs`/`stacks`/`debug`/`history` take (pure).

    JOB.STEP        a one-shot job: `8.0` is job 8's step 0 (`logs/8.0`)
    JOB.STEP.rN     run N of the resident agents serving in that step: `8.0.r3`
    JOB             a source with a job id but no steps (k8s TORCHELASTIC_RUN_ID, --job-id)
    local-<time>-<pid>  no scheduler: when and by which process node 0 decided it
    ID-K            the K-th job whose default log dir would have been `logs/ID` (a requeued
                    job's second run: `8.0-2`; agent.run.outputs.claim_log_dir)

Ids name their parents by prefix: `8` names every step and run of job 8, `8.0` the one-shot
job 8.0 or (a serving step) every run of it (`named_by`).
"""

from __future__ import annotations

import time


def run_id(job: str, step: str = "", run: int | None = None, copy: int = 1) -> str:
    """The id of a one-shot job (`run` None) or of a resident agents' run `run`; `job` is the
    scheduler's job id, or `local_job(...)` without one."""
    text = job + (f".{step}" if step else "") + (f".r{run}" if run is not None else "")
    return copied(text, copy)


def copied(name: str, copy: int) -> str:
    """The `copy`-th of a name (a log dir's, an id): `logs/8.0`, `logs/8.0-2`, `logs/8.0-3`."""
    name = name.rstrip("/") or name
    return name if copy <= 1 else f"{name}-{copy}"


def local_job(when: float, pid: int) -> str:
    """The job part of an id without a scheduler: `local-20250102-030405-4242`."""
    return time.strftime("local-%Y%m%d-%H%M%S", time.localtime(when)) + f"-{pid}"


def named_by(query: str, found: str) -> bool:
    """Whether `query` (as a user typed it) names the job or run `found`: the id itself, or an
    id it is a parent of (`8` → `8.0`, `8.1.r2`; `8.0` → `8.0.r3`; never `80.0` or `8.0-2`)."""
    return bool(query) and (found == query or found.startswith(query + "."))
