"""The docs run as written: every command line of every command block in README.md and docs/*.md
is run here as a user types it (in a directory laid out like the checkout, or in an salloc on the
local Slurm), or is run as written by another test this file names, or says in the doc itself
why CI does not run it (`# not run in CI: WHY`, above it or at its end). A new command block
that is none of these fails `test_every_command_line_is_run_or_marked`."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import docs_pages
import pytest
from cluster import REPO, base_env
from slurm_local import slurm_env

pytestmark = pytest.mark.e2e

# A block is commands unless its language says otherwise (```text for listings, ```python for
# code); ```console holds a session, whose commands are the `$ ` lines.
COMMAND_LANGUAGES = ("", "bash", "sh", "shell", "console")
NOT_RUN = "# not run in CI:"


@dataclass(frozen=True)
class CommandLine:
    page: str  # relative to the checkout
    text: str  # as a user types it, continuation lines joined
    not_run: str  # the marker's reason, "" when the line is not marked


def command_lines() -> list[CommandLine]:
    found = []
    for page in docs_pages.pages():
        name = str(page.relative_to(REPO))
        blocks = re.findall(r"^```(\w*)\n(.*?)^```", page.read_text(), re.S | re.M)
        for language, body in blocks:
            if language not in COMMAND_LANGUAGES:
                continue
            marker = ""  # a marker line covers the command lines below it up to a blank line
            for raw in body.replace("\\\n", " ").splitlines():
                line = raw.strip()
                if not line:
                    marker = ""
                elif line.startswith("#"):
                    marker = line if line.startswith(NOT_RUN) else ""
                elif language != "console" or line.startswith("$ "):
                    text = line.removeprefix("$ ")
                    own = text[text.index(NOT_RUN) :] if NOT_RUN in text else ""
                    found.append(CommandLine(name, text, marker or own))
    return found


# Run here, in the order the docs show them, in one directory laid out like the checkout: the
# first makes the job whose log dir the read-only ones after it share. Value: (exit code, a line
# the docs say it prints, as a regex searched in stdout + stderr).
RUN_HERE = {
    "python -m agent --nproc-per-node 2 --log-dir logs/demo scripts/examples/check_args.py configs/data.yml configs/model.yml": (  # noqa: E501
        0,
        r"(?m)^\S+:1: check_args: OK .*(?s:.*)job succeeded",
    ),
    "python -m agent logs logs/demo --rank 1 -n 1          # rank 1's last line, prefixed vm:1:": (  # noqa: E501
        0,
        r"\A\S+:1: check_args: OK \{.*\}\n\Z",
    ),
    "python -m agent logs logs/demo --summary              # per rank: host, state, exit code, seconds": (  # noqa: E501
        0,
        r"(?m)^│ 1 .*│ succeeded │ exit code 0 │",
    ),
    "python -m agent logs logs/demo --timeline job.svg     # the job as a picture": (
        0,
        r"(?m)^timeline: job\.svg \(2 lane\(s\) by rank, 1 attempt\(s\)\)$",
    ),
    "python -m agent history --last 1                      # this user's jobs, the last one": (
        0,
        r"│ local-\d{8}-\d{6}-\d+ .*│ 0 +│ - +│ scripts/examples/check_args\.py",
    ),
    "python -m agent stacks logs/demo                      # a finished job: says so, exit 3": (
        3,
        r"(?m)^agent: error: the job of logs/demo has finished: its summary: logs/demo/summary\.json$",  # noqa: E501
    ),
    "python -m agent --dry-run --nproc-per-node 2 scripts/examples/check_args.py configs/data.yml": (  # noqa: E501
        0,
        r"(?m)^plan: local world, 1 node\(s\), world size 2, .*nothing started \(--dry-run\)$",
    ),
}

# Run under the local Slurm, in one `salloc -N2` (the docs' own salloc asks for GPU nodes), from
# a directory laid out like the checkout with check_args.py as the docs' train.py.
RUN_UNDER_SLURM = {
    "srun --ntasks-per-node=1 python -m agent train.py configs/data.yml configs/model.yml": (
        0,
        r"(?m)^n2:1: check_args: OK .*(?s:.*)job succeeded",
    ),
    "srun --ntasks-per-node=1 --disable-status python -m agent train.py configs/data.yml configs/model.yml -- --seed 1": (  # noqa: E501
        0,
        r'(?m)^n2:1: check_args: OK \{"all_reduce": 1, "argv": \["--seed", "1"\]',
    ),
}

# Run as written by another test: (test file, test function, a piece of that function's source
# that runs it). The piece must be in the function, so a renamed or rewritten test fails here.
BOOTSTRAP = (
    "test_bootstrap_cli.py",
    "test_readme_bootstrap_command_runs_as_written",
    "_bootstrap(words[3:], laid_out)",
)  # noqa: E501
DEBUG = "test_e2e_debug.py", "test_breakpoint_pauses_a_rank_for_a_pdb_session_in_the_terminal"
RESIDENT = "test_slurm.py", "test_resident_agents_in_an_salloc"
RUN_ELSEWHERE = {
    "pip install -e '.[dev]' && python -m agent --nproc-per-node 2 scripts/examples/check_args.py configs/data.yml configs/model.yml": (  # noqa: E501
        "test_readme.py",
        "test_readme_example_command_runs_every_rank",
        "proc = subprocess.run(",
    ),
    "python -m pytest -q": (
        "test_readme.py",
        "test_ci_runs_the_readme_test_command",
        'ci = (REPO / ".ci" / "run")',
    ),
    "python -m bootstrap -N 2 --gpus-per-node 0 scripts/examples/check_args.py configs/data.yml configs/model.yml --print   # inspect": BOOTSTRAP,  # noqa: E501
    "python -m bootstrap -N 2 --gpus-per-node 0 scripts/examples/check_args.py configs/data.yml configs/model.yml --submit  # write check_args.sbatch + sbatch": BOOTSTRAP,  # noqa: E501
    "python -m bootstrap -N 2 --gpus-per-node 8 -p batch -t 02:00:00      --container-image nvcr.io/nvidia/pytorch:24.05-py3 --container-mounts /data:/data      scripts/examples/ddp_train.py configs/data.yml configs/model.yml --print  # GPUs, in a container": BOOTSTRAP,  # noqa: E501
    "srun --ntasks-per-node=1 python -m agent --log-dir logs/77 train.py &": (
        *DEBUG,
        "cluster_factory(2).start([JOB])",
    ),
    "python -m agent debug logs/77": (*DEBUG, '_debug(cluster, "--list")'),
    "python -m agent debug logs/77 --rank 1": (*DEBUG, 'Terminal.debug(cluster, "--rank", "1")'),
    "srun --ntasks-per-node=1 python -m agent serve &     # one resident agent per node": (
        *RESIDENT,
        "-m agent serve",
    ),
    "python -m agent run [OPTIONS] train.py data.yml model.yml [-- ARGS]": (
        *RESIDENT,
        "-m agent run --nproc-per-node 1 {FIXTURE} --stdout 'first run'",
    ),
    "python -m agent run ...                               # again, after editing train.py: warm": (  # noqa: E501
        *RESIDENT,
        "-m agent run --nproc-per-node 1 {FIXTURE} --stdout 'second run'",
    ),
    "python -m agent status                                # nodes, hosts, warm or not, current run": (  # noqa: E501
        *RESIDENT,
        "-m agent status",
    ),
    "python -m agent down                                  # stop the resident agents": (
        *RESIDENT,
        "-m agent down",
    ),
}


def test_every_command_line_is_run_or_marked():
    lines = command_lines()
    tables = (RUN_HERE, RUN_UNDER_SLURM, RUN_ELSEWHERE)
    neither = [
        f"{c.page}: {c.text}"
        for c in lines
        if not c.not_run and not any(c.text in t for t in tables)
    ]  # noqa: E501
    assert not neither, "run these in tests/test_docs_commands.py or mark them " + repr(neither)
    both = [c.text for c in lines if c.not_run and any(c.text in t for t in tables)]
    assert not both, f"marked as not run, yet run: {both}"
    assert all(len(c.not_run) > len(NOT_RUN) + 3 for c in lines if c.not_run), "say why"
    shown = {c.text for c in lines}
    for table in tables:  # an entry whose command left the docs runs nothing the docs show
        assert not set(table) - shown, set(table) - shown


def test_commands_run_elsewhere_are_run_there():
    for command, (file, function, piece) in RUN_ELSEWHERE.items():
        tree = ast.parse(source := (REPO / "tests" / file).read_text())
        (found,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
        assert piece in ast.get_source_segment(source, found), (command, file, function, piece)
    # The bootstrap test is parametrized with the docs' own commands: these very lines (and the
    # inline ones).
    from test_bootstrap_cli import readme_bootstrap_commands

    bootstrap = [c for c, entry in RUN_ELSEWHERE.items() if entry == BOOTSTRAP]
    assert not set(bootstrap) - set(readme_bootstrap_commands())


def _laid_out(tmp: Path) -> Path:
    """A user's directory: the checkout's scripts/ and configs/, so the docs' paths hold."""
    for name in ("scripts", "configs"):
        (tmp / name).symlink_to(REPO / name)
    return tmp


