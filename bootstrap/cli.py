"""`python -m bootstrap [OPTIONS] SCRIPT [CONFIG.yml ...] [-- ARGS]` → Request (pure)."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath

from agent.errors import AgentError
from agent.launch.cli import split_rest
from agent.usage import Parser
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

_EPILOG = """\
Bootstrap's options go before or after SCRIPT and its configs. After SCRIPT, arguments ending in
.yml/.yaml are configs; what bootstrap does not know, and everything after --, goes to the script
verbatim (so a script argument that is also a bootstrap option, e.g. --time, goes after --).
Values that start with - need '=': --sbatch=--exclusive, --agent-opts='--max-restarts 2'.
Values are written in double quotes, so $VARS in them expand when the job runs.
Sweeps (--search-config and/or --set): every list is a set of alternatives; one config and one
script per combination go into a directory (--output), named config_0__key=value.yml/.sbatch.
The last config is the template each combination's config is built from.

examples:
  python -m bootstrap -N 2 --gpus-per-node 8 -t 01:00:00 -p batch train.py data.yml model.yml
  python -m bootstrap --container-image ./pytorch.sqsh --container-mounts /data:/data train.py m.yml
  python -m bootstrap --nsys --nsys-ranks 0,8 train.py data.yml model.yml --submit
  python -m bootstrap -t 04:00:00 --requeue --max-requeues 5 train.py data.yml model.yml
  python -m bootstrap --search-config search.yml --set optimizer.lr=[0.1,0.01] train.py d.yml m.yml"""


@dataclass(frozen=True)
class Request:
    """The job plus what to do with it."""

    job: JobSpec
    output: str | None  # None: <job-name>.sbatch, or <job-name>-sweep/ for a sweep
    print_script: bool
    submit: bool
    search_config: str | None
    overrides: tuple[str, ...]  # --set KEY=VALUE, applied to the search config
    allow_many_gpus: bool
    check_paths: bool
    sbatch_command: str

    @property
    def is_sweep(self) -> bool:
        return self.search_config is not None or bool(self.overrides)


def build_parser() -> Parser:
    parser = Parser(
        prog="python -m bootstrap",
        description="Write (and optionally submit) an sbatch script that "
        "runs `python -m agent` on every node of a Slurm job.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    _slurm_options(parser.add_argument_group("slurm"))
    _container_options(parser.add_argument_group("container"))
    _step_options(parser.add_argument_group("step"))
    _nsys_options(parser.add_argument_group("nsys"))
    _output_options(parser.add_argument_group("output"))
    parser.add_argument("script", help="the training script")
    rest = parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    rest.required = False  # else a missing script is reported as "script, rest"
    return parser


def _slurm_options(group) -> None:
    add = group.add_argument
    add("-J", "--job-name", help="job name (default: the script's name without .py)")
    add("-N", "--nodes", type=int, default=1, help="nodes (default: 1)")
    add("--gpus-per-node", type=int, default=8, help="GPUs per node; 0 for CPU only (default: 8)")
    add("--cpus-per-task", type=int, help="CPUs per agent task (per rank with --srun-only)")
    add("--mem", help="memory per node, e.g. 200G")
    add("-t", "--time", help="time limit, e.g. 01:00:00 or 2-00:00:00")
    add("-A", "--account", help="account to charge")
    add("-p", "--partition", help="partition")
    add(
        "--sbatch-output",
        metavar="PATTERN",
        help="job log (default: %%x-%%j.out; %%x-%%A_%%a.out for arrays)",
    )
    add("--sbatch-error", metavar="PATTERN", help="job stderr file (default: into the job log)")
    add(
        "--signal",
        help="signal before the time limit, e.g. USR1@90 (the agents forward it to every rank)",
    )
    add("--array", help="job array, e.g. 0-3 or 0-15%%4")
    add(
        "--requeue",
        action="store_true",
        help="before the time limit, USR2 to every rank (checkpoint, exit 0), then the job "
        "requeues itself and resumes (see README: Preemption and time limits)",
    )
    add(
        "--max-requeues",
        type=int,
        metavar="N",
        help=f"with --requeue: requeue at most N times (default: {RequeueSpec.max_requeues})",
    )
    add(
        "--signal-lead",
        type=int,
        metavar="SECONDS",
        help="with --requeue: the warning comes this long before the time limit "
        f"(default: {RequeueSpec.signal_lead})",
    )
    add(
        "--checkpoint-dir",
        metavar="DIR",
        help="with --requeue: where the ranks write checkpoints; the agents say whether one "
        "was written after the warning (agent's --checkpoint-dir)",
    )
    add(
        "--sbatch",
        action="append",
        default=[],
        metavar="OPTION",
        help="one more #SBATCH line, e.g. --sbatch=--exclusive (repeatable)",
    )


def _container_options(group) -> None:
    add = group.add_argument
    add(
        "--container",
        choices=[k.value for k in ContainerKind if k is not ContainerKind.NONE],
        help="container runtime (default: pyxis when --container-image is given)",
    )
    add(
        "--container-image",
        metavar="IMAGE",
        help="image: a registry reference or a local .sqsh/.sif file",
    )
    add(
        "--container-mounts",
        action="append",
        default=[],
        metavar="SRC:DST[,...]",
        help="bind mounts, comma-separated or repeated",
    )
    add("--container-workdir", metavar="DIR", help="working directory inside the container")


def _step_options(group) -> None:
    add = group.add_argument
    add(
        "--srun-only",
        action="store_true",
        help="one agent per rank (srun --ntasks-per-node=GPUS --gpus-per-task=1) instead of one per node",
    )
    add(
        "--agent-opts",
        action="append",
        default=[],
        metavar="'OPTS'",
        help="options for python -m agent, e.g. --agent-opts='--max-restarts 2 --log-dir logs' (repeatable)",
    )
    add(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="export for every rank, e.g. --env NCCL_DEBUG=WARN (repeatable)",
    )
    add(
        "--wandb",
        action="store_true",
        help="the job logs to W&B: WANDB_API_KEY must be in your environment",
    )
    add("--wandb-project", help="exported as WANDB_PROJECT (implies --wandb)")
    add("--wandb-group", help="exported as WANDB_RUN_GROUP (implies --wandb)")
    add("--search-config", metavar="FILE", help="sweep: a config whose lists are alternatives")
    add(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="sweep: set a search-config key (a list makes it a dimension), e.g. --set lr=[0.1,0.01]",
    )


def _nsys_options(group) -> None:
    add = group.add_argument
    add(
        "--nsys",
        action="store_true",
        help="profile ranks with nsys (through the agent's --rank-prefix)",
    )
    add(
        "--nsys-ranks",
        default="all",
        help="ranks to profile: all, or a list like 0,8 or 0-3 (default: all)",
    )
    add(
        "--nsys-warmup-steps",
        type=int,
        default=10,
        help="exported as NSYS_WARMUP_STEPS (default: 10)",
    )
    add("--nsys-num-steps", type=int, default=1, help="exported as NSYS_NUM_STEPS (default: 1)")
    add("--nsys-trace", default="cuda,nvtx", help="nsys --trace list (default: cuda,nvtx)")
    add(
        "--nsys-capture-range",
        default="cudaProfilerApi",
        choices=["cudaProfilerApi", "nvtx", "none"],
        help="what starts recording (default: cudaProfilerApi; none: the whole run)",
    )
    add(
        "--nsys-output",
        default=NsysSpec.output,
        help="report path per rank; {rank}, {local_rank}, {node} are filled in by the agent "
        "(default: %(default)s)",
    )
    add(
        "--nsys-args",
        action="append",
        default=[],
        metavar="'ARGS'",
        help="more nsys profile flags, e.g. --nsys-args='--gpu-metrics-devices=0'",
    )


def _output_options(group) -> None:
    add = group.add_argument
    add(
        "-o",
        "--output",
        help="script file, or directory for a sweep (default: <job-name>.sbatch, <job-name>-sweep)",
    )
    add(
        "--print",
        dest="print_script",
        action="store_true",
        help="print the script; writes no file unless --output or --submit is given",
    )
    add(
        "--submit",
        action="store_true",
        help="run sbatch on the written script(s); prints each job id",
    )
    add(
        "--sbatch-command",
        default="sbatch",
        metavar="CMD",
        help="the sbatch to run with --submit (default: sbatch)",
    )
    add("--allow-many-gpus", action="store_true", help="allow more than 8 GPUs per node")
    add(
        "--no-path-checks",
        action="store_true",
        help="do not check that the script, configs and image exist here (paths valid only on the nodes)",
    )


def parse(argv: Sequence[str]) -> Request:
    parser = build_parser()
    ns = parser.parse_args(options_first(argv, parser.flags))
    configs, script_args = split_rest(ns.rest)
    job = JobSpec(
        slurm=_slurm(ns),
        step=_step(ns, configs, script_args),
        container=_container(ns),
        nsys=_nsys(ns),
    )
    return Request(
        job=job,
        output=ns.output,
        print_script=ns.print_script,
        submit=ns.submit,
        search_config=ns.search_config,
        overrides=tuple(ns.overrides),
        allow_many_gpus=ns.allow_many_gpus,
        check_paths=not ns.no_path_checks,
        sbatch_command=ns.sbatch_command,
    )


def options_first(argv: Sequence[str], options: Mapping[str, bool]) -> list[str]:
    """`argv` with bootstrap's own options (and their values) found after the script moved in
    front of it, so users may write them where they like (`train.py a.yml --print`); what
    bootstrap does not know, and everything after `--`, stays the script's, in its order."""
    argv = list(argv)
    script = _script_index(argv, options)
    if script is None:
        return argv
    moved: list[str] = []
    kept: list[str] = []
    i = script + 1
    while i < len(argv) and argv[i] != "--":
        token = argv[i]
        name, attached = _option_name(token, options)
        if name is None:
            kept.append(token)
        elif options[name] and not attached:
            if i + 1 >= len(argv) or argv[i + 1] == "--":
                raise AgentError(
                    f"{token} after the script: expected a value (see python -m bootstrap --help)"
                )
            moved += [token, argv[i + 1]]
            i += 1
        else:
            moved.append(token)
        i += 1
    return [*argv[:script], *moved, argv[script], *kept, *argv[i:]]


