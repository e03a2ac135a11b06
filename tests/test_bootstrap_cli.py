"""python -m bootstrap: argument parsing, files written, --print, --submit through a fake sbatch."""

from __future__ import annotations

import io
import os
import re
import shlex
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import docs_pages
import pytest

from agent.errors import AgentError
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
    assert request.print_script is False  # after --, everything belongs to the script


OPTIONS = cli.build_parser().flags


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["t.py", "a.yml", "--print"], ["--print", "t.py", "a.yml"]),
        (["-N", "2", "t.py", "a.yml", "--submit"], ["-N", "2", "--submit", "t.py", "a.yml"]),
        (["t.py", "-N", "2", "a.yml"], ["-N", "2", "t.py", "a.yml"]),  # a value comes along
        (["t.py", "--nodes=2", "-N3", "-t", "5"], ["--nodes=2", "-N3", "-t", "5", "t.py"]),
        (["t.py", "--lr", "1", "--print"], ["--print", "t.py", "--lr", "1"]),  # --lr: the script's
        (["t.py", "--", "--print"], ["t.py", "--", "--print"]),  # after --: the script's
        (
            ["t.py", "a.yml", "--print", "--", "-N", "2"],
            ["--print", "t.py", "a.yml", "--", "-N", "2"],
        ),
        (
            ["-o", "x.sbatch", "t.py"],
            ["-o", "x.sbatch", "t.py"],
        ),  # x.sbatch is -o's, not the script
        (["--sbatch=--exclusive", "t.py", "-x"], ["--sbatch=--exclusive", "t.py", "-x"]),
        (["t.py", "-1", "-"], ["t.py", "-1", "-"]),  # not options of ours
        (["--print"], ["--print"]),  # no script: argparse says so
        ([], []),
    ],
)
def test_options_after_the_script_move_in_front_of_it(argv, expect):
    assert cli.options_first(argv, OPTIONS) == expect


def test_an_option_after_the_script_without_its_value_is_one_line():
    with pytest.raises(AgentError, match=r"^-o after the script: expected a value \(see python"):
        cli.parse(["t.py", "a.yml", "-o"])


def test_no_script_names_no_internal_argument():
    with pytest.raises(AgentError) as caught:
        cli.parse(["-N", "2"])
    assert "required: script (" in caught.value.message and "rest" not in caught.value.message


@pytest.fixture
def laid_out(tmp_path: Path) -> Path:
    """A directory with the checkout's scripts/ and configs/ (so the README's paths hold) and a
    bin/ holding a fake sbatch that records its arguments in bin/sbatch.calls."""
    for name in ("scripts", "configs"):
        (tmp_path / name).symlink_to(REPO / name)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "sbatch").write_text(FAKE_SBATCH)
    (tmp_path / "bin" / "sbatch").chmod(0o755)
    return tmp_path


def _bootstrap(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """python -m bootstrap ARGS as a user runs it in `cwd`, with `cwd`/bin first on PATH."""
    path = f"{cwd / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(
        [sys.executable, "-m", "bootstrap", *args],
        capture_output=True, text=True, timeout=60, cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), "PATH": path},
    )  # fmt: skip


EXAMPLE = ["scripts/examples/check_args.py", "configs/data.yml", "configs/model.yml"]


def test_print_after_the_script_prints_it(laid_out):
    """The issue's command: --print after the configs is bootstrap's, not the script's."""
    done = _bootstrap(["-N", "2", "--gpus-per-node", "0", *EXAMPLE, "--print"], laid_out)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("#!/bin/bash\n") and "#SBATCH --nodes=2\n" in done.stdout
    assert f"  {' '.join(EXAMPLE)} || status=$?" in done.stdout  # nothing passed to the script
    assert done.stderr == "" and not (laid_out / "check_args.sbatch").exists()  # printed only


def test_submit_after_the_script_submits_it(laid_out):
    """--submit after the script runs the sbatch found on PATH, on the script it wrote."""
    done = _bootstrap([*EXAMPLE, "-N", "2", "--gpus-per-node", "0", "--submit"], laid_out)
    assert (done.returncode, done.stdout) == (0, "4242\n"), done.stderr
    assert (laid_out / "bin" / "sbatch.calls").read_text() == "--parsable check_args.sbatch\n"
    script = (laid_out / "check_args.sbatch").read_text()
    assert "#SBATCH --nodes=2\n" in script and "--submit" not in script


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


def readme_bootstrap_commands() -> list[str]:
    """Every `python -m bootstrap` command the docs (README.md, docs/*.md) show with a script:
    in their command blocks (continuation lines joined) and in their inline code."""
    text = docs_pages.text()
    found = []
    for block in re.findall(r"```[^\n]*\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith("python -m bootstrap "):
                found.append(line)
    for span in re.findall(r"`(python -m bootstrap [^`]*)`", text):
        if ".py " in span:
            found.append(" ".join(span.split()))
    return found


README_COMMANDS = readme_bootstrap_commands()


def test_the_readme_shows_bootstrap_printing_and_submitting():
    words = [shlex.split(c, comments=True) for c in README_COMMANDS]
    assert any(w[-1] == "--print" for w in words) and any(w[-1] == "--submit" for w in words)


@pytest.mark.parametrize("command", README_COMMANDS)
def test_readme_bootstrap_command_runs_as_written(command, laid_out):
    """Typed as the README has it, from a directory laid out like the checkout, with a fake
    sbatch on PATH: it prints or writes and submits the script, and passes nothing of ours on."""
    words = shlex.split(command, comments=True)
    assert words[:3] == ["python", "-m", "bootstrap"], command
    done = _bootstrap(words[3:], laid_out)
    assert done.returncode == 0, f"{command}\n{done.stderr}"
    script_name = Path(next(w for w in words if w.endswith(".py"))).stem + ".sbatch"
    script = done.stdout if "--print" in words else (laid_out / script_name).read_text()
    assert script.startswith("#!/bin/bash\n"), done.stdout
    assert "--print" not in script and "--submit" not in script, script
    if "--submit" in words:
        assert done.stdout == "4242\n", done.stderr
        calls = (laid_out / "bin" / "sbatch.calls").read_text()
        assert calls == f"--parsable {script_name}\n"
