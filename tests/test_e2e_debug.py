"""Debugging a live job (2 simulated nodes × 1 rank on loopback): breakpoint() pauses a rank,
the console names it, `agent debug` lists it, opens a pdb session with it in a pseudo-terminal,
runs one command on every paused rank; a paused rank is no hang; --pdb pauses at the exception."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from cluster import REPO, base_env, job_processes, wait_for
from serving import Serving
from terminal import Terminal, print_x_and_continue

pytestmark = pytest.mark.e2e

JOB = str(REPO / "tests" / "fixtures" / "pause_job.py")
SOURCE = (REPO / "tests" / "fixtures" / "pause_job.py").read_text().splitlines()
PAUSE_LINE = next(n for n, line in enumerate(SOURCE, 1) if line.startswith("    print("))
RAISE_LINE = next(n for n, line in enumerate(SOURCE, 1) if line.strip().startswith("raise "))


def _debug(cluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agent", "debug", str(cluster.log_dir), *args],
        env=base_env(cluster.tmp), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _console(cluster) -> str:
    return "".join(a.stdout() + a.stderr() for a in cluster.agents)


def _paused(cluster, rank: int, reason: str = "breakpoint") -> str:
    line = f"rank {rank} paused at pause_job.py:"
    found = wait_for(
        lambda: next((x for x in _console(cluster).splitlines() if x.startswith(line)), None),
        90,
        f"the console to say rank {rank} paused",
        interval=0.1,
    )
    assert f"({reason}" in found, found
    return found


def test_breakpoint_pauses_a_rank_for_a_pdb_session_in_the_terminal(cluster_factory):
    cluster = cluster_factory(2).start([JOB])
    line = _paused(cluster, 1)
    assert line == (
        f"rank 1 paused at pause_job.py:{PAUSE_LINE} in <module> (breakpoint): "
        f"python -m agent debug {cluster.log_dir} --rank 1"
    ), line
    listed = _debug(cluster, "--list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout == f"rank 1 (127.0.0.2): {JOB}:{PAUSE_LINE} in <module> (breakpoint)\n"
    other = _debug(cluster, "--rank", "0", "-c", "p x")
    assert other.returncode == 2 and other.stderr.endswith("rank 0 is not paused; paused now: 1\n")
    stacks = subprocess.run(
        [sys.executable, "-m", "agent", "stacks", str(cluster.log_dir)],
        env=base_env(cluster.tmp), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert stacks.stdout.startswith("paused in pdb (python -m agent debug):\n" + listed.stdout)

    detached = Terminal.debug(cluster, "--rank", "1")
    detached.expect("(Pdb) ")
    detached.type("p x\x1d")  # Ctrl-] mid-line: detached, nothing sent, the rank stays paused
    detached.expect("stays paused")
    assert detached.close() == 0

    terminal = Terminal.debug(cluster, "--rank", "1")  # again: where it stopped, as the first time
    shown = terminal.expect("(Pdb) ").splitlines()
    assert shown[-3:] == [
        f"> {JOB}({PAUSE_LINE})<module>()",
        '-> print("after", x, flush=True)',
        "(Pdb) ",
    ], shown
    terminal.type("p x\n")
    assert "42" in terminal.expect("(Pdb) ").splitlines()[-2]
    terminal.type("c\n")
    terminal.expect("rank 1 left pdb")
    assert terminal.close() == 0
    assert cluster.wait(60) == [0, 0], cluster.dump()
    assert "after 42" in cluster.rank_file(1).read_text()
    assert not job_processes(cluster.marker)
    sockets = [n for n in os.listdir(_private_dir()) if n.startswith("debug-")]
    for agent in cluster.agents:  # each agent's socket went with the attempt
        assert not [n for n in sockets if n.startswith(f"debug-{agent.proc.pid}-")], sockets


def test_one_command_on_every_paused_rank_and_one_client_per_rank(cluster_factory):
    cluster = cluster_factory(2).start([JOB], env={"PAUSE_RANKS": "0,1"})
    _paused(cluster, 0)
    _paused(cluster, 1)
    every = _debug(cluster, "--all", "-c", "p x")
    assert every.returncode == 0, every.stderr
    assert every.stdout == "----------------\nranks 0-1\n----------------\n42\n", every.stdout

    first = Terminal.debug(cluster, "--rank", "0")
    first.expect("(Pdb) ")
    second = _debug(cluster, "--rank", "0")
    assert second.returncode == 2, second.stdout
    assert "rank 0 is being debugged by " in second.stderr and "(pid " in second.stderr
    assert len(second.stderr.splitlines()) == 1, second.stderr
    first.type("\x04")  # Ctrl-D: detached, the rank stays paused
    first.expect("stays paused")
    assert first.close() == 0
    assert cluster.agents[0].proc.poll() is None

    went_on = _debug(cluster, "--all", "-c", "c")
    assert went_on.returncode == 0, went_on.stderr
    assert "ranks 0-1" in went_on.stdout, went_on.stdout
    assert cluster.wait(60) == [0, 0], cluster.dump()
    assert "after 42" in cluster.rank_file(0).read_text()


def test_q_says_the_rank_ends_in_bdbquit_and_it_does(cluster_factory):
    cluster = cluster_factory(2).start([JOB])
    _paused(cluster, 1)
    quit_ = _debug(cluster, "--rank", "1", "-c", "q")
    assert quit_.returncode == 0, quit_.stderr
    assert quit_.stdout.splitlines()[3:] == [
        "[agent] q: the rank raises BdbQuit where it stopped, as under local pdb: uncaught, it "
        "ends the rank",
        "(the rank left pdb)",
    ], quit_.stdout
    assert cluster.wait(60) == [1, 1], cluster.dump()
    cause = cluster.summary()["root_cause"]
    assert cause["rank"] == 1 and "BdbQuit" in str(cause), cause


@pytest.mark.solo
def test_a_paused_rank_is_not_a_hang(cluster_factory):
    # rank 0 waits silently for rank 1, paused: both quiet far beyond --hang-timeout
    cluster = cluster_factory(2).start(["--hang-timeout", "3", "--hang-warning", "2", JOB])
    _paused(cluster, 1)
    until = time.monotonic() + 10
    while time.monotonic() < until:  # observing the job, not waiting for an event
        assert [a.proc.poll() for a in cluster.agents] == [None, None], cluster.dump()
        time.sleep(0.2)
    went_on = _debug(cluster, "--rank", "1", "-c", "c")
    assert went_on.returncode == 0, went_on.stderr
    assert cluster.wait(60) == [0, 0], cluster.dump()
    console = _console(cluster)
    assert "hang:" not in console and "no progress for" not in console, console
    # --hang-warning: the silent rank 0 is named, the paused rank 1 is not
    assert "rank 0 has printed nothing" in console and "rank 1 has printed" not in console


def test_pdb_pauses_at_the_exception_then_the_job_fails_with_it(cluster_factory):
    cluster = cluster_factory(2).start(["--pdb", JOB, "--raise"])
    line = _paused(cluster, 1, "exception: ValueError: bad batch 7")
    assert f"pause_job.py:{RAISE_LINE} in step" in line, line
    local = _debug(cluster, "--rank", "1", "-c", "p batch")
    assert local.returncode == 0, local.stderr
    assert local.stdout.splitlines()[3] == "7", local.stdout
    assert [a.proc.poll() for a in cluster.agents] == [None, None], "the job is held"
    terminal = Terminal.debug(cluster, "--rank", "1")
    terminal.expect("(Pdb) ")
    terminal.type("q\n")
    said = terminal.expect("rank 1 left pdb")
    assert "the rank goes on to fail with its exception (ValueError: bad batch 7)" in said, said
    assert terminal.close() == 0
    assert cluster.wait(60) == [1, 1], cluster.dump()
    cause = cluster.summary()["root_cause"]
    assert cause["rank"] == 1 and "ValueError: bad batch 7" in str(cause), cause


def _private_dir() -> str:
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"launch-agent-stacks-{os.getuid()}")


def test_resident_agents_warm_ranks_pause_and_post_mortem(tmp_path):
    """`agent run` on resident agents (warm ranks, light zygote): the run's client names the
    pause, `agent debug` finds the job from the allocation, the session continues the rank;
    then --pdb on the same agents (ranks forked ahead of that run) pauses at the exception and
    `q` fails the run with it."""
    serving = Serving(tmp_path, 2, ("--preload", "json"))
    try:
        serving.start().ready()
        run = serving.client("run", JOB)
        wait_for(lambda: _rank_one_paused(serving), 90, "rank 1 to pause", interval=0.1)
        listed = serving.call("debug", timeout=60)
        assert listed.returncode == 0, listed.stderr
        assert f"rank 1 (127.0.0.2): {JOB}:{PAUSE_LINE} in <module> (breakpoint)" in listed.stdout
        terminal = Terminal(["debug", "--rank", "1"], serving.shell_env())
        print_x_and_continue(terminal)
        out, err = run.communicate(timeout=60)
        assert run.returncode == 0, err.decode() + serving.dump()
        shown = (out + err).decode()
        assert f"rank 1 paused at pause_job.py:{PAUSE_LINE} in <module> (breakpoint): " in shown
        assert "127.0.0.2:1: after 42" in shown, shown

        failing = serving.client("run", "--pdb", JOB, "--raise")
        wait_for(lambda: _rank_one_paused(serving), 90, "rank 1 to pause at its exception")
        local = serving.call("debug", "--rank", "1", "-c", "p batch", timeout=60)
        assert local.stdout.splitlines()[3] == "7", local.stdout + local.stderr
        quit = serving.call("debug", "--rank", "1", "-c", "q", timeout=60)
        assert quit.returncode == 0, quit.stderr
        out, err = failing.communicate(timeout=60)
        assert failing.returncode == 1, err.decode()
        failed = (out + err).decode()
        assert "ValueError: bad batch 7" in failed
        # the second run's ranks were forked ahead, between the runs: --pdb is theirs too
        assert "1 of 1 ranks forked warm (1 forked ahead of the run)" in failed, failed
        # every node forked its rank warm in both runs (node 0 says so to the run's client,
        # node 1 on its own stderr): one line per node and run, wherever it went
        said = shown + failed + serving.dump()
        warm = r"\[agent (\S+) (r\d+)\.a0\] attempt 0: 1 of 1 ranks forked warm"
        assert len(set(re.findall(warm, said))) == 4, said
        # node 1 forked its rank of the second run ahead too: it heard node 0's client had the end
        ahead = r"\[agent (\S+) r1\.a0\] attempt 0: 1 of 1 ranks forked warm \(1 forked ahead"
        assert len(set(re.findall(ahead, said))) == 2, said
    finally:
        serving.kill()


def _rank_one_paused(serving: Serving) -> bool:
    result = serving.call("debug", timeout=60)
    return result.returncode == 0 and "rank 1 (" in result.stdout


def test_run_attach_opens_the_first_paused_rank_in_the_runs_terminal(tmp_path):
    serving = Serving(tmp_path, 2, ("--preload", "json"))
    try:
        serving.start().ready()
        terminal = Terminal(["run", "--attach", JOB], serving.shell_env(), tmp_path)
        shown = terminal.expect("(Pdb) ", timeout=90)
        assert f"rank 1 paused at pause_job.py:{PAUSE_LINE} in <module> (breakpoint)" in shown
        assert "rank 1 on 127.0.0.2, paused at" in shown
        terminal.type("p x\n")
        assert "42" in terminal.expect("(Pdb) ").splitlines()[-2]
        terminal.type("c\n")
        terminal.expect("rank 1 left pdb")
        terminal.expect("127.0.0.2:1: after 42")
        assert terminal.close() == 0
    finally:
        serving.kill()
