"""The agent's command line as users type it: its own options after the script are warned about
(and still passed on, as torchrun does); --version; no arguments at all."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import time

import pytest
from cluster import CHECK_ARGS, REPO, base_env

from agent.__main__ import SUBCOMMANDS
from agent.launch.cli import Command, build_parser, misplaced_options, misplaced_warning, own_flags
from agent.plan.options import OPTIONS, OptionScope
from agent.serve.cli import parse_serve, run_parser, serve_parser

AGENT_FLAGS = own_flags(build_parser())
RUN_FLAGS = own_flags(run_parser())


@pytest.mark.parametrize(
    ("rest", "flags", "found"),
    [
        (["a.yml", "--console-ranks", "0"], AGENT_FLAGS, ("--console-ranks",)),
        (["--grace=3", "--lr", "1"], AGENT_FLAGS, ("--grace",)),  # --lr: the script's own
        (["--", "--console-ranks", "0"], AGENT_FLAGS, ()),  # after --: the script's by request
        (["--grace", "1", "--", "--log-dir", "x"], AGENT_FLAGS, ("--grace",)),
        (["--console-ranks", "0", "--console-ranks", "1"], AGENT_FLAGS, ("--console-ranks",)),
        (["--dry-run", "--set", "a=1", "--no-live"], AGENT_FLAGS, ("--dry-run", "--set", "--no-live")),
        (["--help", "-h", "--version", "-m", "--live"], AGENT_FLAGS, ()),  # the script's, likelier
        (["--master-port", "1", "--grace", "1"], RUN_FLAGS, ("--grace",)),  # not `agent run`'s
        ([], AGENT_FLAGS, ()),
    ],
)  # fmt: skip
def test_the_agents_options_after_the_script(rest, flags, found):
    assert misplaced_options(rest, flags) == found


def test_every_option_of_the_table_is_one_the_warning_knows():
    for option in OPTIONS:
        name = option.name.replace("_", "-")
        flag = f"--no-{name}" if option.kind is bool and option.default is True else f"--{name}"
        assert flag in AGENT_FLAGS, flag
    assert {"--dry-run", "--set"} <= AGENT_FLAGS and not {"--help", "--version"} & AGENT_FLAGS


def test_serve_and_run_take_the_options_of_their_scope():
    """The option table says whose an option is: `serve` takes the node's (and BOTH), `run` a
    run's (and BOTH); a node's option never comes from a config."""
    serve_flags, run_flags = own_flags(serve_parser()), RUN_FLAGS
    for option in OPTIONS:
        name = option.name.replace("_", "-")
        flag = f"--no-{name}" if option.kind is bool and option.default is True else f"--{name}"
        assert (flag in serve_flags) == (option.scope is not OptionScope.RUN), flag
        assert (flag in run_flags) == (option.scope is not OptionScope.NODE), flag
        assert option.scope is not OptionScope.NODE or not option.in_config, flag
    assert parse_serve(["--heartbeat-timeout", "3", "--cold"]).options == {
        "heartbeat_timeout": 3.0,
        "cold": True,
    }


def _command(*misplaced: str) -> Command:
    return Command({}, "train.py", (), (), (), False, misplaced)


@pytest.mark.parametrize(
    ("misplaced", "warning"),
    [
        ((), None),
        (
            ("--console-ranks",),
            "--console-ranks after the script goes to train.py; put it before the script "
            "(or after --, to pass it on without this warning)",
        ),
        (
            ("--grace", "--log-dir"),
            "--grace, --log-dir after the script go to train.py; put them before the script "
            "(or after --, to pass them on without this warning)",
        ),
    ],
)
def test_the_warning_names_each_option_once(misplaced, warning):
    assert misplaced_warning(_command(*misplaced)) == warning


def _agent(tmp_path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agent", *argv],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=base_env(tmp_path),
    )  # fmt: skip


def test_an_option_after_the_script_is_warned_about_once_and_passed_on(tmp_path):
    """`python -m agent ... train.py cfg.yml --console-ranks 0`: one warning line on stderr,
    and the script still gets the words (torchrun's way); after `--`, no warning."""
    config = str(REPO / "configs" / "data.yml")
    head = ("--dry-run", "--nproc-per-node", "1", CHECK_ARGS, config)
    warned = _agent(tmp_path, *head, "--console-ranks", "0", "--lr", "1", "--console-ranks", "1")
    assert warned.returncode == 0, warned.stderr
    assert warned.stderr.splitlines() == [
        f"agent: warning: --console-ranks after the script goes to {CHECK_ARGS}; put it before "
        "the script (or after --, to pass it on without this warning)"
    ]
    argv = f"  argv: {sys.executable} {CHECK_ARGS} --console-ranks 0 --lr 1 --console-ranks 1\n"
    assert argv in warned.stdout, warned.stdout
    quiet = _agent(tmp_path, *head, "--", "--console-ranks", "0")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert f"  argv: {sys.executable} {CHECK_ARGS} --console-ranks 0\n" in quiet.stdout


def test_agent_run_warns_in_the_client(tmp_path):
    """`agent run` warns where the user typed it, before it looks for the resident agents."""
    done = _agent(
        tmp_path, "run", "--serve", str(tmp_path / "none.json"), "train.py", "--grace", "1"
    )
    warning, *rest = done.stderr.splitlines()
    assert warning.startswith("agent: warning: --grace after the script goes to train.py; ")
    assert done.returncode != 0 and rest and "warning" not in "".join(rest), done.stderr


def test_version_comes_from_the_package_metadata(tmp_path):
    done = _agent(tmp_path, "--version")
    expected = f"launch-agent {importlib.metadata.version('launch-agent')}\n"
    assert (done.returncode, done.stdout, done.stderr) == (0, expected, "")


def test_no_arguments_prints_the_usage_and_exits_2(tmp_path):
    """As argparse answers a missing argument (exit 2), but with the ways to call the agent,
    every command named, and nothing of argparse's internals (`rest`)."""
    done = _agent(tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    lines = done.stderr.splitlines()
    assert (
        lines[0]
        == "usage: python -m agent [OPTIONS] SCRIPT [CONFIG.yml ...] [ARGS ...] [-- ARGS ...]"
    )
    assert lines[1] == f"       python -m agent {{{','.join(SUBCOMMANDS)}}} [ARGS ...]"
    assert lines[2:] == ["       python -m agent --help | --version"]


def test_a_missing_script_is_one_line_naming_only_the_script(tmp_path):
    done = _agent(tmp_path, "--nproc-per-node", "2")
    assert done.returncode == 2 and done.stderr == (
        "agent: error: the following arguments are required: script (see python -m agent --help)\n"
    )


@pytest.mark.parametrize("action", ["stacks", "debug", "top"])
def test_no_log_dir_and_no_resident_agents_names_the_newest_job_here(tmp_path, action):
    """`agent stacks` with neither: the one-shot job the user likely meant (the newest under
    ./logs/, the default log dirs), not only a hint about resident agents."""
    logs = tmp_path / "logs"
    for name, file, age in (("4.0", "summary.json", 3600), ("5.0", "control.json", 60)):
        (logs / name).mkdir(parents=True)
        (logs / name / file).write_text("{}")
        os.utime(logs / name / file, (time.time() - age, time.time() - age))
    (logs / "notes").mkdir()  # newer, but no job's
    env = base_env(tmp_path)
    command = [sys.executable, "-m", "agent", action]
    found = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True)
    assert found.returncode == 3, found.stderr
    assert found.stderr.startswith(
        f"agent: error: no LOG_DIR given; the newest job's log dir here is logs/5.0: "
        f"python -m agent {action} logs/5.0 (and no resident agents: "
    ), found.stderr
    (tmp_path / "elsewhere").mkdir()
    none = subprocess.run(
        command, env=env, cwd=tmp_path / "elsewhere", capture_output=True, text=True
    )
    assert none.returncode == 3 and none.stderr.startswith(
        f"agent: error: no LOG_DIR given; name a one-shot job by its log dir: python -m agent "
        f"{action} LOG_DIR (and no resident agents: "
    ), none.stderr
