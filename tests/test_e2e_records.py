"""A job's record on loopback agents: a log dir holds one job."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cluster import FIXTURE, REPO, base_env
from serving import Serving

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
