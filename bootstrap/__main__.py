"""`python -m bootstrap`: parse → check → render → write → submit; AgentError → one line, its code."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.errors import AgentError
from agent.plan.config import read_config
from bootstrap import cli, sweep
from bootstrap.checks import check_job
from bootstrap.render import render
from bootstrap.spec import JobSpec
from bootstrap.submit import Run, submit


@dataclass(frozen=True)
class Generated:
    path: str
    text: str
    is_script: bool


def main(
    argv: Sequence[str] | None = None,
    *,
    environ: Mapping[str, str] = os.environ,
    run: Run = subprocess.run,
) -> int:
    try:
        request = cli.parse(sys.argv[1:] if argv is None else argv)
        check_job(
            request.job,
            exists=_exists,
            env=environ,
            allow_many_gpus=request.allow_many_gpus,
            check_paths=request.check_paths,
        )
        files = _sweep_files(request) if request.is_sweep else _single_file(request)
        scripts = [f for f in files if f.is_script]
        if request.print_script:
            for script in scripts:
                print(
                    f"# ==> {script.path} <==\n{script.text}" if request.is_sweep else script.text,
                    end="",
                )
        if request.output or request.submit or not request.print_script:
            _write(files)
            _make_log_dirs(request.job)
            _report(request, files, scripts)
        if request.submit:
            for script in scripts:
                print(submit(script.path, sbatch=request.sbatch_command, run=run), flush=True)
        return 0
    except AgentError as err:
        print(f"bootstrap: {err}", file=sys.stderr)
        return int(err.code)


def _exists(path: str) -> bool:
    return os.path.exists(os.path.expandvars(os.path.expanduser(path)))


def _single_file(request: cli.Request) -> list[Generated]:
    path = request.output or f"{request.job.slurm.job_name}.sbatch"
    return [Generated(path, render(request.job), True)]


def _sweep_files(request: cli.Request) -> list[Generated]:
    """Per combination: its resolved config, and a script that passes it in the template's place."""
    outdir = request.output or f"{request.job.slurm.job_name}-sweep"
    configs = request.job.step.configs
    template_path = configs[-1] if configs else None
    template = read_config(template_path) if template_path else {}
    search: Mapping = {}
    if request.search_config:
        if not os.path.isfile(request.search_config):
            raise AgentError(f"search config {request.search_config} not found: check the path")
        search = read_config(request.search_config)
    files = []
    for point in sweep.points(template, search, request.overrides):
        config_path = os.path.join(outdir, f"{point.name}.yml")
        files.append(Generated(config_path, sweep.resolved_yaml(point, template_path), False))
        script = render(sweep.job_for(request.job, point, config_path))
        files.append(Generated(os.path.join(outdir, f"{point.name}.sbatch"), script, True))
    return files


def _write(files: Sequence[Generated]) -> None:
    for file in files:
        path = Path(file.path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(file.text, encoding="utf-8")
            if file.is_script:
                path.chmod(0o755)
        except OSError as err:
            raise AgentError(
                f"cannot write {file.path}: {err.strerror}; pick another --output"
            ) from None


def _make_log_dirs(job: JobSpec) -> None:
    """sbatch does not create the job log's directory, and the job then dies without a log."""
    for pattern in (job.slurm.output, job.slurm.error):
        directory = os.path.dirname(pattern or "")
        if directory and "%" not in directory and "$" not in directory:
            try:
                os.makedirs(directory, exist_ok=True)
            except OSError as err:
                raise AgentError(
                    f"cannot create the job log directory {directory}: {err.strerror}"
                ) from None


def _report(request: cli.Request, files: Sequence[Generated], scripts: Sequence[Generated]) -> None:
    if request.is_sweep:
        where = Path(scripts[0].path).parent if scripts else request.output
        print(
            f"wrote {len(files) - len(scripts)} configs and {len(scripts)} scripts to {where}/",
            file=sys.stderr,
        )
    else:
        print(f"wrote {scripts[0].path}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
