"""What a shell's environment says of the scheduler, for the commands run from it (clients of
the resident agents): the job it is in, and which of its variables describe its node or step
rather than the user's program. Like every scheduler variable, spelled here in world/ only."""

from __future__ import annotations

from collections.abc import Mapping

# Variables a scheduler or MPI launcher sets for one node, step or task: they describe where a
# process runs, so a client's (say, on a login node) never stands in for a rank's own.
SCHEDULER_PREFIXES = ("SLURM_", "SLURMD_", "SRUN_", "SALLOC_", "SBATCH_", "PMI_", "PMIX_", "OMPI_")
JOB_ENV = "AGENT_JOB_ID"  # a job id for a shell the scheduler gave none (no allocation)


def shell_job_id(environ: Mapping[str, str]) -> str | None:
    """The job this shell is in: the allocation's SLURM_JOB_ID, else AGENT_JOB_ID; None outside
    any."""
    return environ.get("SLURM_JOB_ID") or environ.get(JOB_ENV) or None