def _script_index(argv: Sequence[str], options: Mapping[str, bool]) -> int | None:
    """Where argparse finds the script: the first word that is neither an option nor a value."""
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return None  # `-- train.py`: argparse's own business
        if not token.startswith("-") or token == "-":
            return i
        name, attached = _option_name(token, options)
        i += 2 if name is not None and options[name] and not attached else 1
    return None


def _option_name(token: str, options: Mapping[str, bool]) -> tuple[str | None, bool]:
    """(bootstrap's option this token is, whether its value is attached); (None, False) for a
    word that is none of bootstrap's: `--nodes=2` → --nodes, `-N2` → -N, `--lr` → None."""
    if token.startswith("--"):
        name, eq, _ = token.partition("=")
        return (name, bool(eq)) if name in options else (None, False)
    if token.startswith("-") and len(token) > 1:
        if token in options:
            return token, False
        if token[:2] in options and options[token[:2]]:
            return token[:2], True
    return None, False


def _slurm(ns: argparse.Namespace) -> SlurmSpec:
    return SlurmSpec(
        job_name=ns.job_name if ns.job_name is not None else PurePath(ns.script).stem or "job",
        nodes=ns.nodes,
        gpus_per_node=ns.gpus_per_node,
        cpus_per_task=ns.cpus_per_task,
        mem=ns.mem,
        time=ns.time,
        account=ns.account,
        partition=ns.partition,
        output=ns.sbatch_output,
        error=ns.sbatch_error,
        signal=ns.signal,
        array=ns.array,
        extra=tuple(ns.sbatch),
        requeue=_requeue(ns),
    )


