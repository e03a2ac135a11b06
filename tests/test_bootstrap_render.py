"""bootstrap.render: golden sbatch scripts (UPDATE_GOLDEN=1 rewrites them), bash -n, quoting."""

from __future__ import annotations

import difflib
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from bootstrap.render import nsys_prefix, render, word
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

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
REGENERATE = "UPDATE_GOLDEN=1 python -m pytest tests/test_bootstrap_render.py -q"

_SLURM = SlurmSpec(
    job_name="train",
    nodes=2,
    gpus_per_node=8,
    cpus_per_task=32,
    mem="200G",
    time="01:00:00",
    account="research",
    partition="batch",
)
_STEP = StepSpec(
    script="train.py",
    configs=("configs/data.yml", "configs/model.yml"),
    script_args=("--seed", "1"),
    env=(("NCCL_DEBUG", "WARN"), ("OMP_NUM_THREADS", "4")),
)

GOLDEN: dict[str, JobSpec] = {
    "plain": JobSpec(slurm=_SLURM, step=_STEP),
    "pyxis": JobSpec(
        slurm=_SLURM,
        step=_STEP,
        container=ContainerSpec(
            kind=ContainerKind.PYXIS,
            image="nvcr.io#nvidia/pytorch:24.01-py3",
            mounts=("$HOME/data:/data", "/scratch:/scratch"),
            workdir="/workspace",
        ),
    ),
    "apptainer": JobSpec(
        slurm=_SLURM,
        step=_STEP,
        container=ContainerSpec(
            kind=ContainerKind.APPTAINER,
            image="/images/pytorch.sif",
            mounts=("/data:/data",),
            workdir="/workspace",
        ),
    ),
    "nsys": JobSpec(
        slurm=_SLURM,
        step=_STEP,
        nsys=NsysSpec(enabled=True, ranks=(0, 8), trace=("cuda", "nvtx", "osrt")),
    ),
    "array": JobSpec(
        slurm=SlurmSpec(
            job_name="sweep",
            nodes=1,
            gpus_per_node=4,
            time="2-00:00:00",
            array="0-3%2",
            signal="USR1@90",
            extra=("--exclusive",),
        ),
        step=StepSpec(
            script="train.py", configs=("model.yml",), wandb=True, env=(("WANDB_PROJECT", "evo"),)
        ),
    ),
    "srun-only": JobSpec(
        slurm=SlurmSpec(
            job_name="train",
            nodes=4,
            gpus_per_node=8,
            cpus_per_task=12,
            output="logs/%x-%j.out",
            error="logs/%x-%j.err",
        ),
        step=StepSpec(
            script="train.py",
            configs=("data.yml", "model.yml"),
            mode=StepMode.SRUN_ONLY,
            agent_options=("--max-restarts", "1"),
        ),
    ),
}


