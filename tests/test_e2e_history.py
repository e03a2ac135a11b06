"""Real jobs on loopback land in the user's history: node 0 appends each one as it ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cluster import FIXTURE, REPO

pytestmark = pytest.mark.e2e  # every test here starts agents


def history(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agent", "history", *argv],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip


def test_three_jobs_then_history(cluster_factory, tmp_path):
    state = tmp_path / "shared-state"
    env = {"AGENT_STATE_DIR": str(state)}
    jobs = [
        (["--nproc-per-node", "2", FIXTURE], [0]),
        (["--nproc-per-node", "2", FIXTURE, "--on", "1", "--exit", "7", "--stderr", "bad"], [1]),
        (
            ["--nproc-per-node", "2", "--max-restarts", "1", FIXTURE, "--on", "1", "--exit", "9",
             "--fail-attempts", "1"],
            [0],
        ),
    ]  # fmt: skip
    clusters = []
    for args, codes in jobs:
        cluster = cluster_factory(1).start(args, env=env)
        assert cluster.wait(120) == codes, cluster.dump()
        clusters.append(cluster)
    # TMPDIR: the fallback database `history` also reads is this test's, not the machine's
    user = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "AGENT_STATE_DIR": str(state),
        "TMPDIR": str(tmp_path / "tmp"),
    }
    listed = history(user, "--json")
    assert listed.returncode == 0, listed.stderr
    by_job = {j["job_id"]: j for j in json.loads(listed.stdout)}
    ok, failed, restarted = (by_job[c.job] for c in clusters)
    assert (ok["exit_code"], failed["exit_code"], restarted["exit_code"]) == (0, 1, 0)
    assert failed["cause"] == "rank 1 on 127.0.0.1 (node 0) exit code 7"
    assert ok["cause"] is None and ok["ranks"] == 2 and ok["restarts"] == 0
    assert restarted["restarts"] == 1
    (one,) = json.loads(history(user, f"{clusters[2].job}.0", "--json").stdout)
    assert [a["attempt"] for a in one["attempts"]] == [0, 1]
    assert "exit code 9" in one["attempts"][0]["cause"] and one["attempts"][1]["cause"] is None
    assert ok["log_dir"] == str(clusters[0].log_dir) and FIXTURE in ok["command"]
    table = history(user)
    assert table.returncode == 0 and f"{clusters[1].job}.0" in table.stdout
    assert "exit code 7" in table.stdout
    shown = history(user, f"{clusters[2].job}.0")
    assert "attempts of" in shown.stdout and "exit code 9" in shown.stdout, shown.stdout


def test_unwritable_history_warns_once_and_the_job_is_unaffected(cluster_factory, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {"AGENT_STATE_DIR": str(blocker / "state"), "TMPDIR": str(tmp_path / "tmp")}
    cluster = cluster_factory(1).start(["--nproc-per-node", "1", FIXTURE], env=env)
    assert cluster.wait(120) == [0], cluster.dump()
    assert cluster.summary()["status"] == "succeeded"
    warnings = [line for line in cluster.agents[0].stderr().splitlines() if "history:" in line]
    fallback = tmp_path / "tmp" / f"launch-agent-{os.getuid()}" / "history.sqlite"
    assert len(warnings) == 1 and str(fallback) in warnings[0], warnings
    user = {**os.environ, "PYTHONPATH": str(REPO), **env}
    listed = json.loads(history(user, "--json").stdout)
    assert [j["job_id"] for j in listed] == [cluster.job]


def test_resident_runs_are_recorded_one_by_one(tmp_path):
    from serving import Serving

    serving = Serving(tmp_path, 1).start()
    try:
        serving.ready()
        assert serving.call("run", FIXTURE).returncode == 0
        failed = serving.call("run", FIXTURE, "--exit", "5")
        assert failed.returncode == 1, failed.stderr
        # TMPDIR: the fallback database `history` also reads is this test's, not the machine's
        listed = serving.call("history", "--json", env={"TMPDIR": str(tmp_path / "tmp")})
        assert listed.returncode == 0, listed.stderr
        runs = [(j["job"], j["exit_code"], j["cause"]) for j in json.loads(listed.stdout)]
        assert runs == [  # JOB.STEP.rN: run N of the resident agents serving in step 0
            (f"{serving.job}.0.r0", 0, None),
            (f"{serving.job}.0.r1", 1, "rank 0 on 127.0.0.1 (node 0) exit code 5"),
        ]
        assert serving.call("down").returncode == 0
        assert serving.wait(30) == [0], serving.dump()
    finally:
        serving.kill()
