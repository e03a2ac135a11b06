"""Every shape of job: node 0's job services (stacks, debug, the hang and straggler judges, the
exit-skew warning, metrics) last from the lineup to the verdict, whatever node 0's own ranks do.

One torch-free fixture (tests/fixtures/shapes_job.py) whose ranks finish, spin, pause or step as
each row says, on loopback nodes; one-shot and resident, fresh and warm ranks, a spare seated
after a loss. Every row ends node 0's ranks (or a middle node's) before it asks for a service:
the shapes a fixture with symmetric ranks never drove.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from cluster import REPO, base_env, slurm_env, wait_for
from prometheus_client.parser import text_string_to_metric_families
from serving import Serving
from terminal import Terminal, print_x_and_continue

from agent.plan.rank_set import parse_rank_set

pytestmark = pytest.mark.e2e

SHAPES = str(REPO / "tests" / "fixtures" / "shapes_job.py")
HANG = 4.0
# A hang is an infrastructure failure (agent.run.failure_class): these tests judge one hang.
ONE_HANG = ("--max-infra-restarts", "0")


def _roles(roles: str, world: int) -> list[str]:
    named = roles.split(",")
    return [named[min(r, len(named) - 1)].split(":")[0] for r in range(world)]


def _said(log_dir: Path, rank: int, text: str, attempt: int = 0) -> bool:
    suffix = f".r{attempt}" if attempt else ""
    path = log_dir / f"rank-{rank:05d}{suffix}.out"
    return path.exists() and text in path.read_text(errors="replace")


def _gone(log_dir: Path, rank: int, attempt: int = 0) -> bool:
    """The rank printed its pid and that process is gone (reaped by its agent)."""
    suffix = f".r{attempt}" if attempt else ""
    path = log_dir / f"rank-{rank:05d}{suffix}.out"
    found = re.search(r"pid (\d+)", path.read_text(errors="replace")) if path.exists() else None
    return found is not None and not psutil.pid_exists(int(found.group(1)))


def _settled(log_dir: Path, roles: list[str], attempt: int = 0) -> bool:
    """Every `done` rank gone, every `spin` rank in its loop."""
    return all(
        _gone(log_dir, r, attempt) if role == "done" else _said(log_dir, r, "spinning", attempt)
        for r, role in enumerate(roles)
        if role in ("done", "spin")
    )


def _agent(log_dir: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agent", *args[:1], str(log_dir), *args[1:]],
        env=env or base_env(log_dir.parent), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _groups(stacks: str) -> set[int]:
    """Every rank a group of `agent stacks` names (`---- ranks 2-3 (2 ranks on ...) ----`):
    which groups they form depends on the line each was sampled at, the ranks do not."""
    found: set[int] = set()
    for ranks in re.findall(r"^---- ranks? (\S+) \(", stacks, re.M):
        found |= set(parse_rank_set(ranks, "ranks") or ())
    return found


def _ranks(text: str) -> set[int]:
    """`ranks 0,2` / `rank 2` → {0, 2}."""
    return set(parse_rank_set(text.split()[1], "ranks") or ())


def _hang_checked(how: str, running: str, count: int, exited: str) -> None:
    """The root cause names the ranks still running, in stuck (at whichever line each was
    sampled), and the ranks that had exited."""
    noun = "rank" if count == 1 else "ranks"
    assert how.startswith(
        f"hang: no progress for {HANG:g} s from the {count} {noun} still running; "
    ), how
    stuck = re.findall(r"(ranks? \S+) in stuck \(shapes_job\.py:\d+\)", how)
    assert set().union(*map(_ranks, stuck)) == _ranks(running), how
    assert re.search(rf"; {exited} exited 0 at \d\d:\d\d:\d\d$", how), how


HANGS = [
    # nodes, ranks per node, roles by rank, the group still running, the ranks that exited
    pytest.param(2, 2, "done,done,spin,spin", "ranks 2-3", "ranks 0-1", id="node-0-done"),
    pytest.param(3, 1, "spin,done,spin", "ranks 0,2", "rank 1", id="middle-node-done"),
    pytest.param(3, 1, "done,done,spin", "rank 2", "ranks 0-1", id="all-but-one-done"),
]


@pytest.mark.solo
@pytest.mark.parametrize(("nodes", "nproc", "roles", "running", "exited"), HANGS)
def test_stacks_then_a_hang_from_the_ranks_still_running(
    cluster_factory, nodes, nproc, roles, running, exited
):
    cluster = cluster_factory(nodes).start(
        ["--nproc-per-node", str(nproc), "--hang-timeout", f"{HANG:g}", *ONE_HANG, SHAPES],
        env={"ROLES": roles},
    )
    named = _roles(roles, nodes * nproc)
    wait_for(lambda: _settled(cluster.log_dir, named), 90, "ranks done and spinning", 0.1)
    stacks = _agent(cluster.log_dir, "stacks")
    assert stacks.returncode == 0, stacks.stderr + cluster.dump()
    assert _groups(stacks.stdout) == _ranks(running), stacks.stdout  # the exited have no stack
    assert "in stuck" in stacks.stdout, stacks.stdout

    (cluster.log_dir / "quiet").touch()  # the spinning ranks fall silent
    assert cluster.wait(60) == [1] * nodes, cluster.dump()
    spinning = named.count("spin")
    _hang_checked(cluster.summary()["root_cause"]["how"], running, spinning, exited)
    assert _groups((cluster.log_dir / "stacks-a0.txt").read_text()) == _ranks(running)


@pytest.mark.solo
def test_a_resident_run_on_warm_ranks_hangs_after_node_0s_ranks_exited(tmp_path):
    serving = Serving(tmp_path, 2).start().ready()
    try:
        client = serving.client(
            "run", "--nproc-per-node", "2", "--hang-timeout", f"{HANG:g}", *ONE_HANG, SHAPES,
            env={"ROLES": "done,done,spin,spin"},
        )  # fmt: skip
        said = b""
        while b"logs in " not in said:  # the client's first lines name the run's log dir
            line = client.stderr.readline()
            assert line, said.decode() + serving.dump()
            said += line
        log_dir = Path(said.decode().split("logs in ", 1)[1].split()[0])
        named = _roles("done,done,spin,spin", 4)
        wait_for(lambda: _settled(log_dir, named), 90, "ranks done and spinning", 0.1)
        stacks = _agent(log_dir, "stacks", env=serving.shell_env())
        assert stacks.returncode == 0, stacks.stderr + serving.dump()
        assert _groups(stacks.stdout) == {2, 3}, stacks.stdout
        (log_dir / "quiet").touch()
        _, err = client.communicate(timeout=60)
        assert client.returncode == 1, err.decode() + serving.dump()
        assert "2 of 2 ranks forked warm" in serving.dump()
        how = json.loads((log_dir / "summary.json").read_text())["root_cause"]["how"]
        _hang_checked(how, "ranks 2-3", 2, "ranks 0-1")
        assert serving.alive() == [0, 1]  # the agents stay for the next run
    finally:
        serving.call("down", timeout=60)
        serving.kill()


def test_run_attach_opens_a_rank_that_paused_after_node_0s_ranks_exited(tmp_path):
    serving = Serving(tmp_path, 2).start().ready()
    try:
        env = {**serving.shell_env(), "ROLES": "done,pause:go"}
        terminal = Terminal(["run", "--attach", SHAPES], env, tmp_path)
        terminal.expect("logs in ", timeout=90)
        log_dir = Path(terminal.expect("\n").split()[0])
        wait_for(lambda: _gone(log_dir, 0), 90, "rank 0 to exit", 0.1)
        (log_dir / "go").touch()
        print_x_and_continue(terminal)  # the session opens in the run's own terminal
        assert _said(log_dir, 1, "after 42")
    finally:
        serving.call("down", timeout=60)
        serving.kill()


@pytest.mark.solo
def test_a_spare_seated_after_a_loss_is_judged_like_any_node(cluster_factory):
    args = [
        "--spares",
        "1",
        "--max-infra-restarts",
        "1",
        "--heartbeat-timeout",
        "2",
        "--grace",
        "1",
    ]
    cluster = cluster_factory(3).start(
        [*args, "--hang-timeout", f"{HANG:g}", SHAPES], env={"ROLES": "done,spin"}
    )
    wait_for(lambda: _settled(cluster.log_dir, ["done", "spin"]), 90, "attempt 0 settled", 0.1)
    cluster.agents[1].proc.send_signal(signal.SIGKILL)  # node 1 lost: the spare takes rank 1
    wait_for(lambda: _settled(cluster.log_dir, ["done", "spin"], 1), 90, "attempt 1 settled", 0.1)
    stacks = _agent(cluster.log_dir, "stacks")
    assert "(1 rank on 127.0.0.3)" in stacks.stdout, stacks.stdout + stacks.stderr
    (cluster.log_dir / "quiet").touch()
    codes = cluster.wait(60)
    assert codes[0] == codes[2] == 1, cluster.dump()
    summary = cluster.summary()
    assert len(summary["attempts"]) == 2
    _hang_checked(summary["root_cause"]["how"], "rank 1", 1, "rank 0")


def test_a_breakpoint_after_node_0s_ranks_exited_is_listed_and_continued(cluster_factory):
    cluster = cluster_factory(2).start([SHAPES], env={"ROLES": "done,pause"})
    wait_for(lambda: _gone(cluster.log_dir, 0), 90, "rank 0 to exit", 0.1)
    wait_for(lambda: "rank 1 paused at" in _console(cluster), 90, "rank 1 to pause", 0.1)
    listed = _agent(cluster.log_dir, "debug", "--list")
    assert listed.returncode == 0, listed.stderr + cluster.dump()
    assert listed.stdout.startswith(f"rank 1 (127.0.0.2): {SHAPES}:"), listed.stdout
    print_x_and_continue(Terminal.debug(cluster, "--rank", "1"))
    assert cluster.wait(60) == [0, 0], cluster.dump()
    assert _said(cluster.log_dir, 1, "after 42")


def test_node_0s_live_table_stays_up_and_says_where_the_job_still_runs(cluster_factory):
    """Node 0 on a terminal (its live table), its rank done at once; node 1's rank runs 6 s
    more: the table stays up until the verdict, its last line naming rank 1 and its host,
    then saying that every rank exited (drawn after node 1's rank ended)."""
    cluster = cluster_factory(2).start([SHAPES], nodes=[1], env={"ROLES": "done,late:6"})
    env = {**base_env(cluster.tmp), **slurm_env(cluster.job, 2, 0, cluster.step)}
    env.update({"ROLES": "done,late:6", "COLUMNS": "100", "LINES": "40", "TERM": "xterm"})
    node0 = Terminal(["--log-dir", str(cluster.log_dir), SHAPES], env, cluster.tmp)
    node0.expect("exited 0")  # rank 0's row, the table still drawn
    node0.expect("job: 1 of 2 ranks still running: rank 1 on 127.0.0.2")
    node0.expect("job: all 2 ranks exited")
    assert node0.close() == 0
    assert cluster.wait(60) == [0], cluster.dump()


def test_pdb_reaches_a_rank_that_raised_after_the_others_returned(cluster_factory):
    cluster = cluster_factory(2).start(["--pdb", SHAPES], env={"ROLES": "done,raise"})
    wait_for(lambda: _gone(cluster.log_dir, 0), 90, "rank 0 to exit", 0.1)
    wait_for(lambda: "rank 1 paused at" in _console(cluster), 90, "rank 1 to pause", 0.1)
    asked = _agent(cluster.log_dir, "debug", "--rank", "1", "-c", "p batch")
    assert asked.returncode == 0 and "7" in asked.stdout, asked.stdout + asked.stderr
    went_on = _agent(cluster.log_dir, "debug", "--rank", "1", "-c", "c")
    assert went_on.returncode == 0, went_on.stderr
    assert cluster.wait(60) == [1, 1], cluster.dump()
    assert "ValueError: bad batch 7" in str(cluster.summary()["root_cause"]), cluster.summary()


def _console(cluster) -> str:
    return "".join(a.stdout() + a.stderr() for a in cluster.agents)


def _scrape(url: str) -> dict[str, dict[tuple, float]]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    found: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return found


@pytest.mark.solo
def test_progress_and_a_straggler_outlive_node_0s_ranks(cluster_factory):
    """Node 0 steps every 0.2 s and ends after 2.4 s; node 1 steps every 0.4 s for 8.8 s: its
    progress age stays that of its own lines, its straggler episode lasts until its end."""
    cluster = cluster_factory(2).start(
        ["--progress-regex", r"step (?P<step>\d+)", "--metrics-port", "0", SHAPES],
        env={"ROLES": "steps:12:0.2,steps:22:0.4"},
    )
    url = wait_for(
        lambda: (m := re.search(r"metrics: (http://\S+/metrics)", _console(cluster))) and m[1],
        90,
        "node 0 to name its /metrics URL",
    )
    wait_for(lambda: _said(cluster.log_dir, 0, "step 11"), 90, "node 0's last step", 0.1)
    node0_done = time.time()
    ages, running = [], []
    for _ in range(5):  # 4 s after node 0's ranks ended, while node 1 steps on
        got = _scrape(url)
        ages.append(got["launch_agent_node_seconds_since_progress"][(("node", "1"),)])
        running.append(got["launch_agent_ranks_running"][()])
        time.sleep(1.0)  # the scrapes' spacing, not a synchronisation
    # Node 1 prints every 0.4 s, posts within POST_EVERY, node 0 looks as often: under 1 s.
    assert max(ages) < 1.0, ages
    assert running[-1] == 1, running  # rank 0 exited, rank 1 runs
    assert cluster.wait(60) == [0, 0], cluster.dump()
    (episode,) = cluster.summary()["attempts"][0]["stragglers"]
    assert (episode["node_rank"], episode["rank"]) == (1, None), episode
    assert episode["until"] > node0_done + 4.0, (episode, node0_done)  # it lasted past node 0
    prom = (cluster.log_dir / "metrics.prom").read_text()
    assert 'phase="exit_skew"' in prom and 'phase="teardown"' not in prom, prom


@pytest.mark.solo
def test_exit_skew_is_said_once_naming_the_ranks_still_running(cluster_factory):
    cluster = cluster_factory(2).start(
        ["--hang-warning", "2", SHAPES], env={"ROLES": "done,late:6"}
    )
    assert cluster.wait(90) == [0, 0], cluster.dump()
    lines = [x for x in _console(cluster).splitlines() if "exit skew:" in x]
    assert len(lines) == 1, lines
    assert "rank 0 exited 0" in lines[0] and "rank 1 on 127.0.0.2 still runs" in lines[0]
    assert f"python -m agent stacks {cluster.log_dir}" in lines[0], lines[0]
    attempt = cluster.summary()["attempts"][0]
    assert attempt["exit_skew"].startswith("exit skew: rank 0 exited 0"), attempt
