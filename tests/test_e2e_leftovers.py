"""What the ranks leave holding the node's GPUs, after every attempt (agent.run.leftovers), on
loopback nodes whose device files are the test's own (LAUNCH_AGENT_DEVICE_ROOT, a test seam)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import psutil
import pytest
from cluster import REPO, job_processes, wait_for

pytestmark = pytest.mark.e2e  # every test here starts agents

NOBODY = 65534


def _script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


@pytest.fixture
def device_roots():
    """One device dir per node, readable by another user (pytest's tmp_path is root's only)."""
    top = Path(tempfile.mkdtemp(prefix="devroots-"))
    top.chmod(0o755)
    roots = []
    for node in range(3):
        root = top / f"n{node}"
        root.mkdir(mode=0o755)
        (root / "nvidia0").write_text("")
        (root / "nvidia0").chmod(0o644)
        roots.append(root)
    yield roots
    shutil.rmtree(top, ignore_errors=True)


def test_an_escaped_holder_is_ended_and_named_in_the_summary(
    cluster_factory, tmp_path, device_roots
):
    """A rank forks a child into another session that ignores SIGTERM and keeps the node's
    device file open, then exits: the agent ends it and summary.json says what it ended."""
    device = device_roots[0] / "nvidia0"
    script = _script(
        tmp_path,
        "holder.py",
        f"""
        import os, signal, sys, time
        flag = os.path.join({str(tmp_path)!r}, "holding")
        if os.fork() == 0:
            os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            fd = os.open({str(device)!r}, os.O_RDONLY)
            open(flag, "w").close()
            while True:
                time.sleep(1)
        while not os.path.exists(flag):
            time.sleep(0.01)
        """,
    )
    env = {"LAUNCH_AGENT_DEVICE_ROOT": str(device_roots[0])}
    cluster = cluster_factory(1).start(["--nproc-per-node", "1", "--grace", "1", script], env=env)
    assert cluster.wait(60) == [0], cluster.dump()
    assert not job_processes(cluster.marker)
    (left,) = cluster.summary()["attempts"][0]["leftovers"]
    (killed,) = left["killed"]
    assert killed["devices"] == [str(device)] and killed["ours"] is True
    assert script in killed["command"] and killed["user"] == pwd.getpwuid(os.geteuid()).pw_name
    assert not psutil.pid_exists(killed["pid"])
    assert left["stays"] == [] and left["unusable"] is False


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start another user's process")
def test_another_users_holder_is_named_and_its_node_replaced_by_the_spare(
    cluster_factory, tmp_path, device_roots
):
    """Node 1's GPU is held by another user's process: named, never signalled; the attempt
    fails (a program failure, restarted), node 1 fails its next health check on the holder and
    the spare runs the next attempt in its place."""
    foreign = subprocess.Popen(
        ["/usr/bin/python3", "-c", "import os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDONLY)\nprint('holding', flush=True)\ntime.sleep(600)",
         str(device_roots[1] / "nvidia0")],
        stdout=subprocess.PIPE, start_new_session=True, preexec_fn=lambda: os.setuid(NOBODY),
    )  # fmt: skip
    try:
        assert foreign.stdout is not None and foreign.stdout.readline() == b"holding\n"
        script = _script(
            tmp_path,
            "fail_once.py",
            """
            import os, sys
            sys.exit(3 if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" else 0)
            """,
        )
        args = ["--nproc-per-node", "1", "--spares", "1", "--max-restarts", "1", "--grace", "1"]
        cluster = cluster_factory(3).start(
            [*args, script],
            per_node_env=lambda node: {"LAUNCH_AGENT_DEVICE_ROOT": str(device_roots[node])},
        )
        assert cluster.wait(120) == [0, 0, 0], cluster.dump()
        assert foreign.poll() is None, "another user's process was signalled"
        summary = cluster.summary()
        first, second = summary["attempts"]
        (left,) = first["leftovers"]  # only node 1 found anything
        assert left["host"] == "127.0.0.2" and left["unusable"] is True and left["killed"] == []
        (holder,) = left["stays"]
        assert (holder["pid"], holder["user"], holder["ours"]) == (foreign.pid, "nobody", False)
        reason = f"GPUs still held by pid {foreign.pid} (user nobody)"
        assert left["reason"] == reason
        (excluded,) = summary["excluded"]
        assert excluded["host"] == "127.0.0.2" and reason in excluded["why"]
        assert excluded["attempt"] == 1
        assert [n["host"] for n in second["nodes"]] == ["127.0.0.1", "127.0.0.3"]
        assert "leftovers" not in second or not second["leftovers"]
        # the history row says so, and so does the doctor on that node
        user = {**os.environ, "PYTHONPATH": str(REPO), "AGENT_STATE_DIR": str(tmp_path / "state"),
                "TMPDIR": str(tmp_path / "tmp")}  # fmt: skip
        shown = subprocess.run(
            [sys.executable, "-m", "agent", "history", f"{cluster.job}.0", "--json"],
            capture_output=True, text=True, env=user, timeout=60,
        )  # fmt: skip
        (job,) = json.loads(shown.stdout)
        assert job["attempts"][0]["held"] == f"127.0.0.2: {reason}", job
        doctor = subprocess.run(
            [sys.executable, "-m", "agent", "doctor", "--device-root", str(device_roots[1])],
            capture_output=True, text=True, env=user, timeout=60,
        )  # fmt: skip
        assert f"GPU holders now: pid {foreign.pid} (user nobody) holds " in doctor.stdout
    finally:
        foreign.kill()
        foreign.wait()
    wait_for(lambda: not job_processes(cluster.marker), 5, "no process of the job to remain")
