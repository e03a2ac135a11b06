"""What one sbatch job is: frozen dataclasses that render.py turns into a script."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ContainerKind(str, enum.Enum):
    NONE = "none"
    PYXIS = "pyxis"  # srun --container-image (enroot under the hood)
    APPTAINER = "apptainer"  # srun ... apptainer exec IMAGE


class StepMode(str, enum.Enum):
    PER_NODE = "per-node"  # srun starts one agent per node; each agent starts its node's ranks
    SRUN_ONLY = "srun-only"  # srun starts one agent per rank (--world slurm-task)


@dataclass(frozen=True)
class RequeueSpec:
    """Preemption and time limits: Slurm warns the batch shell with USR2 `signal_lead` seconds
    before the end; the shell passes it to srun (→ agents → every rank), the ranks checkpoint and
    exit, and the job requeues itself (or, refused, submits itself again) while it came back
    fewer than max_requeues times."""

    max_requeues: int = 3
    signal_lead: int = 90  # seconds; Slurm may send it up to a minute earlier
    checkpoint_dir: str | None = None  # the agents' --checkpoint-dir: they say if it was written


@dataclass(frozen=True)
class SlurmSpec:
    """The #SBATCH header. None means: leave it to the cluster's default."""

    job_name: str
    nodes: int = 1
    gpus_per_node: int = 8
    cpus_per_task: int | None = None
    mem: str | None = None  # per node, e.g. 200G
    time: str | None = None  # e.g. 01:00:00 or 2-00:00:00
    account: str | None = None
    partition: str | None = None
    output: str | None = None  # None: %x-%j.out, or %x-%A_%a.out for an array
    error: str | None = None  # None: stderr goes to the output file
    signal: str | None = None  # e.g. USR1@90: the agents forward it to every rank
    array: str | None = None  # e.g. 0-3%2
    extra: tuple[str, ...] = ()  # more sbatch options, one per #SBATCH line: "--exclusive"
    requeue: RequeueSpec | None = None  # None: the job ends at its time limit


@dataclass(frozen=True)
class ContainerSpec:
    kind: ContainerKind = ContainerKind.NONE
    image: str = ""
    mounts: tuple[str, ...] = ()  # SRC:DST[:FLAGS]
    workdir: str | None = None


@dataclass(frozen=True)
class NsysSpec:
    """nsys around chosen ranks, through the agent's --rank-prefix ({rank} is the agent's)."""

    enabled: bool = False
    ranks: tuple[int, ...] | None = None  # None: every rank
    warmup_steps: int = 10  # exported as NSYS_WARMUP_STEPS for the training script
    num_steps: int = 1  # exported as NSYS_NUM_STEPS
    trace: tuple[str, ...] = ("cuda", "nvtx")
    capture_range: str = "cudaProfilerApi"  # or "none": profile the whole run
    output: str = "nsys-reports/${SLURM_JOB_ID}/nsys-rank{rank}"
    extra_args: tuple[str, ...] = ()  # more nsys profile flags


@dataclass(frozen=True)
class StepSpec:
    """The srun step: `python -m agent [agent options] SCRIPT CONFIGS -- ARGS` on every node."""

    script: str
    configs: tuple[str, ...] = ()
    script_args: tuple[str, ...] = ()
    mode: StepMode = StepMode.PER_NODE
    agent_options: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # exported in order before the step: NCCL_*, OMP_*
    wandb: bool = False  # the job refuses to start without WANDB_API_KEY


@dataclass(frozen=True)
class JobSpec:
    slurm: SlurmSpec
    step: StepSpec
    container: ContainerSpec = ContainerSpec()
    nsys: NsysSpec = NsysSpec()
