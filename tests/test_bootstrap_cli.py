"""python -m bootstrap: argument parsing, files written, --print, --submit through a fake sbatch."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from bootstrap import cli
from bootstrap.__main__ import main
from bootstrap.render import render
from bootstrap.spec import ContainerKind, RequeueSpec, StepMode

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
FAKE_SBATCH = """#!/bin/sh
# records its arguments, then answers like `sbatch --parsable` (job id;cluster)
echo "$@" >> "$(dirname "$0")/sbatch.calls"
[ -n "$FAIL" ] && { echo "sbatch: error: Batch job submission failed: Invalid account" >&2; exit 1; }
echo "4242;local"
"""


def run_main(argv: list[str], environ: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv, environ=environ or {})
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("train.py", "data.yml", "model.yml"):
        (tmp_path / name).write_text("a: 1\n")
    return tmp_path


def test_help_does_not_import_torch():
    code = (
        "import sys, runpy\n"
        "sys.argv = ['bootstrap', '--help']\n"
        "try:\n    runpy.run_module('bootstrap', run_name='__main__')\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    assert "usage: python -m bootstrap" in done.stdout and done.stdout.endswith("ok\n")


def test_positionals_split_like_the_agent():
    request = cli.parse(
        ["-N", "2", "train.py", "data.yml", "--lr", "1", "model.yaml", "--", "x.yml", "--print"]
    )
    step = request.job.step
    assert step.configs == ("data.yml", "model.yaml")
    assert step.script_args == ("--lr", "1", "x.yml", "--print")
    assert request.print_script is False  # after the script, everything belongs to the script


def test_options_build_the_spec():
    request = cli.parse(
        [
            "-J",
            "big",
            "-N",
            "4",
            "--gpus-per-node",
            "4",
            "--container-image",
            "./img.sqsh",
            "--container-mounts",
            "/a:/a,/b:/b",
            "--container-mounts",
            "/c:/c",
            "--srun-only",
            "--agent-opts=--max-restarts 2",
            "--env",
            "NCCL_DEBUG=INFO",
            "--wandb-project",
            "p",
            "--nsys",
            "--nsys-ranks",
            "0,4-5",
            "--sbatch=--exclusive",
            "train.py",
        ]
    )
    job = request.job
    assert (job.slurm.job_name, job.slurm.nodes, job.slurm.extra) == ("big", 4, ("--exclusive",))
    assert job.container.kind is ContainerKind.PYXIS
    assert job.container.mounts == ("/a:/a", "/b:/b", "/c:/c")
    assert job.step.mode is StepMode.SRUN_ONLY
    assert job.step.agent_options == ("--max-restarts", "2")
    assert job.step.env == (("NCCL_DEBUG", "INFO"), ("WANDB_PROJECT", "p"))
    assert job.step.wandb is True
    assert job.nsys.ranks == (0, 4, 5)


def test_cli_reproduces_the_pyxis_golden_script():
    request = cli.parse(
        [
            "-N",
            "2",
            "--cpus-per-task",
            "32",
            "--mem",
            "200G",
            "-t",
            "01:00:00",
            "-A",
            "research",
            "-p",
            "batch",
            "--env",
            "NCCL_DEBUG=WARN",
            "--env",
            "OMP_NUM_THREADS=4",
            "--container-image",
            "nvcr.io#nvidia/pytorch:24.01-py3",
            "--container-mounts",
            "$HOME/data:/data,/scratch:/scratch",
            "--container-workdir",
            "/workspace",
            "train.py",
            "configs/data.yml",
            "configs/model.yml",
            "--",
            "--seed",
            "1",
        ]
    )
    assert render(request.job) == (GOLDEN / "pyxis.sbatch").read_text()


@pytest.mark.parametrize(
    ("text", "ranks"), [("all", None), ("0,8", (0, 8)), ("0-2,7", (0, 1, 2, 7))]
)
def test_nsys_ranks(text, ranks):
    assert cli.parse_ranks(text) == ranks


def test_writes_job_name_dot_sbatch_by_default(workdir):
    code, out, err = run_main(["-N", "2", "train.py", "data.yml", "model.yml"])
    assert (code, out, err) == (0, "", "wrote train.sbatch\n")
    script = workdir / "train.sbatch"
    assert script.read_text().startswith("#!/bin/bash\n")
    assert os.access(script, os.X_OK)


def test_output_option_and_log_directory_created(workdir):
    code, _, _ = run_main(["-o", "jobs/a.sbatch", "--sbatch-output", "logs/%x-%j.out", "train.py"])
    assert code == 0
    assert (workdir / "jobs" / "a.sbatch").is_file()
    assert (
        workdir / "logs"
    ).is_dir()  # sbatch would not create it, and the job would die without a log


def test_print_only_prints(workdir):
    code, out, err = run_main(["--print", "train.py", "model.yml"])
    assert code == 0 and err == ""
    assert out.startswith("#!/bin/bash\n") and "  train.py model.yml || status=$?" in out
    assert not (workdir / "train.sbatch").exists()


def test_submit_runs_sbatch_and_prints_the_job_id(workdir):
    sbatch = workdir / "fake-sbatch"
    sbatch.write_text(FAKE_SBATCH)
    sbatch.chmod(0o755)
    code, out, err = run_main(
        ["--submit", "--sbatch-command", str(sbatch), "train.py", "model.yml"]
    )
    assert (code, out) == (0, "4242\n"), err
    assert (workdir / "sbatch.calls").read_text() == "--parsable train.sbatch\n"


def test_submit_failure_is_one_line_exit_2(workdir, monkeypatch):
    sbatch = workdir / "fake-sbatch"
    sbatch.write_text(FAKE_SBATCH)
    sbatch.chmod(0o755)
    monkeypatch.setenv("FAIL", "1")
    code, out, err = run_main(["--submit", "--sbatch-command", str(sbatch), "train.py"])
    assert (code, out) == (2, "")
    assert err.endswith(
        "bootstrap: sbatch train.sbatch failed (exit 1): sbatch: error: Batch job submission failed: "
        "Invalid account\n"
    )


def test_submit_without_sbatch_says_so(workdir):
    code, _, err = run_main(
        ["--submit", "--sbatch-command", str(workdir / "no-sbatch"), "train.py"]
    )
    assert code == 2
    assert "no-sbatch not found: submit from a Slurm login node, or pass --sbatch-command" in err


def test_sweep_submits_every_script(workdir):
    sbatch = workdir / "fake-sbatch"
    sbatch.write_text(FAKE_SBATCH)
    sbatch.chmod(0o755)
    code, out, _ = run_main(
        [
            "--submit",
            "--sbatch-command",
            str(sbatch),
            "--set",
            "lr=[1,2,3]",
            "train.py",
            "model.yml",
        ]
    )
    assert (code, out) == (0, "4242\n4242\n4242\n")
    assert len((workdir / "sbatch.calls").read_text().splitlines()) == 3


def test_unwritable_output_is_one_line(workdir):
    code, _, err = run_main(
        ["-o", "train.py/x.sbatch", "train.py"]
    )  # a file where a directory must be
    assert code == 2
    assert err.startswith("bootstrap: cannot write train.py/x.sbatch: ") and err.count("\n") == 1


def test_requeue_options_build_the_spec():
    assert cli.parse(["train.py"]).job.slurm.requeue is None
    assert cli.parse(["--requeue", "train.py"]).job.slurm.requeue == RequeueSpec(3, 90)
    request = cli.parse(["--requeue", "--max-requeues", "5", "--signal-lead", "300", "train.py"])
    assert request.job.slurm.requeue == RequeueSpec(max_requeues=5, signal_lead=300)
    assert "#SBATCH --signal=B:USR2@300\n" in render(request.job)
    assert "MAX_REQUEUES=5\n" in render(request.job)
