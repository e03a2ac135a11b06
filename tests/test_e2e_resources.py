"""Exhausted resources and oversized input: a full log disk, oversized records and plans,
processes that escape their rank — each refused or survived, and reported."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
from cluster import FIXTURE, job_processes, wait_for

pytestmark = pytest.mark.e2e


def _script(tmp_path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_a_plan_over_the_store_limit_is_refused_up_front(cluster_factory, tmp_path):
    big = tmp_path / "big.yml"
    big.write_text("blob: " + "x" * (9 * 1024 * 1024) + "\n")
    cluster = cluster_factory(2).start(["--nproc-per-node", "1", FIXTURE, str(big)])
    start = time.monotonic()
    codes = cluster.wait(60)
    assert time.monotonic() - start < 15
    assert codes == [2, 3], cluster.dump()
    assert "the job store carries at most" in cluster.agents[0].stderr()
    assert (
        "could not join" in cluster.agents[1].stderr() and "big.yml" in cluster.agents[1].stderr()
    )


def test_an_oversized_error_record_is_cut_and_the_job_still_ends_with_its_cause(
    cluster_factory, tmp_path
):
    script = _script(
        tmp_path,
        "huge_error.py",
        """
        import json, os, sys, time
        if os.environ["RANK"] == "1":
            message = "boom " + "y" * (9 * 1024 * 1024)
            with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
                json.dump({"message": {"message": message, "extraInfo": {"py_callstack": message}}}, f)
            sys.exit(1)
        time.sleep(3600)
        """,
    )
    cluster = cluster_factory(2).start(["--nproc-per-node", "1", script])
    start = time.monotonic()
    assert cluster.wait(60) == [1, 1], cluster.dump()
    assert time.monotonic() - start < 20
    cause = cluster.summary()["root_cause"]
    assert cause["rank"] == 1 and "characters cut" in cause["traceback"]
    assert len(cause["traceback"]) < 70_000


@pytest.mark.parametrize("fails", [False, True])
def test_processes_that_escape_their_rank_are_cleaned_up(cluster_factory, tmp_path, fails):
    """A rank leaves a double-forked daemon (own session, ignores SIGTERM) and exits."""
    script = _script(
        tmp_path,
        "daemon.py",
        f"""
        import os, signal, sys, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                open(os.path.join({str(tmp_path)!r}, "daemon-" + os.environ["RANK"]), "w").close()
                while True:
                    time.sleep(1)
            os._exit(0)
        while not os.path.exists(os.path.join({str(tmp_path)!r}, "daemon-" + os.environ["RANK"])):
            time.sleep(0.01)
        sys.exit(3 if {fails!r} and os.environ["RANK"] == "0" else 0)
        """,
    )
    cluster = cluster_factory(1).start(["--nproc-per-node", "2", "--grace", "1", script])
    assert cluster.wait(60) == [1 if fails else 0], cluster.dump()
    wait_for(lambda: not job_processes(cluster.marker), 5, "no process of the job to remain")
    warnings = cluster.summary()["attempts"][0]["warnings"]
    assert any("left behind by ranks" in w and "cleaned up" in w for w in warnings), warnings


def test_a_process_that_exits_by_itself_is_not_reported(cluster_factory, tmp_path):
    """Python's resource_tracker (every spawn DataLoader, every SharedMemory) outlives its rank
    by a moment and ends when the rank's pipe closes: nothing the agent had to clean up."""
    script = _script(
        tmp_path,
        "tracker.py",
        """
        import multiprocessing, os
        from multiprocessing import resource_tracker, shared_memory
        multiprocessing.get_context("spawn")
        memory = shared_memory.SharedMemory(create=True, size=64)  # starts the resource_tracker
        memory.close()
        memory.unlink()
        print("tracker", resource_tracker._resource_tracker._pid, flush=True)
        """,
    )
    cluster = cluster_factory(1).start(["--nproc-per-node", "2", "--grace", "5", script])
    assert cluster.wait(60) == [0], cluster.dump()
    trackers = [int(cluster.rank_file(r).read_text().split()[1]) for r in range(2)]
    assert all(trackers) and trackers[0] != trackers[1], trackers
    warnings = cluster.summary()["attempts"][0]["warnings"]
    assert not any("left behind" in w for w in warnings), warnings
    assert "left behind" not in cluster.agents[0].stderr(), cluster.dump()
    assert not job_processes(cluster.marker)


@pytest.fixture
def tiny_disk(tmp_path):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a 2 MiB tmpfs (CI runs as root)")
    path = tmp_path / "disk"
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield path
    subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_full_log_disk_loses_output_but_not_the_job(tiny_disk, tmp_path):
    """The ranks decide the outcome; the loss is counted on the console and in the summary."""
    script = _script(
        tmp_path,
        "spew.py",
        """
        import os, sys
        line = ("x" * 1023 + "\\n").encode()
        for _ in range(8 * 1024):  # 8 MiB per rank into a 2 MiB disk
            os.write(1, line)
        sys.exit(0)
        """,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["AGENT_SECRET"] = "disk-test"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent",
            "--nproc-per-node",
            "2",
            "--console-ranks",
            "none",
            "--log-dir",
            str(tiny_disk),
            script,
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "No space left on device" in done.stderr and "keeps running" in done.stderr
    assert "Traceback" not in done.stderr
    summary = (tiny_disk / "summary.json").read_text()
    assert '"status": "succeeded"' in summary and "bytes not written to" in summary
