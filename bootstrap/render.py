"""JobSpec → the text of a commented bash sbatch script (pure: no I/O, same input, same text)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from bootstrap.spec import ContainerKind, JobSpec, NsysSpec, RequeueSpec, SlurmSpec, StepMode

_WIDTH = 100
_BARE = re.compile(r"[A-Za-z0-9_./:=,@%+^-]+")
_NEEDS_QUOTES = re.compile(r"[\s'\"\\]|^$")
_MASTER_NODE = (
    "MASTER_NODE=$(python3 -c 'import hostlist,os;"
    'print(hostlist.expand_hostlist(os.environ["SLURM_JOB_NODELIST"])[0])\' 2>/dev/null'
    ' || echo "unknown (python-hostlist is not installed on the batch host)")'
)


def render(job: JobSpec) -> str:
    """The whole script; blocks are separated by one blank line."""
    blocks = [
        _intro(job),
        _preamble(),
        _environment(job),
        _banner(job.slurm),
        _step(job),
    ]
    return "\n\n".join(block for block in blocks if block) + "\n"


def word(text: str) -> str:
    """One shell word. Plain text stays bare; anything else goes in double quotes, where
    $VARS still expand when the job runs (e.g. ${SLURM_JOB_ID} in a path)."""
    if _BARE.fullmatch(text):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`")
    return f'"{escaped}"'


def words(items: Sequence[str]) -> str:
    return " ".join(word(item) for item in items)


def _intro(job: JobSpec) -> str:
    gpus = job.slurm.gpus_per_node
    if job.step.mode is StepMode.SRUN_ONLY:
        what = (
            f"# srun starts one agent per rank ({gpus} per node, one GPU each); each runs its rank."
        )
    else:
        what = (
            "# srun starts one agent per node; each starts, supervises and logs its node's ranks."
        )
    lines = [
        "#!/bin/bash",
        "# Written by `python -m bootstrap` (launch-agent): change its options and regenerate.",
        what,
    ]
    return "\n".join(
        lines + [f"#SBATCH {line}" for line in sbatch_options(job.slurm, job.step.mode)]
    )


def sbatch_options(slurm: SlurmSpec, mode: StepMode) -> list[str]:
    tasks = slurm.gpus_per_node if mode is StepMode.SRUN_ONLY else 1
    default_output = "%x-%A_%a.out" if slurm.array else "%x-%j.out"
    requeue = slurm.requeue
    # --requeue: the warning goes to the batch shell only (B:), which passes it on to the step
    signal = f"B:USR2@{requeue.signal_lead}" if requeue else slurm.signal
    pairs: list[tuple[str, object]] = [
        ("job-name", slurm.job_name),
        ("nodes", slurm.nodes),
        ("ntasks-per-node", tasks),
        ("gpus-per-node", slurm.gpus_per_node or None),
        ("cpus-per-task", slurm.cpus_per_task),
        ("mem", slurm.mem),
        ("time", slurm.time),
        ("account", slurm.account),
        ("partition", slurm.partition),
        ("output", slurm.output or default_output),
        ("error", slurm.error),
        ("signal", signal),
        ("array", slurm.array),
        ("open-mode", "append" if requeue else None),  # every run of a requeued job, one log
    ]
    options = [word(f"--{name}={value}") for name, value in pairs if value is not None]
    if requeue:
        options.append("--requeue")
    return options + list(slurm.extra)


def _preamble() -> str:
    return "\n".join(
        [
            "set -euo pipefail",
            "",
            "# A fresh secret for this job: node 0's agent signs the configs it shares, the others verify.",
            "AGENT_SECRET=$(python3 -c 'import secrets;print(secrets.token_hex(32))')",
            "export AGENT_SECRET",
            "export PYTHONUNBUFFERED=1  # job log lines in order, as they happen",
        ]
    )


def _environment(job: JobSpec) -> str:
    lines: list[str] = []
    if job.step.env:
        lines.append(
            "# Environment for every rank: srun passes the batch environment on to the agents."
        )
        lines += [f"export {key}={word(value)}" for key, value in job.step.env]
    if job.nsys.enabled:
        lines += _nsys_environment(job.nsys)
    if job.step.wandb:
        lines += [
            "# W&B: the key comes from the submitting shell (sbatch passes it on), never from this file.",
            ': "${WANDB_API_KEY:?is not set: export it before sbatch, this job logs to W&B}"',
        ]
    return "\n".join(lines)


def _nsys_environment(nsys: NsysSpec) -> list[str]:
    directory = nsys.output.rpartition("/")[0]
    lines = [
        "# nsys: the training script calls cudaProfilerStart after NSYS_WARMUP_STEPS steps and",
        "# cudaProfilerStop NSYS_NUM_STEPS steps later; nsys records only in between.",
        f"export NSYS_WARMUP_STEPS={nsys.warmup_steps}",
        f"export NSYS_NUM_STEPS={nsys.num_steps}",
    ]
    if directory:
        lines.append(f"mkdir -p {word(directory)}  # nsys writes into an existing directory")
    return lines


def _banner(slurm: SlurmSpec) -> str:
    lines = [
        "# Where this job runs, at the top of the job log. The master is the first host of the node",
        "# list, expanded with python-hostlist (scontrol is often missing inside containers).",
        _MASTER_NODE,
        'echo "job id:      ${SLURM_JOB_ID}"',
    ]
    if slurm.array:
        lines.append('echo "array task:  ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"')
    lines += [
        'echo "nodes:       ${SLURM_JOB_NODELIST} (${SLURM_JOB_NUM_NODES})"',
        'echo "master node: ${MASTER_NODE}"',
        'echo "started:     $(date -Is)"',
    ]
    return "\n".join(lines)


def _step(job: JobSpec) -> str:
    command = [
        _srun_line(job),
        *_container_lines(job),
        *_agent_lines(agent_options(job)),
        words([job.step.script, *job.step.configs]),
    ]
    if job.step.script_args:
        command.append(words(["--", *job.step.script_args]))
    body = " \\\n  ".join(command)
    if job.slurm.requeue:
        return _requeue_step(job, body, job.slurm.requeue)
    return "\n".join(
        [
            *_step_comment(job),
            "status=0",
            f"{body} || status=$?",
            'echo "finished:    $(date -Is), exit status ${status}"',
            'exit "${status}"',
        ]
    )


def _requeue_step(job: JobSpec, body: str, requeue: RequeueSpec) -> str:
    """The step in the background, so that the shell's USR2 trap runs while it waits (bash runs
    a trap only between commands); after a warning, the job requeues itself — or, where Slurm
    refuses the requeue, submits this script again as a new job that starts after it."""
    lead = requeue.signal_lead
    return "\n".join(
        [
            f"# Preemption and time limits: Slurm sends USR2 to this shell {lead}s before the end",
            "# (--signal=B:USR2@...). The trap passes it to srun, srun to the agents, the agents to",
            "# every rank: the ranks checkpoint and exit 0. Then the job requeues itself (every rank",
            "# sees SLURM_RESTART_COUNT) and resumes; where the requeue is refused (sbatch",
            "# --no-requeue, JobRequeue=0, a site's policy) it submits this script again, to start",
            "# once this job has ended (every rank sees AGENT_RESUBMITS). At most MAX_REQUEUES",
            "# times, both ways together. USR2, not USR1: NCCL uses USR1.",
            f"MAX_REQUEUES={requeue.max_requeues}",
            "warnings=0",
            "step_pid=",
            "on_warning() {",
            "  warnings=$((warnings + 1))",
            '  echo "warning:     USR2 at $(date -Is): passing it on to every rank"',
            '  if [[ -n "${step_pid}" ]]; then kill -USR2 "${step_pid}" 2>/dev/null || true; fi',
            "}",
            "trap on_warning USR2",
            "resubmit() (  # a subshell: this job's SLURM_* stay out of the next one's environment",
            "  for name in $(compgen -e); do",
            '    if [[ "${name}" == SLURM_* && "${name}" != SLURM_CONF ]]; then unset "${name}"; fi',
            "  done",
            '  AGENT_RESUBMITS="$1" sbatch --dependency="afterany:$2" "$0"',
            ")",
            "",
            *_step_comment(job),
            f"{body} &",
            "step_pid=$!",
            "while :; do  # a trapped signal ends `wait` early: wait again until the step ends",
            "  seen=${warnings}",
            "  status=0",
            '  wait "${step_pid}" || status=$?',
            '  [[ "${warnings}" == "${seen}" ]] && break',
            "done",
            'echo "finished:    $(date -Is), exit status ${status}"',
            "restarts=$((${SLURM_RESTART_COUNT:-0} + ${AGENT_RESUBMITS:-0}))  # requeued + resubmitted",
            "if (( warnings > 0 && restarts < MAX_REQUEUES )); then",
            '  echo "requeue:     restart $((restarts + 1)) of at most ${MAX_REQUEUES}"',
            '  if ! scontrol requeue "${SLURM_JOB_ID}"; then',
            '    echo "requeue:     scontrol requeue refused: submitting this script again"',
            '    resubmit "$((restarts + 1))" "${SLURM_JOB_ID}" || echo "requeue:     sbatch failed"',
            "  fi",
            "elif (( warnings > 0 )); then",
            '  echo "requeue:     not again, ${restarts} restarts already (--max-requeues)"',
            "fi",
            'exit "${status}"',
        ]
    )


def _step_comment(job: JobSpec) -> list[str]:
    if job.step.mode is StepMode.SRUN_ONLY:
        first = (
            "# One agent per rank, one GPU each (--world slurm-task: srun's tasks are the ranks)."
        )
    else:
        first = "# One agent per node; it starts, supervises and logs the ranks of its node."
    lines = [first, "# --kill-on-bad-exit=1 ends the whole step as soon as one agent fails."]
    if job.slurm.cpus_per_task is not None:
        lines.append("# --cpus-per-task is repeated: srun 22.05+ does not take it from sbatch.")
    return lines


def _agent_lines(options: Sequence[str]) -> list[str]:
    """`python -m agent OPTIONS` on one line, or one option (flag and its values) per line."""
    line = words(["python", "-m", "agent", *options])
    if len(line) <= _WIDTH:
        return [line]
    groups: list[list[str]] = []
    for option in options:
        if option.startswith("-") or not groups:
            groups.append([option])
        else:
            groups[-1].append(option)
    return ["python -m agent", *("  " + words(group) for group in groups)]


def _srun_line(job: JobSpec) -> str:
    flags = ["srun"]
    if job.step.mode is StepMode.SRUN_ONLY:
        flags += [f"--ntasks-per-node={job.slurm.gpus_per_node}", "--gpus-per-task=1"]
    else:
        flags.append("--ntasks-per-node=1")
    if job.slurm.cpus_per_task is not None:
        flags.append(f"--cpus-per-task={job.slurm.cpus_per_task}")
    flags.append("--kill-on-bad-exit=1")
    return words(flags)


def _container_lines(job: JobSpec) -> list[str]:
    container = job.container
    mounts = ",".join(container.mounts)
    if container.kind is ContainerKind.PYXIS:
        lines = [word(f"--container-image={container.image}")]
        if mounts:
            lines.append(word(f"--container-mounts={mounts}"))
        if container.workdir:
            lines.append(word(f"--container-workdir={container.workdir}"))
        return lines
    if container.kind is ContainerKind.APPTAINER:
        argv = ["apptainer", "exec"]
        if job.slurm.gpus_per_node:
            argv.append("--nv")
        if mounts:
            argv += ["-B", mounts]
        if container.workdir:
            argv += ["--pwd", container.workdir]
        return [words([*argv, container.image])]
    return []


def agent_options(job: JobSpec) -> list[str]:
    """The agent's flags: the ones this job's mode and nsys need, then the user's."""
    options: list[str] = []
    if job.step.mode is StepMode.SRUN_ONLY:
        options += ["--world", "slurm-task"]
    if job.nsys.enabled:
        options += ["--rank-prefix", nsys_prefix(job.nsys)]
        if job.nsys.ranks is not None:
            options += ["--rank-prefix-ranks", ",".join(str(rank) for rank in job.nsys.ranks)]
    requeue = job.slurm.requeue
    if requeue is not None and requeue.checkpoint_dir is not None:
        options += ["--checkpoint-dir", requeue.checkpoint_dir]  # the agents say if it saved
    return options + list(job.step.agent_options)


def nsys_prefix(nsys: NsysSpec) -> str:
    """`nsys profile ...` for the agent's --rank-prefix; the agent fills in {rank} per rank."""
    argv = ["nsys", "profile", f"--trace={','.join(nsys.trace)}"]
    if nsys.capture_range != "none":
        argv += [f"--capture-range={nsys.capture_range}", "--capture-range-end=stop"]
    argv += ["-o", nsys.output, "--force-overwrite", "true", *nsys.extra_args]
    # the agent shlex-splits the prefix; quote only what needs it, so {rank} and $VARS stay readable
    return " ".join(shlex.quote(arg) if _NEEDS_QUOTES.search(arg) else arg for arg in argv)
