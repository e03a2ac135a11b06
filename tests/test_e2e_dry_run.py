"""The dry run is the run (issue 24): `--dry-run` prints exactly the ranks the agents spawn —
ranks 0..W-1 with WORLD_SIZE=W, spares named as standing by — from the same function."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from cluster import FIXTURE, base_env, slurm_env

pytestmark = pytest.mark.e2e

SEEN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")


def _dry(tmp_path, job, nnodes, *args):
    env = base_env(tmp_path)
    env.update(slurm_env(job, nnodes, 0))
    argv = [sys.executable, "-m", "agent", "--dry-run", *args]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    ranks = {}
    for found in re.finditer(r"^rank (\d+)  node \d+ \((\S+)\).*\n  argv: .*\n  env: (.*)$",
                             proc.stdout, re.M):  # fmt: skip
        env = dict(item.split("=", 1) for item in found.group(3).split(" ") if "=" in item)
        ranks[int(found.group(1))] = (found.group(2), {k: env.get(k) for k in SEEN})
    return proc.stdout, ranks


def test_dry_run_with_a_spare_prints_the_ranks_that_run(tmp_path, cluster_factory):
    args = ["--spares", "1", "--nproc-per-node", "2", FIXTURE]
    out, dry = _dry(tmp_path, "4343", 3, *args)
    assert sorted(dry) == [0, 1, 2, 3], out
    assert {env["WORLD_SIZE"] for _, env in dry.values()} == {"4"}, out
    assert "world size 4" in out and "spare  agent 2 (127.0.0.3)  stands by" in out, out

    # The real run: the same ranks on the same hosts with the same variables.
    cluster = cluster_factory(3)
    seen = tmp_path / "seen"
    seen.mkdir()
    cluster.start([*args, "--env-out", str(seen)])
    assert cluster.wait(120) == [0, 0, 0], cluster.dump()
    real = {}
    for path in seen.glob("env-*.json"):
        env = json.loads(path.read_text())["env"]
        real[int(env["RANK"])] = (env["SLURMD_NODENAME"], {k: env.get(k) for k in SEEN})
    assert real == dry
