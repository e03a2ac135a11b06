"""Checks before a script is written: pure functions over the spec; each failure is one AgentError."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from agent.errors import AgentError
from agent.launch import cli as agent_cli
from bootstrap.spec import (
    ContainerKind,
    ContainerSpec,
    JobSpec,
    NsysSpec,
    RequeueSpec,
    SlurmSpec,
    StepMode,
    StepSpec,
)

Exists = Callable[[str], bool]
MAX_GPUS_PER_NODE = 8
MAX_SIGNAL_LEAD = 65535  # Slurm keeps --signal's @SECONDS in 16 bits

_ARRAY_PART = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")
_MEM = re.compile(r"\d+[KMGTkmgt]?")
_SIGNAL = re.compile(r"(?:[RB]{1,2}:)?(?:SIG)?(?:[A-Z][A-Z0-9]*|\d+)(?:@\d+)?")
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TIME_HINT = "use MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"


def check_job(
    job: JobSpec,
    *,
    exists: Exists,
    env: Mapping[str, str],
    allow_many_gpus: bool = False,
    check_paths: bool = True,
) -> None:
    """Everything knowable before submitting; the first problem found is raised."""
    check_slurm(job.slurm, job.step.mode, allow_many_gpus=allow_many_gpus)
    check_container(job.container, exists if check_paths else None)
    check_step(job.step, env)
    if check_paths:
        check_files(job.step, exists)
    check_nsys(job.nsys, job.slurm)


def check_slurm(slurm: SlurmSpec, mode: StepMode, *, allow_many_gpus: bool = False) -> None:
    if not slurm.job_name.strip():
        raise AgentError("--job-name is empty: give the job a name")
    check_nodes(slurm.nodes)
    check_gpus(slurm.gpus_per_node, mode, allow_many_gpus=allow_many_gpus)
    if slurm.cpus_per_task is not None and slurm.cpus_per_task < 1:
        raise AgentError(f"--cpus-per-task {slurm.cpus_per_task}: needs at least 1")
    if slurm.time is not None:
        check_time(slurm.time)
    if slurm.array is not None:
        check_array(slurm.array)
    if slurm.mem is not None and not _MEM.fullmatch(slurm.mem):
        raise AgentError(
            f"--mem {slurm.mem!r}: write a size such as 200G, 512000M or 0 (all of the node's)"
        )
    if slurm.signal is not None and not _SIGNAL.fullmatch(slurm.signal):
        raise AgentError(f"--signal {slurm.signal!r}: write [B:]SIGNAL[@SECONDS], e.g. USR1@90")
    if slurm.requeue is not None:
        check_requeue(slurm.requeue, slurm)


def check_requeue(requeue: RequeueSpec, slurm: SlurmSpec) -> None:
    if slurm.signal is not None:
        raise AgentError(
            "--signal with --requeue: --requeue asks for USR2 itself; set its time with --signal-lead"
        )
    if requeue.max_requeues < 1:
        raise AgentError(
            f"--max-requeues {requeue.max_requeues}: must be 1 or more (or leave out --requeue)"
        )
    lead = requeue.signal_lead
    if not 1 <= lead <= MAX_SIGNAL_LEAD:
        raise AgentError(f"--signal-lead {lead}: seconds from 1 to {MAX_SIGNAL_LEAD}")
    limit = time_seconds(slurm.time) if slurm.time is not None else None
    if limit is not None and lead >= limit:
        raise AgentError(
            f"--signal-lead {lead}: the warning would come before the job starts "
            f"(--time {slurm.time} is {limit}s)"
        )


def check_nodes(nodes: int) -> None:
    if nodes < 1:
        raise AgentError(f"--nodes {nodes}: a job needs at least 1 node")


def check_gpus(gpus: int, mode: StepMode, *, allow_many_gpus: bool = False) -> None:
    if gpus < 0:
        raise AgentError(f"--gpus-per-node {gpus}: must not be negative (0: CPU only)")
    if gpus > MAX_GPUS_PER_NODE and not allow_many_gpus:
        raise AgentError(
            f"--gpus-per-node {gpus}: more than {MAX_GPUS_PER_NODE} GPUs per node is unusual; "
            "pass --allow-many-gpus if your nodes really have that many"
        )
    if gpus == 0 and mode is StepMode.SRUN_ONLY:
        raise AgentError(
            "--srun-only starts one task per GPU: it needs --gpus-per-node of 1 or more"
        )


def check_time(text: str) -> None:
    """Slurm's --time forms; fields after the first stay below 60 (hours below 24)."""
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return
    days, dash, clock = text.rpartition("-")
    fields = clock.split(":")
    digits = all(part.isdigit() for part in fields) and (not dash or days.isdigit())
    if not digits or len(fields) > 3:
        raise AgentError(f"--time {text!r} is not a Slurm time: {_TIME_HINT}")
    values = [int(part) for part in fields]
    if dash:
        limits: tuple[int | None, ...] = (24, 60, 60)  # D-HH[:MM[:SS]]
    elif len(values) == 3:
        limits = (None, 60, 60)  # HH:MM:SS
    else:
        limits = (None, 60)  # MM[:SS]
    for value, limit in zip(values, limits, strict=False):
        if limit is not None and value >= limit:
            raise AgentError(f"--time {text!r}: {value} is out of range ({_TIME_HINT})")


