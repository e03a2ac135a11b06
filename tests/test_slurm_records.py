"""Ctrl-C in the documented salloc flow, on the real local Slurm, through a pseudo-terminal as a
user types it: one Ctrl-C with the README's srun line stops the job with its record complete;
srun's two Ctrl-Cs without it kill the agents, and every reader then says the job ended without
a summary — never that it runs, never that resident agents are missing."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import subprocess
import sys
import termios
import time
from pathlib import Path

import docs_pages
import pytest
from cluster import FIXTURE, wait_for
from slurm_local import slurm_env

from agent.history.liveness import KILLED_WORDS

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]


class SallocShell:
    """`salloc -N2` with an interactive bash in a pseudo-terminal that is its controlling
    terminal: a typed Ctrl-C is the terminal's SIGINT to the foreground job (srun)."""

    def __init__(self, tmp: Path) -> None:
        self.env = slurm_env()
        self.env.update(
            {"AGENT_STATE_DIR": str(tmp / "state"), "AGENT_SECRET": "salloc-" + tmp.name,
             "PS1": "$ ", "TERM": "dumb"}
        )  # fmt: skip
        master, child = pty.openpty()

        def controlling_terminal() -> None:  # in the child, after setsid
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen(
            ["salloc", "-N2", "--immediate=60", "bash", "--norc", "--noprofile", "-i"],
            stdin=child, stdout=child, stderr=child, cwd=tmp, env=self.env,
            start_new_session=True, preexec_fn=controlling_terminal,
        )  # fmt: skip
        os.close(child)
        self.master, self.seen = master, b""
        self.job = ""

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def expect(self, pattern: str, timeout: float = 120) -> re.Match:
        deadline = time.monotonic() + timeout
        while (found := re.search(pattern.encode(), self.seen)) is None:
            ready, _, _ = select.select([self.master], [], [], max(0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError(f"no {pattern!r} in:\n{self.text()}")
            try:
                self.seen += os.read(self.master, 65536)
            except OSError:
                raise AssertionError(f"no {pattern!r}; salloc ended:\n{self.text()}") from None
        return found

    def text(self) -> str:
        return self.seen.decode(errors="replace")

    def start(self) -> SallocShell:
        self.type("echo job=$SLURM_JOB_ID.\n")
        self.job = self.expect(r"job=(\d+)\.").group(1).decode()
        return self

    def close(self) -> None:
        if self.proc.poll() is None:
            self.type("exit\n")
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.job:
            subprocess.run(["scancel", self.job], check=False, timeout=30)
        os.close(self.master)


def readme_srun() -> str:
    """The docs' interactive srun line (the README's salloc recipe), up to `python -m agent`."""
    text = docs_pages.text()
    (line,) = re.findall(r"^salloc -N\d.*\n(srun .*?) python -m agent train\.py ", text, re.M)
    return line


def agent(env: dict[str, str], *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agent", *argv],
        capture_output=True, text=True, env=env, timeout=60, cwd=cwd,
    )  # fmt: skip


def hung_job(srun: str, tmp: Path, agent_args: str = "", rank_args: str = "") -> str:
    return (
        f"{srun} {sys.executable} -m agent --nproc-per-node 1 --log-dir {tmp / 'logs'} "
        f"{agent_args} {FIXTURE} --ready-to {tmp / 'ready'} --until-file /never {rank_args}; "
        "echo rc=$?.\n"
    )


def test_one_ctrl_c_with_the_readmes_srun_line_stops_the_job_with_its_record(slurm, tmp_path):
    srun = readme_srun()
    assert "--disable-status" in srun, srun
    (tmp_path / "ready").mkdir()
    shell = SallocShell(tmp_path).start()
    try:
        shell.type(hung_job(srun, tmp_path))
        wait_for(lambda: len(list((tmp_path / "ready").iterdir())) == 2, 120, "both ranks")
        shell.type("\x03")
        rc = shell.expect(r"rc=(\d+)\.", timeout=60).group(1).decode()
        said = shell.text()
        assert rc == "130", said
        for task in (0, 1):  # every agent exited 130
            assert f"task {task}: Exited with exit code 130" in said, said
        summary = json.loads((tmp_path / "logs" / "summary.json").read_text())
        assert (summary["status"], summary["exit_code"]) == ("failed", 130), summary
        assert "received SIGINT" in summary["root_cause"]["how"]
        listed = json.loads(agent(shell.env, "history", "--json", cwd=tmp_path).stdout)
        assert [(j["job"], j["exit_code"]) for j in listed] == [(f"{shell.job}.0", 130)]
    finally:
        shell.close()


def test_srun_killing_the_agents_leaves_a_record_every_reader_calls_killed(slurm, tmp_path):
    (tmp_path / "ready").mkdir()
    shell = SallocShell(tmp_path).start()
    try:
        # Ranks stuck past any signal (a rank in a hung collective): the agents' teardown outlasts
        # srun's wait (KillWait), and srun kills them before node 0 reaches its verdict.
        (tmp_path / "signals").mkdir()
        stuck = f"--signals-to {tmp_path / 'signals'} --ignore-term"
        shell.type(hung_job("srun --ntasks-per-node=1", tmp_path, "--grace 60", stuck))
        wait_for(lambda: len(list((tmp_path / "ready").iterdir())) == 2, 120, "both ranks")
        shell.type("\x03")
        shell.expect(r"srun: interrupt \(one more within 1 sec to abort\)", timeout=30)
        shell.type("\x03")
        rc = shell.expect(r"rc=(\d+)\.", timeout=60).group(1).decode()
        assert rc != "0" and "forcing job termination" in shell.text(), shell.text()
        assert "job failed" not in shell.text()  # node 0 never got to its verdict
        logs, name = str(tmp_path / "logs"), f"{shell.job}.0"
        killed = f"job {name} {KILLED_WORDS}"
        shown = agent(shell.env, "logs", logs, "--summary", cwd=tmp_path)
        assert shown.returncode == 0 and shown.stdout.startswith(killed + "\n"), shown.stdout
        (row,) = json.loads(agent(shell.env, "history", "--json", cwd=tmp_path).stdout)
        assert (row["job"], row["status"]) == (name, "killed"), row
        table = agent(shell.env, "history", cwd=tmp_path).stdout
        assert KILLED_WORDS in table and "running" not in table, table
        stacks = agent(shell.env, "stacks", logs, cwd=tmp_path)
        assert stacks.returncode == 3 and stacks.stderr.startswith(f"agent: error: {killed}: ")
        assert "resident" not in stacks.stderr, stacks.stderr
    finally:
        shell.close()
