"""A job's record on loopback agents: a log dir holds one job; one id names a job or run in its
log dir, the history, the client's words and every command that takes one."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from cluster import FIXTURE, REPO, base_env, slurm_env, wait_for
from serving import Serving

from agent.history.liveness import KILLED_WORDS

pytestmark = pytest.mark.e2e  # every test here starts agents


@pytest.fixture(scope="module")
def resident(tmp_path_factory):
    serving = Serving(tmp_path_factory.mktemp("resident"), 1)
    try:
        yield serving.start().ready()
    finally:
        serving.kill()


def agent(tmp_path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agent", *argv],
        capture_output=True, text=True, env=base_env(tmp_path), timeout=60, cwd=REPO,
    )  # fmt: skip


def test_the_same_log_dir_twice_keeps_the_jobs_apart(cluster_factory, tmp_path):
    first = cluster_factory(2).start(["--nproc-per-node", "1", FIXTURE, "--stdout", "first job"])
    assert first.wait(120) == [0, 0], first.dump()
    # The same job id and step: the same log dir, as a requeued job or a reused --log-dir has.
    second = cluster_factory(2, job=first.job).start(
        ["--nproc-per-node", "1", FIXTURE, "--stdout", "second job"]
    )
    assert second.wait(120) == [0, 0], second.dump()
    moved = first.log_dir.with_name(first.log_dir.name + "-2")
    told = second.agents[0].stderr()
    assert (
        f"agent: warning: log dir {first.log_dir} holds another job's files (agent-00000.log, "
        f"agent-00001.log, rank-00000.err, ...): this job's logs go to {moved}\n"
    ) in told, told
    assert "second job" not in second.agents[1].stderr()  # said once, by node 0
    assert (moved / "rank-00001.out").read_text() == "second job\n"
    assert f'"log_dir": "{moved}"' in (moved / "summary.json").read_text()
    shown = agent(tmp_path, "logs", str(first.log_dir))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("first job") == 2 and "second job" not in shown.stdout, shown.stdout


def test_a_resident_run_never_writes_into_an_earlier_runs_log_dir(resident):
    mine = resident.tmp / "mine"
    first = resident.call("run", "--log-dir", "mine", FIXTURE, "--stdout", "run one")
    assert first.returncode == 0, first.stderr + resident.dump()
    second = resident.call("run", "--log-dir", "mine", FIXTURE, "--stdout", "run two")
    assert second.returncode == 0, second.stderr + resident.dump()
    assert (
        f"[agent] log dir {mine} holds another job's files (agent-00000.log, control.json, "
        f"rank-00000.err, ...): this job's logs go to {mine}-2\n"
    ) in second.stderr, second.stderr
    assert (mine / "rank-00000.out").read_text() == "run one\n"
    assert (resident.tmp / "mine-2" / "rank-00000.out").read_text() == "run two\n"


def test_history_the_log_dir_and_the_client_name_a_resident_run_alike(resident):
    done = resident.call("run", FIXTURE, "--stdout", "named")
    assert done.returncode == 0, done.stderr + resident.dump()
    said = re.search(r"^\[agent\] run (\S+): logs in (\S+)$", done.stderr, re.M)
    assert said, done.stderr
    name, log_dir = said.groups()
    assert re.fullmatch(rf"{resident.job}\.0\.r\d+", name), name  # JOB.STEP.rN
    assert log_dir == str(resident.tmp / "logs" / name)
    env = resident.shell_env()
    listed = json.loads(_agent(env, "history", "--json").stdout)
    assert [j["job"] for j in listed if j["log_dir"] == log_dir] == [name]
    for typed in (name, log_dir, f"{resident.job}.0"):  # its id, its log dir, its parent
        shown = _agent(env, "history", typed)
        assert shown.returncode == 0 and f"job {name} (step 0): succeeded" in shown.stdout, (
            typed,
            shown.stdout + shown.stderr,
        )
    # `agent logs ID` from any directory: the history knows where the id's log dir is.
    logs = _agent(env, "logs", name, cwd=REPO)
    assert logs.returncode == 0 and "named" in logs.stdout, logs.stderr


def test_a_one_shot_jobs_default_log_dir_is_named_by_its_id(tmp_path):
    env = base_env(tmp_path)
    env.update(slurm_env("4242", 1, 0, "3"))
    done = subprocess.run(
        [sys.executable, "-m", "agent", FIXTURE, "--stdout", "hi"],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "logs" / "4242.3" / "rank-00000.out").read_text() == "hi\n"
    (record,) = json.loads(_agent(env, "history", "--json").stdout)
    assert record["job"] == "4242.3" and record["log_dir"] == str(tmp_path / "logs" / "4242.3")
    shown = _agent(env, "logs", "4242.3", cwd=tmp_path)
    assert shown.returncode == 0 and "hi" in shown.stdout, shown.stderr


def _agent(env: dict[str, str], *argv: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agent", *argv],
        capture_output=True, text=True, env=env, timeout=60, cwd=cwd or REPO,
    )  # fmt: skip


def test_a_job_killed_with_sigkill_is_reported_killed_by_every_reader(cluster_factory, tmp_path):
    ready = tmp_path / "ready"
    ready.mkdir()
    hung = ["--nproc-per-node", "1", FIXTURE, "--ready-to", str(ready), "--until-file", "/never"]
    cluster = cluster_factory(2).start(hung)
    wait_for(lambda: len(list(ready.iterdir())) == 2, 120, "both ranks to run")
    env, log_dir, name = base_env(tmp_path), str(cluster.log_dir), f"{cluster.job}.0"
    # While it runs, its record says so: summary.json and the history row from the start.
    assert cluster.summary()["status"] == "running"
    shown = _agent(env, "logs", log_dir, "--summary")
    assert shown.returncode == 0 and f"job {name} is running" in shown.stdout, shown.stderr
    (row,) = json.loads(_agent(env, "history", "--json").stdout)
    assert (row["job"], row["status"], row["exit_code"]) == (name, "running", None)

    cluster.kill()  # SIGKILL: every agent, then what is left of the job (srun's second Ctrl-C)
    killed = f"job {name} {KILLED_WORDS}"
    shown = _agent(env, "logs", log_dir, "--summary")
    assert shown.returncode == 0 and shown.stdout.startswith(killed + "\n"), shown.stdout
    tail = _agent(env, "logs", log_dir)
    assert tail.returncode == 0 and f"agent logs: {killed}\n" in tail.stderr, tail.stderr
    follow = _agent(env, "logs", log_dir, "--follow")  # ends by itself, saying why
    assert follow.returncode == 0 and f"agent logs: {killed}; stopping" in follow.stderr
    (row,) = json.loads(_agent(env, "history", "--json").stdout)
    assert (row["job"], row["status"], row["exit_code"]) == (name, "killed", None)
    table = _agent(env, "history").stdout
    assert name in table and KILLED_WORDS in table and "running" not in table, table
    assert f"job {name} (step 0): {KILLED_WORDS}," in _agent(env, "history", name).stdout
    assert name in _agent(env, "history", "--failed").stdout
    for argv in (["stacks", log_dir], ["stacks", name], ["debug", log_dir]):
        asked = _agent(env, *argv)
        assert asked.returncode == 3, (argv, asked.stderr)
        words = f"{killed}: there is nothing to ask; what its ranks wrote: python -m agent logs"
        assert asked.stderr == f"agent: error: {words} {log_dir}\n", (argv, asked.stderr)
    picture = _agent(env, "logs", log_dir, "--timeline", str(tmp_path / "job.svg"))
    assert picture.returncode == 2 and killed in picture.stderr, picture.stderr
