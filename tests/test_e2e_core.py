"""End to end: real agents, real ranks, real TCPStore and gloo on loopback."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from cluster import CHECK_ARGS, FIXTURE, REPO, base_env, job_processes, slurm_env

pytestmark = pytest.mark.e2e

CONFIGS = [str(REPO / "configs" / "data.yml"), str(REPO / "configs" / "model.yml")]


def _check_reports(cluster, world: int) -> list[dict]:
    reports = []
    for rank in range(world):
        text = cluster.rank_file(rank).read_text()
        match = re.search(r"check_args: OK (\{.*\})", text)
        assert match, (
            f"rank {rank} printed no OK line:\n{text}\n{cluster.rank_file(rank, 'err').read_text()}"
        )
        reports.append(json.loads(match.group(1)))
    return reports


def test_four_nodes_two_ranks_run_check_args(cluster_factory):
    cluster = cluster_factory(4).start(["--nproc-per-node", "2", CHECK_ARGS, *CONFIGS])
    assert cluster.wait(240) == [0, 0, 0, 0], cluster.dump()
    reports = _check_reports(cluster, 8)
    assert sorted(r["rank"] for r in reports) == list(range(8))
    for r in reports:
        assert r["world_size"] == 8 and r["local_world_size"] == 2
        assert r["local_rank"] == r["rank"] % 2
        assert r["group_rank"] == r["node_rank"] == r["rank"] // 2
        assert r["master_addr"] == "127.0.0.1"
        assert r["all_reduce"] == sum(range(8))
    summary = cluster.summary()
    assert summary["status"] == "succeeded" and summary["exit_code"] == 0
    hosts = {e["rank"]: e["host"] for e in summary["attempts"][0]["ranks"]}
    assert hosts == {r: f"127.0.0.{r // 2 + 1}" for r in range(8)}


def test_srun_only_mode_ranks_are_procids(cluster_factory, tmp_path):
    """8 srun tasks (2 per node on 4 nodes), one agent each: RANK = SLURM_PROCID."""
    cluster = cluster_factory(4)
    cluster.nnodes = 8  # 8 agents

    def per_task(task: int) -> dict[str, str]:
        env = slurm_env(cluster.job, 4, task // 2, cluster.step)
        env.update(
            {
                "SLURM_PROCID": str(task),
                "SLURM_LOCALID": str(task % 2),
                "SLURM_NTASKS": "8",
                "SLURM_STEP_TASKS_PER_NODE": "2(x4)",
            }
        )
        return env

    cluster.start(
        ["--world", "slurm-task", FIXTURE, "--env-out", str(tmp_path)], per_node_env=per_task
    )
    assert cluster.wait(240) == [0] * 8, cluster.dump()
    for task in range(8):
        env = json.loads((tmp_path / f"env-{task}.json").read_text())["env"]
        assert env["RANK"] == env["SLURM_PROCID"] == str(task)
        assert env["LOCAL_RANK"] == str(task % 2) and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["WORLD_SIZE"] == "8" and env["GROUP_RANK"] == str(task // 2)


def test_only_node_zero_reads_configs(cluster_factory, tmp_path):
    missing = [str(tmp_path / "nowhere" / "data.yml"), str(tmp_path / "nowhere" / "model.yml")]
    cluster = cluster_factory(2)
    cluster.start(["--nproc-per-node", "1", FIXTURE, *CONFIGS], nodes=[0])
    cluster.start(["--nproc-per-node", "1", FIXTURE, *missing], nodes=[1])
    assert cluster.wait(120) == [0, 0], cluster.dump()
    copies = sorted(cluster.log_dir.glob("resolved-config.agent-*.json"))
    assert len(copies) == 2
    assert copies[0].read_bytes() == copies[1].read_bytes()
    config = json.loads(copies[0].read_bytes())
    assert config["world_size"] == 2 and "launcher" not in config


def test_rank_files_hold_exact_bytes_and_console_is_prefixed(cluster_factory, tmp_path):
    writer = tmp_path / "writer.py"
    writer.write_text(
        "import os, sys\n"
        "r = os.environ['RANK']\n"
        "sys.stdout.buffer.write(b'line one ' + r.encode() + b'\\nno newline at end \\xff' + b'x' * 100000)\n"
        "sys.stderr.buffer.write(b'err ' + r.encode() + b'\\n')\n"
    )
    cluster = cluster_factory(2).start(["--nproc-per-node", "2", str(writer)])
    assert cluster.wait(120) == [0, 0], cluster.dump()
    for rank in range(4):
        expected = f"line one {rank}\nno newline at end ".encode() + b"\xff" + b"x" * 100000
        assert cluster.rank_file(rank).read_bytes() == expected
        assert cluster.rank_file(rank, "err").read_bytes() == f"err {rank}\n".encode()
    for agent in cluster.agents:
        host = f"127.0.0.{agent.node + 1}"
        for line in agent.stdout().splitlines():
            assert re.match(rf"{re.escape(host)}:\d+: ", line), (
                f"unprefixed console line: {line[:80]!r}"
            )
        assert f"{host}:{agent.node * 2}: line one {agent.node * 2}" in agent.stdout()
        assert f"{host}:{agent.node * 2 + 1}: err {agent.node * 2 + 1}" in agent.stderr()


FORKED_WRITERS = """
import os, sys
start_r, start_w = os.pipe()  # closing the write end starts both writers at once
children = []
for writer in range(4):
    pid = os.fork()
    if pid == 0:
        os.close(start_w)
        os.read(start_r, 1)
        for i in range(150):  # 3,000 bytes: one write(2) at exit, below PIPE_BUF
            print(f"writer {writer} line {i:03d}")
        sys.stdout.flush()
        os._exit(0)
    children.append(pid)
