"""What the clients tell the user when there is nothing live to ask (pure over files on disk)."""

from __future__ import annotations

from agent.errors import ExitCode
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
