"""End to end: ranks are really bound (read back from /proc), plans show placement, bad
placements are refused before anything starts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from cluster import FIXTURE, base_env, wait_for
from fake_sysfs import NODE0_GPUS, add_cpus, add_gpu, add_node, dgx, two_socket_cpus

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs"),
]


def _proc_cpus(pid: int) -> str:
    with open(f"/proc/{pid}/status") as f:
        return next(
            line.split(":", 1)[1].strip() for line in f if line.startswith("Cpus_allowed_list")
        )


def _proc_policy(pid: int) -> str:
    with open(f"/proc/{pid}/numa_maps") as f:
        return f.readline().split()[1]


@pytest.mark.parametrize("strict, policy", [(False, "prefer:0"), (True, "bind:0")])
def test_exclusive_binding_gives_each_rank_its_own_cpu(cluster_factory, tmp_path, strict, policy):
    done = tmp_path / "done"
    args = [
        "--nproc-per-node",
        "2",
        "--numa-binding",
        "exclusive",
        *(["--numa-strict"] if strict else []),
        FIXTURE,
        "--env-out",
        str(tmp_path),
        "--until-file",
        str(done),
    ]
    cluster = cluster_factory(1).start(args)
    wait_for(
        lambda: (tmp_path / "env-0.json").exists() and (tmp_path / "env-1.json").exists(),
        60,
        "ranks",
    )
    pids = {r: json.loads((tmp_path / f"env-{r}.json").read_text())["pid"] for r in (0, 1)}
    seen = {r: (_proc_cpus(pid), _proc_policy(pid)) for r, pid in pids.items()}
    done.touch()
    assert cluster.wait(60) == [0], cluster.dump()
    assert {seen[0][0], seen[1][0]} == {"0", "1"} and seen[0][0] != seen[1][0]
    assert seen[0][1] == seen[1][1] == policy
    ranks = cluster.summary()["attempts"][0]["ranks"]
    assert {r["binding"] for r in ranks} == {f"cpus 0, memory {policy}", f"cpus 1, memory {policy}"}
    assert json.loads((tmp_path / "env-0.json").read_text())["env"]["OMP_NUM_THREADS"] == "1"


def _agent(tmp_path, args, env):
    full = base_env(tmp_path)
    full.update(env)
    return subprocess.run(
        [sys.executable, "-m", "agent", "--log-dir", str(tmp_path / "logs"), *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )


def test_dry_run_shows_gpu_pci_numa_and_cpus_per_rank(tmp_path):
    root = dgx(tmp_path / "sys-root")
    proc = _agent(
        tmp_path,
        ["--dry-run", "--sysfs-root", str(root), "--nproc-per-node", "2", FIXTURE],
        {"CUDA_VISIBLE_DEVICES": "2,0"},
    )
    assert proc.returncode == 0, proc.stderr
    rows = re.findall(
        r"^rank (\d) .* gpu (\S+)  pci (\S+)  numa (\S+)  cpus (\S+)$", proc.stdout, re.M
    )
    # CUDA index 0 is bus-order GPU 2, index 1 is GPU 0: both on node 0; default mode is "node".
    assert rows == [
        ("0", "0", NODE0_GPUS[2], "0", "0-15,32-47"),
        ("1", "1", NODE0_GPUS[0], "0", "0-15,32-47"),
    ]


def test_gpu_on_an_unknown_numa_node_is_refused(tmp_path):
    root = tmp_path / "sys-root"
    two_socket_cpus(root)
    add_gpu(root, "0000:07:00.0", 3, range(0, 16))
    proc = _agent(
        tmp_path,
        ["--sysfs-root", str(root), "--numa-binding", "node", FIXTURE, "--ready-to", str(tmp_path)],
        {"CUDA_VISIBLE_DEVICES": "0"},
    )
    assert proc.returncode == 2, proc.stderr
    assert "NUMA node 3" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.glob("ready-*")) and not (tmp_path / "logs").exists()


def test_empty_cpu_set_is_refused(tmp_path):
    root = tmp_path / "sys-root"
    add_cpus(root, {0: (0, 0), 1: (0, 1)})
    add_node(root, 0, [0, 1])
    add_node(root, 1, [])  # a memory-only node: no CPU near the GPU
    add_gpu(root, "0000:07:00.0", 1, [])
    proc = _agent(
        tmp_path,
        ["--sysfs-root", str(root), "--numa-binding", "node", FIXTURE, "--ready-to", str(tmp_path)],
        {"CUDA_VISIBLE_DEVICES": "0"},
    )
    assert proc.returncode == 2, proc.stderr
    assert (
        "none of NUMA node 1's CPUs is allowed" in proc.stderr
        and "--numa-binding off" in proc.stderr
    )
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.glob("ready-*")) and not (tmp_path / "logs").exists()