def assert_golden(name: str, text: str) -> None:
    path = GOLDEN_DIR / f"{name}.sbatch"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN_DIR.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    expected = path.read_text(encoding="utf-8") if path.exists() else ""
    if text != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                text.splitlines(keepends=True),
                fromfile=f"golden/{name}.sbatch",
                tofile="render()",
            )
        )
        pytest.fail(
            f"rendered {name} differs from {path}:\n{diff}\nIf the change is intended: {REGENERATE}"
        )


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_render_matches_golden(name):
    assert_golden(name, render(GOLDEN[name]))


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_script_is_valid_bash(name):
    done = subprocess.run(
        ["bash", "-n", str(GOLDEN_DIR / f"{name}.sbatch")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_every_golden_file_has_a_spec():
    assert {p.stem for p in GOLDEN_DIR.glob("*.sbatch")} == set(GOLDEN)


def test_render_is_pure():
    assert render(GOLDEN["nsys"]) == render(GOLDEN["nsys"])


def test_sbatch_header_comes_before_the_first_command():
    lines = render(GOLDEN["plain"]).splitlines()
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert all(not line.startswith("#SBATCH") for line in lines[first_command:])


def test_secret_is_generated_in_the_job_and_exported():
    text = render(GOLDEN["plain"])
    assert "AGENT_SECRET=$(python3 -c 'import secrets;print(secrets.token_hex(32))')" in text
    assert "export AGENT_SECRET\n" in text


def test_wandb_key_is_required_at_run_time_but_never_written():
    text = render(GOLDEN["array"])
    assert "${WANDB_API_KEY:?" in text
    assert "WANDB_API_KEY=" not in text


def test_cpu_only_job_has_no_gpu_request():
    job = JobSpec(slurm=SlurmSpec(job_name="cpu", gpus_per_node=0), step=StepSpec(script="t.py"))
    assert "gpus" not in render(job)


def test_apptainer_without_gpus_drops_nv():
    job = JobSpec(
        slurm=SlurmSpec(job_name="cpu", gpus_per_node=0),
        step=StepSpec(script="t.py"),
        container=ContainerSpec(kind=ContainerKind.APPTAINER, image="img.sif"),
    )
    assert "apptainer exec img.sif" in render(job)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("train.py", "train.py"),
        ("--output=%x-%j.out", "--output=%x-%j.out"),
        ("a b", '"a b"'),
        ("$HOME/data:/data", '"$HOME/data:/data"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("`id`", '"\\`id\\`"'),
        ("", '""'),
    ],
)
def test_word_quotes_only_what_needs_it(text, expected):
    assert word(text) == expected


def test_nsys_prefix_quotes_arguments_with_spaces_for_the_agents_shlex():
    prefix = nsys_prefix(
        NsysSpec(enabled=True, capture_range="none", extra_args=("--env-var", "A=b c"))
    )
    assert prefix == (
        "nsys profile --trace=cuda,nvtx -o nsys-reports/${SLURM_JOB_ID}/nsys-rank{rank} "
        "--force-overwrite true --env-var 'A=b c'"
    )


_REQUEUE_LINES = (
    "#SBATCH --signal=B:USR2@120\n",
    "#SBATCH --open-mode=append\n",
    "#SBATCH --requeue\n",
    "MAX_REQUEUES=2\n",
    "trap on_warning USR2\n",
    'kill -USR2 "${step_pid}"',
    "train.py configs/data.yml configs/model.yml \\\n  -- --seed 1 &\nstep_pid=$!\n",
    "restarts=$((${SLURM_RESTART_COUNT:-0} + ${AGENT_RESUBMITS:-0}))",
    'if ! scontrol requeue "${SLURM_JOB_ID}"; then',
    'resubmit "$((restarts + 1))" "${SLURM_JOB_ID}"',
    'AGENT_RESUBMITS="$1" sbatch --dependency="afterany:$2" "$0"',
)


def _requeue_job() -> JobSpec:
    requeue = RequeueSpec(max_requeues=2, signal_lead=120)
    return JobSpec(slurm=replace(_SLURM, requeue=requeue), step=_STEP)


def test_requeue_lines_present_with_requeue():
    text = render(_requeue_job())
    for line in _REQUEUE_LINES:
        assert line in text, line
    assert text.count("#SBATCH --signal=") == 1
    assert text.index("trap on_warning USR2") < text.index("\nsrun ")  # the trap, then the step


def test_requeue_checkpoint_dir_goes_to_the_agents():
    requeue = RequeueSpec(checkpoint_dir="ckpt/${SLURM_JOB_NAME}")
    text = render(JobSpec(slurm=replace(_SLURM, requeue=requeue), step=_STEP))
    assert 'python -m agent --checkpoint-dir "ckpt/${SLURM_JOB_NAME}"' in text
    assert "--checkpoint-dir" not in render(_requeue_job())


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_requeue_lines_absent_without_requeue(name):
    text = render(GOLDEN[name])
    for line in (*_REQUEUE_LINES, "USR2", "open-mode", "--requeue"):
        assert line not in text, line


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_requeue_script_is_valid_bash(tmp_path):
    path = tmp_path / "requeue.sbatch"
    path.write_text(render(_requeue_job()))
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