def time_seconds(text: str) -> int | None:
    """A checked --time in seconds; None when unlimited."""
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days, dash, clock = text.rpartition("-")
    values = [int(part) for part in clock.split(":")]
    if dash:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = (values + [0, 0])[:3]
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    if len(values) == 3:  # HH:MM:SS
        return (values[0] * 60 + values[1]) * 60 + values[2]
    return values[0] * 60 + (values[1] if len(values) > 1 else 0)  # MM[:SS]


def check_array(text: str) -> None:
    """`0-15`, `1,3,5-7`, `0-15:4`, each optionally `%LIMIT` (at most LIMIT tasks at once)."""
    indexes, percent, limit = text.partition("%")
    if percent and not (limit.isdigit() and int(limit) >= 1):
        raise AgentError(f"--array {text!r}: the limit after % must be a number of 1 or more")
    for part in indexes.split(","):
        match = _ARRAY_PART.fullmatch(part)
        if not match:
            raise AgentError(
                f"--array {text!r} is not a Slurm array: write e.g. 0-15, 1,3,5-7, 0-15:4 or 0-15%4"
            )
        start, end, step = match.groups()
        if end is not None and int(end) < int(start):
            raise AgentError(f"--array {text!r}: range {start}-{end} ends before it starts")
        if step is not None and int(step) < 1:
            raise AgentError(f"--array {text!r}: the step in {part} must be 1 or more")


def check_container(container: ContainerSpec, exists: Exists | None) -> None:
    if container.kind is ContainerKind.NONE:
        if container.mounts or container.workdir:
            raise AgentError("--container-mounts/--container-workdir need --container-image")
        return
    if not container.image:
        raise AgentError(f"--container {container.kind.value} needs --container-image")
    for mount in container.mounts:
        if not mount or mount.startswith(":"):
            raise AgentError(f"container mount {mount!r}: write SRC[:DST[:FLAGS]]")
    if (
        exists is not None
        and is_local_image(container.image, container.kind)
        and not exists(container.image)
    ):
        raise AgentError(
            f"container image {container.image} not found: check the path, or pass "
            "--no-path-checks if it exists only on the compute nodes"
        )


def is_local_image(image: str, kind: ContainerKind) -> bool:
    """A file rather than a registry reference (nvcr.io#nvidia/pytorch:24.01-py3, docker://...)."""
    if "://" in image:
        return False
    if kind is ContainerKind.APPTAINER:
        return True  # apptainer takes registry images only with a scheme
    return image.startswith(("/", ".", "~", "$")) or image.endswith((".sqsh", ".squashfs"))


def check_step(step: StepSpec, env: Mapping[str, str]) -> None:
    for key, _ in step.env:
        if not _ENV_KEY.fullmatch(key):
            raise AgentError(f"--env {key!r}: not a variable name; write --env NAME=VALUE")
    if step.wandb and not env.get("WANDB_API_KEY"):
        raise AgentError(
            "--wandb needs WANDB_API_KEY in your environment: export it before submitting "
            "(sbatch passes it to the job; it is never written into the script)"
        )
    check_agent_options(step)


def check_agent_options(step: StepSpec) -> None:
    """The agent's own parser, so an unknown or malformed agent option fails here, not on the cluster."""
    try:
        agent_cli.parse([*step.agent_options, step.script])
    except AgentError as err:
        raise AgentError(f"--agent-opts: {err}") from None
    except SystemExit:  # argparse's --help/--version paths
        raise AgentError("--agent-opts: --help has no place in a job script") from None


def check_files(step: StepSpec, exists: Exists) -> None:
    if not exists(step.script):
        raise AgentError(
            f"script {step.script} not found: check the path (relative to where you submit), "
            "or pass --no-path-checks if it exists only on the compute nodes or in the container"
        )
    for config in step.configs:
        if not exists(config):
            raise AgentError(
                f"config {config} not found: check the path (relative to where you submit)"
            )


def check_nsys(nsys: NsysSpec, slurm: SlurmSpec) -> None:
    if not nsys.enabled:
        return
    if nsys.warmup_steps < 0 or nsys.num_steps < 1:
        raise AgentError("--nsys-warmup-steps must be 0 or more and --nsys-num-steps 1 or more")
    if "{rank}" not in nsys.output:
        raise AgentError(
            f"--nsys-output {nsys.output!r}: put {{rank}} in it, or every rank writes one file"
        )
    world = slurm.nodes * slurm.gpus_per_node
    for rank in nsys.ranks or ():
        if rank < 0 or (world and rank >= world):
            raise AgentError(
                f"--nsys-ranks: rank {rank} is not in this job's world of {world} ranks (0-{world - 1})"
            )