def _requeue(ns: argparse.Namespace) -> RequeueSpec | None:
    if not ns.requeue:
        for flag, value in (
            ("--max-requeues", ns.max_requeues),
            ("--signal-lead", ns.signal_lead),
            ("--checkpoint-dir", ns.checkpoint_dir),
        ):
            if value is not None:
                raise AgentError(f"{flag} needs --requeue")
        return None
    defaults = RequeueSpec()
    return RequeueSpec(
        max_requeues=defaults.max_requeues if ns.max_requeues is None else ns.max_requeues,
        signal_lead=defaults.signal_lead if ns.signal_lead is None else ns.signal_lead,
        checkpoint_dir=ns.checkpoint_dir,
    )


def _step(
    ns: argparse.Namespace, configs: tuple[str, ...], script_args: tuple[str, ...]
) -> StepSpec:
    env = [_env_pair(text) for text in ns.env]
    if ns.wandb_project:
        env.append(("WANDB_PROJECT", ns.wandb_project))
    if ns.wandb_group:
        env.append(("WANDB_RUN_GROUP", ns.wandb_group))
    return StepSpec(
        script=ns.script,
        configs=configs,
        script_args=script_args,
        mode=StepMode.SRUN_ONLY if ns.srun_only else StepMode.PER_NODE,
        agent_options=_split_all(ns.agent_opts, "--agent-opts"),
        env=tuple(env),
        wandb=bool(ns.wandb or ns.wandb_project or ns.wandb_group),
    )


def _container(ns: argparse.Namespace) -> ContainerSpec:
    if ns.container is not None:
        kind = ContainerKind(ns.container)
    else:
        kind = ContainerKind.PYXIS if ns.container_image else ContainerKind.NONE
    mounts = tuple(m.strip() for text in ns.container_mounts for m in text.split(","))
    return ContainerSpec(
        kind=kind, image=ns.container_image or "", mounts=mounts, workdir=ns.container_workdir
    )


def _nsys(ns: argparse.Namespace) -> NsysSpec:
    return NsysSpec(
        enabled=ns.nsys,
        ranks=parse_ranks(ns.nsys_ranks),
        warmup_steps=ns.nsys_warmup_steps,
        num_steps=ns.nsys_num_steps,
        trace=tuple(t for t in ns.nsys_trace.split(",") if t),
        capture_range=ns.nsys_capture_range,
        output=ns.nsys_output,
        extra_args=_split_all(ns.nsys_args, "--nsys-args"),
    )


def parse_ranks(text: str) -> tuple[int, ...] | None:
    """`all` → None; `0,8,12-13` → (0, 8, 12, 13)."""
    if text.strip() == "all":
        return None
    ranks: list[int] = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise AgentError(f"--nsys-ranks {text!r}: write all, or ranks like 0,8 or 0-3")
        ranks += range(int(first), int(last if dash else first) + 1)
    return tuple(ranks)


def _env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep:
        raise AgentError(f"--env {text!r} has no '=': write --env NAME=VALUE")
    return name, value


def _split_all(texts: Sequence[str], flag: str) -> tuple[str, ...]:
    out: list[str] = []
    for text in texts:
        try:
            out += shlex.split(text)
        except ValueError as err:
            raise AgentError(f"{flag} {text!r}: {err} (check the quotes)") from None
    return tuple(out)