os.close(start_w)
for pid in children:
    os.waitpid(pid, 0)
"""


def test_forked_writers_keep_their_lines_whole(cluster_factory, tmp_path, monkeypatch):
    """A rank's forked children (DataLoader workers) print into the rank's pipe together. With
    PYTHONUNBUFFERED exported empty (the documented opt-out of the agent's default `1`) the agent
    leaves Python's buffering alone, so each flush is whole lines, in the file and on the
    console."""
    monkeypatch.setenv("PYTHONUNBUFFERED", "")
    script = tmp_path / "forked_writers.py"
    script.write_text(FORKED_WRITERS)
    cluster = cluster_factory(1).start(["--nproc-per-node", "1", str(script)])
    assert cluster.wait(60) == [0], cluster.dump()
    whole = re.compile(r"writer [0-3] line \d{3}")
    lines = cluster.rank_file(0).read_text().splitlines()
    assert sorted(lines) == sorted(f"writer {w} line {i:03d}" for w in range(4) for i in range(150))
    shown = [line for line in cluster.agents[0].stdout().splitlines() if "writer" in line]
    assert len(shown) == 600, shown[:5]
    assert all(whole.fullmatch(line.split(": ", 1)[1]) for line in shown), shown[:5]


def test_console_rank_filter_keeps_files_complete(cluster_factory):
    cluster = cluster_factory(1).start(
        ["--nproc-per-node", "2", "--console-ranks", "1", FIXTURE, "--stdout", "hi"]
    )
    assert cluster.wait(60) == [0], cluster.dump()
    out = cluster.agents[0].stdout()
    assert "127.0.0.1:1: hi" in out and "127.0.0.1:0:" not in out
    assert cluster.rank_file(0).read_text() == "hi\n"


def test_failing_rank_is_named_in_summary(cluster_factory):
    cluster = cluster_factory(2).start(
        [
            "--nproc-per-node",
            "2",
            FIXTURE,
            "--exit",
            "3",
            "--on",
            "2",
            "--stderr",
            "about to fail",
            "--others-wait",
        ]
    )
    codes = cluster.wait(120)
    assert all(code != 0 for code in codes), cluster.dump()
    cause = cluster.summary()["root_cause"]
    assert (cause["rank"], cause["host"], cause["returncode"]) == (2, "127.0.0.2", 3)
    assert cause["stderr_tail"][-1] == "about to fail"


def test_dry_run_starts_nothing_and_lists_every_rank(tmp_path):
    env = base_env(tmp_path)
    env.update(slurm_env("4242", 4, 0))
    marker_before = len(job_processes("4242.0"))
    proc = subprocess.run(
        [sys.executable, "-m", "agent", "--dry-run", "--nproc-per-node", "2", FIXTURE, *CONFIGS],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    ranks = re.findall(r"^rank (\d+)  node (\d+) \((\S+)\)", proc.stdout, re.M)
    assert [(int(r), int(n), h) for r, n, h in ranks] == [
        (r, r // 2, f"127.0.0.{r // 2 + 1}") for r in range(8)
    ]
    assert "RANK=5" in proc.stdout and "WORLD_SIZE=8" in proc.stdout
    assert len(job_processes("4242.0")) == marker_before == 0
    assert not (tmp_path / "logs").exists()


def test_help_does_not_import_torch():
    code = (
        "import sys, runpy\n"
        "sys.argv = ['agent', '--help']\n"
        "try:\n    runpy.run_module('agent', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print('TORCH' if 'torch' in sys.modules else 'CLEAN', file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert "usage: python -m agent" in proc.stdout
    assert proc.stderr.strip().endswith("CLEAN")


def test_two_steps_of_one_job_run_side_by_side(cluster_factory, tmp_path):
    first = cluster_factory(2, step="0")
    second = cluster_factory(2, job=first.job, step="1")
    flag = tmp_path / "both-running"
    for cluster in (first, second):
        cluster.start(["--nproc-per-node", "1", FIXTURE, "--until-file", str(flag)])
    from cluster import wait_for

    wait_for(
        lambda: len(job_processes(first.marker)) >= 2 and len(job_processes(second.marker)) >= 2,
        90,
        "ranks of both steps to run",
    )
    flag.touch()
    assert first.wait(60) == [0, 0], first.dump()
    assert second.wait(60) == [0, 0], second.dump()
    assert first.summary()["status"] == second.summary()["status"] == "succeeded"


def test_contradictory_scheduler_env_is_one_line_exit_2(tmp_path):
    cases = {
        "SLURM_NODEID": {"SLURM_NODEID": "5"},
        "SLURM_STEP_NODELIST": {"SLURM_STEP_NODELIST": ""},
        "SLURM_STEP_TASKS_PER_NODE": {"SLURM_STEP_TASKS_PER_NODE": "2(x4)", "SLURM_NTASKS": "8"},
    }
    for variable, change in cases.items():
        env = base_env(tmp_path)
        env.update(slurm_env("77", 4, 1))
        env.update(change)
        proc = subprocess.run(
            [sys.executable, "-m", "agent", FIXTURE],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert proc.returncode == 2, (variable, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and variable in lines[0] and "Traceback" not in proc.stderr, (
            variable,
            proc.stderr,
        )
        assert not (tmp_path / "logs").exists()