def _said(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


def test_commands_run_as_written_in_a_checkout(tmp_path):
    cwd = _laid_out(tmp_path)
    env = base_env(tmp_path)  # no scheduler: a user's workstation
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]  # `python` is ours
    env["COLUMNS"] = "250"  # wide enough that no table column is cut
    ran = [c.text for c in command_lines() if c.text in RUN_HERE]
    assert ran == list(RUN_HERE), "run in the docs' order: the job first, then its readers"
    for command in ran:
        code, says = RUN_HERE[command]
        proc = subprocess.run(
            ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
        )
        assert proc.returncode == code, f"{command}\n{_said(proc)}"
        assert re.search(says, proc.stdout + proc.stderr), f"{command}\n{_said(proc)}"
    assert "</svg>" in (cwd / "job.svg").read_text(), "the timeline was drawn"


@pytest.mark.slurm
def test_slurm_commands_run_as_written_in_an_salloc(slurm, tmp_path):
    cwd = _laid_out(tmp_path)
    (cwd / "train.py").symlink_to(REPO / "scripts" / "examples" / "check_args.py")
    env = slurm_env()
    env.update(
        {"AGENT_STATE_DIR": str(tmp_path / "state"), "AGENT_SECRET": "docs-" + tmp_path.name}
    )
    commands = [c.text for c in command_lines() if c.text in RUN_UNDER_SLURM]
    assert sorted(commands) == sorted(RUN_UNDER_SLURM)
    # One allocation, one step per command; each command's output between two fences.
    session = "exec 2>&1\n" + "".join(
        f"echo '<<< {i}'\n{c}\necho '>>> {i} rc='$?\n" for i, c in enumerate(commands)
    )
    (cwd / "session.sh").write_text(session)
    proc = subprocess.run(
        ["salloc", "-N2", "--immediate=60", "bash", "session.sh"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    for i, command in enumerate(commands):
        code, says = RUN_UNDER_SLURM[command]
        seen = re.search(rf"(?s)<<< {i}\n(.*)>>> {i} rc=(\d+)", proc.stdout)
        assert seen, f"{command}\n{out}"
        assert int(seen.group(2)) == code, f"{command}\n{out}"
        assert re.search(says, seen.group(1)), f"{command}\n{out}"


def _agent_words(command: str) -> tuple[str, list[str]] | None:
    """A `python -m agent` command line → (its subcommand, "" for the main one; the options it
    names before the script or `--`), None for any other program."""
    words = command.split("#", 1)[0].split()  # the docs' own comments end a line
    if "agent" not in words or words[words.index("agent") - 1] != "-m":
        return None
    words = words[words.index("agent") + 1 :]
    from agent.__main__ import SUBCOMMANDS

    sub = words.pop(0) if words and words[0] in SUBCOMMANDS else ""
    named = []
    for word in words:
        if word == "--" or word.endswith(".py") or word == "...":
            break
        named += re.findall(r"^\[?(--[a-z][a-z0-9-]*)", word)
    return sub, named


def test_every_option_a_command_line_names_exists():
    """Lines not run (synopses among them) still name only options the agent has: each is in
    its subcommand's --help."""
    helps: dict[str, str] = {}
    for line in command_lines():
        if (parsed := _agent_words(line.text)) is None:
            continue
        sub, named = parsed
        if sub not in helps:
            argv = [sys.executable, "-m", "agent", *([sub] if sub else []), "--help"]
            helps[sub] = subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout
        for option in named:
            assert re.search(rf"{option}\b", helps[sub]), (line.page, line.text, option)
