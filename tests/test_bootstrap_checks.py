"""bootstrap.checks: every problem is one AgentError line with exit code 2, before anything is written."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from agent.errors import AgentError, ExitCode
from bootstrap import checks
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

REPO = Path(__file__).resolve().parent.parent
FILES = {"train.py", "data.yml", "model.yml", "/images/pytorch.sqsh"}
JOB = JobSpec(
    slurm=SlurmSpec(job_name="train", nodes=2, gpus_per_node=8),
    step=StepSpec(script="train.py", configs=("data.yml", "model.yml")),
)


def check(job: JobSpec = JOB, env: dict[str, str] | None = None, **kw) -> None:
    checks.check_job(job, exists=FILES.__contains__, env=env or {}, **kw)


def fails(match: str, job: JobSpec = JOB, **kw) -> AgentError:
    with pytest.raises(AgentError, match=match) as info:
        check(job, **kw)
    assert info.value.code == ExitCode.USAGE
    assert "\n" not in str(info.value)
    return info.value


def with_slurm(**kw) -> JobSpec:
    return replace(JOB, slurm=replace(JOB.slurm, **kw))


def with_step(**kw) -> JobSpec:
    return replace(JOB, step=replace(JOB.step, **kw))


def test_a_good_job_passes():
    check()


def test_script_must_exist():
    fails(r"^script nope.py not found: check the path", with_step(script="nope.py"))


def test_every_config_must_exist():
    fails(r"^config model2.yml not found", with_step(configs=("data.yml", "model2.yml")))


def test_path_checks_can_be_skipped():
    check(with_step(script="nope.py", configs=("x.yml",)), check_paths=False)


def test_local_container_image_must_exist():
    job = replace(
        JOB, container=ContainerSpec(kind=ContainerKind.PYXIS, image="/images/other.sqsh")
    )
    fails(r"^container image /images/other.sqsh not found", job)


@pytest.mark.parametrize(
    ("kind", "image"),
    [
        (ContainerKind.PYXIS, "/images/pytorch.sqsh"),
        (ContainerKind.PYXIS, "nvcr.io#nvidia/pytorch:24.01-py3"),
        (ContainerKind.PYXIS, "ubuntu:22.04"),
        (ContainerKind.APPTAINER, "docker://nvcr.io/nvidia/pytorch:24.01-py3"),
    ],
)
def test_registry_images_and_present_files_pass(kind, image):
    check(replace(JOB, container=ContainerSpec(kind=kind, image=image)))


def test_apptainer_image_without_scheme_is_a_file():
    fails(
        r"^container image pytorch.sif not found",
        replace(JOB, container=ContainerSpec(kind=ContainerKind.APPTAINER, image="pytorch.sif")),
    )


def test_container_needs_an_image():
    fails(
        r"^--container pyxis needs --container-image",
        replace(JOB, container=ContainerSpec(kind=ContainerKind.PYXIS)),
    )


def test_mounts_need_a_container():
    fails(r"need --container-image", replace(JOB, container=ContainerSpec(mounts=("/data:/data",))))


def test_wandb_needs_the_key_in_the_environment():
    fails(r"^--wandb needs WANDB_API_KEY in your environment", with_step(wandb=True))
    check(with_step(wandb=True), env={"WANDB_API_KEY": "k"})


@pytest.mark.parametrize("nodes", [0, -1])
def test_nodes_at_least_one(nodes):
    fails(rf"^--nodes {nodes}: a job needs at least 1 node", with_slurm(nodes=nodes))


def test_more_than_eight_gpus_needs_allow_many_gpus():
    fails(r"^--gpus-per-node 16: more than 8 GPUs.*--allow-many-gpus", with_slurm(gpus_per_node=16))
    check(with_slurm(gpus_per_node=16), allow_many_gpus=True)


def test_srun_only_needs_gpus():
    fails(
        r"^--srun-only starts one task per GPU",
        replace(
            JOB,
            slurm=replace(JOB.slurm, gpus_per_node=0),
            step=replace(JOB.step, mode=StepMode.SRUN_ONLY),
        ),
    )


@pytest.mark.parametrize(
    "good",
    [
        "90",
        "90:30",
        "01:00:00",
        "100:00:00",
        "2-0",
        "2-12",
        "2-12:30",
        "2-12:30:15",
        "UNLIMITED",
        "infinite",
    ],
)
def test_time_formats_slurm_accepts(good):
    checks.check_time(good)


@pytest.mark.parametrize(
    "bad", ["1h", "01:00:00:00", "1:60", "2-24:00:00", "1:00:61", "-5", "2-", "", "1.5"]
)
def test_time_formats_slurm_rejects(bad):
    fails(rf"^--time {bad!r}", with_slurm(time=bad))


@pytest.mark.parametrize("good", ["0-3", "0-3%2", "1,3,5-7", "0-15:4", "7", "0-15:4%1"])
def test_array_formats_slurm_accepts(good):
    checks.check_array(good)


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("0-3%", "the limit after %"),
        ("0-3%0", "the limit after %"),
        ("a-b", "is not a Slurm array"),
        ("3-1", "range 3-1 ends before it starts"),
        ("0-8:0", "the step in 0-8:0"),
        ("1,,2", "is not a Slurm array"),
    ],
)
def test_array_formats_slurm_rejects(bad, why):
    fails(rf"^--array {bad!r}.*{why}", with_slurm(array=bad))


def test_mem_and_signal_formats():
    fails(r"^--mem '200 GB'", with_slurm(mem="200 GB"))
    fails(r"^--signal 'USR1@'", with_slurm(signal="USR1@"))
    check(with_slurm(mem="512000M", signal="B:USR1@90"))


def test_env_names_must_be_variable_names():
    fails(r"^--env 'NCCL-DEBUG': not a variable name", with_step(env=(("NCCL-DEBUG", "1"),)))


def test_agent_options_go_through_the_agents_parser():
    fails(
        r"^--agent-opts: unrecognized arguments: --no-such-option",
        with_step(agent_options=("--no-such-option",)),
    )
    check(with_step(agent_options=("--max-restarts", "2", "--log-dir", "logs")))


def test_nsys_ranks_must_be_in_the_world():
    nsys = NsysSpec(enabled=True, ranks=(0, 16))
    fails(
        r"^--nsys-ranks: rank 16 is not in this job's world of 16 ranks \(0-15\)",
        replace(JOB, nsys=nsys),
    )


def test_nsys_output_needs_rank_placeholder():
    fails(r"put \{rank\} in it", replace(JOB, nsys=NsysSpec(enabled=True, output="nsys/report")))


def run_cli(
    tmp_path: Path, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    environ.update(env or {}, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "bootstrap", *argv],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_missing_script_exits_2_with_one_line(tmp_path):
    done = run_cli(tmp_path, "train.py", "model.yml")
    assert done.returncode == 2
    assert done.stderr.startswith("bootstrap: script train.py not found: check the path")
    assert done.stderr.count("\n") == 1 and done.stdout == ""
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_cli_too_many_gpus_and_missing_wandb_key_exit_2(tmp_path):
    (tmp_path / "train.py").write_text("")
    done = run_cli(tmp_path, "--gpus-per-node", "16", "train.py")
    assert (done.returncode, done.stderr.count("\n")) == (2, 1)
    assert "--allow-many-gpus" in done.stderr
    done = run_cli(tmp_path, "--wandb", "train.py")
    assert (done.returncode, done.stderr.count("\n")) == (2, 1)
    assert "WANDB_API_KEY" in done.stderr
    assert run_cli(tmp_path, "--wandb", "train.py", env={"WANDB_API_KEY": "x"}).returncode == 0


def test_cli_bad_option_is_one_line_exit_2(tmp_path):
    done = run_cli(tmp_path, "--nodes", "two", "train.py")
    assert done.returncode == 2
    assert (
        done.stderr
        == "bootstrap: argument -N/--nodes: invalid int value: 'two' (see python -m bootstrap --help)\n"
    )


def test_requeue_values():
    check(with_slurm(requeue=RequeueSpec(), time="02:00:00"))
    check(with_slurm(requeue=RequeueSpec(max_requeues=1, signal_lead=65535)))
    fails(r"^--max-requeues 0: must be 1 or more", with_slurm(requeue=RequeueSpec(max_requeues=0)))
    fails(
        r"^--signal-lead 0: seconds from 1 to 65535", with_slurm(requeue=RequeueSpec(signal_lead=0))
    )
    fails(r"^--signal-lead 65536: ", with_slurm(requeue=RequeueSpec(signal_lead=65536)))
    fails(
        r"^--signal-lead 600: the warning would come before the job starts \(--time 10 is 600s\)",
        with_slurm(requeue=RequeueSpec(signal_lead=600), time="10"),
    )
    fails(r"^--signal with --requeue", with_slurm(requeue=RequeueSpec(), signal="USR1@90"))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("10", 600),
        ("10:30", 630),
        ("01:00:00", 3600),
        ("2-00", 172800),
        ("1-02:03", 93780),
        ("1-02:03:04", 93784),
        ("UNLIMITED", None),
    ],
)
def test_time_seconds(text, seconds):
    checks.check_time(text)
    assert checks.time_seconds(text) == seconds


def test_cli_bad_requeue_options_are_one_line_exit_2(tmp_path):
    (tmp_path / "train.py").write_text("")
    for argv, why in [
        (["--max-requeues", "2"], "bootstrap: --max-requeues needs --requeue\n"),
        (["--signal-lead", "60"], "bootstrap: --signal-lead needs --requeue\n"),
        (["--requeue", "--max-requeues", "-1"], "bootstrap: --max-requeues -1: must be 1 or more"),
        (["--requeue", "--signal-lead", "0"], "bootstrap: --signal-lead 0: seconds from 1 to"),
    ]:
        done = run_cli(tmp_path, *argv, "train.py")
        assert (done.returncode, done.stderr.count("\n")) == (2, 1), done.stderr
        assert done.stderr.startswith(why), done.stderr
    assert list(tmp_path.iterdir()) == [tmp_path / "train.py"]  # nothing written
