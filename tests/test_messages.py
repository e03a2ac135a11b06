"""What the user is told is true (the pure parts): the clients' answers when there is nothing live
to ask, the warning for an --exclude naming no host of the job."""

from __future__ import annotations

import pytest

from agent.errors import ExitCode
from agent.plan.roster import foreign_excludes
from agent.serve.commands import not_live


def test_a_finished_job_points_at_its_stacks_and_summary(tmp_path):
    (tmp_path / "summary.json").write_text("{}")
    error = not_live(str(tmp_path))
    assert error.code == ExitCode.RENDEZVOUS and "\n" not in error.message
    assert (
        error.message == f"the job of {tmp_path} has finished: its summary: {tmp_path}/summary.json"
    )
    for attempt in (1, 0):
        (tmp_path / f"stacks-a{attempt}.txt").write_text("stacks")
    message = not_live(str(tmp_path)).message
    assert message.startswith(f"the job of {tmp_path} has finished: its stacks at the hang: ")
    assert f"{tmp_path}/stacks-a0.txt, {tmp_path}/stacks-a1.txt; its summary: " in message
    assert "serve" not in message and "srun" not in message


def test_a_log_dir_without_a_job_says_so(tmp_path):
    error = not_live(str(tmp_path))
    assert error.code == ExitCode.RENDEZVOUS and "no control.json" in error.message
    assert "has not started yet" in error.message and "serve" not in error.message
    missing = not_live(str(tmp_path / "nope"))
    assert missing.code == ExitCode.USAGE and "is not a directory" in missing.message


HOSTS = ["gpu1", "gpu2", "gpu3", "gpu2"]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, None),
        ("gpu2", None),
        ("gpu[1-3]", None),
        (
            "nosuch[1-3]",
            "--exclude 'nosuch[1-3]' names no host of this job (its hosts: gpu[1-3]); excluding none",
        ),
        (
            "gpu1,gpu9",
            "--exclude 'gpu1,gpu9': gpu9 not among this job's hosts (gpu[1-3]); excluding only "
            "the others",
        ),
    ],
)
def test_an_exclude_naming_hosts_not_in_the_job_is_a_warning(given, expected):
    assert foreign_excludes(given, HOSTS) == expected
    assert foreign_excludes(given, []) is None  # hosts unknown: nothing to say
