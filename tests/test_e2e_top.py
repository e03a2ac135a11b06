"""`agent top` on a live job (2 simulated nodes × 2 ranks on loopback): every rank's row, from
another shell, through node 0's endpoint; the redraw ends with the job."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from cluster import REPO, base_env, wait_for

pytestmark = pytest.mark.e2e

RANK = str(REPO / "tests" / "fixtures" / "rank.py")


def _top(cluster, *args, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "agent", "top", str(cluster.log_dir), *args],
        env=base_env(cluster.tmp), capture_output=True, text=True, timeout=60, **kwargs,
    )  # fmt: skip


def test_top_shows_every_rank_of_every_node_then_ends_with_the_job(cluster_factory, tmp_path):
    flag, seen = tmp_path / "done", tmp_path / "env"
    seen.mkdir()
    args = ["--nproc-per-node", "2", RANK, "--env-out", str(seen), "--until-file", str(flag)]
    cluster = cluster_factory(2).start(args)
    files = [seen / f"env-{r}.json" for r in range(4)]
    # a file exists before its rank has written it: wait for each to be whole
    written = lambda: all(f.exists() and f.read_text().strip().endswith("}") for f in files)  # noqa: E731
    wait_for(written, 90, "every rank to start")
    pids = {r: json.loads((seen / f"env-{r}.json").read_text())["pid"] for r in range(4)}

    start = time.monotonic()
    once = _top(cluster, "--once")
    took = time.monotonic() - start
    assert once.returncode == 0, once.stderr + cluster.dump()
    lines = once.stdout.splitlines()
    assert lines[0].split() == ["rank", "host", "state", "pid", "cpu", "%", "rss", "silent"]
    rows = {int(line.split()[0]): line.split() for line in lines[1:]}
    assert sorted(rows) == [0, 1, 2, 3], once.stdout
    for rank, cells in rows.items():
        assert cells[1] == f"127.0.0.{rank // 2 + 1}", once.stdout  # the node that runs it
        assert cells[2] == "running" and int(cells[3]) == pids[rank], once.stdout
        assert cells[6] == "MiB" and cells[7].endswith("s"), once.stdout  # rss, silent
    assert took < 30, f"agent top --once took {took:.2f}s"

    # the redraw into a pipe: one plain table a second, until the job's verdict; then exit 0
    follow = subprocess.Popen(
        [sys.executable, "-m", "agent", "top", str(cluster.log_dir)],
        env=base_env(cluster.tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert follow.stdout is not None
    drawn = [follow.stdout.readline() for _ in range(5)]  # its first table: header, 4 rows
    assert drawn[4].split()[:3] == ["3", "127.0.0.2", "running"], drawn
    flag.touch()
    assert cluster.wait(60) == [0, 0], cluster.dump()
    out, err = follow.communicate(timeout=60)
    assert follow.returncode == 0, err
    assert out.rstrip().endswith("the job has ended"), out
