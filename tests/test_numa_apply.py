"""apply_binding in real child processes, checked from outside through /proc."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from agent.warm.numa_apply import read_binding

REPO = Path(__file__).resolve().parents[1]
CPU = max(os.sched_getaffinity(0))  # 1 on the 2-CPU CI box
CHILD = """
import json, sys
if sys.argv[2] == "no-libnuma":
    sys.modules["numa"] = None  # import numa now fails, as without libnuma
from agent.errors import AgentError
from agent.warm.numa_apply import apply_binding
cpus, nodes, strict = json.loads(sys.argv[1])
try:
    warnings = apply_binding(cpus, nodes, strict)
except AgentError as error:
    print(json.dumps({"error": str(error)}), flush=True)
    sys.exit(3)
print(json.dumps({"warnings": warnings}), flush=True)
sys.stdin.readline()  # stay alive until the test has looked at /proc
"""


def first_mem_node() -> int:
    status = Path("/proc/self/status").read_text()
    line = next(x for x in status.splitlines() if x.startswith("Mems_allowed_list:"))
    return int(line.split(":")[1].strip().split(",")[0].split("-")[0])


NODE = first_mem_node()


@contextmanager
def child(
    cpus: list[int], nodes: list[int], strict: bool, variant: str = ""
) -> Iterator[tuple[subprocess.Popen, dict]]:
    args = [sys.executable, "-c", CHILD, json.dumps([cpus, nodes, strict]), variant or "-"]
    proc = subprocess.Popen(
        args, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        yield proc, json.loads(proc.stdout.readline() or "{}")
    finally:
        proc.communicate("go\n", timeout=30)


@pytest.mark.parametrize(("strict", "policy"), [(True, f"bind:{NODE}"), (False, f"prefer:{NODE}")])
def test_binding_seen_from_outside(strict: bool, policy: str) -> None:
    with child([CPU], [NODE], strict) as (proc, said):
        assert said == {"warnings": []}
        assert read_binding(proc.pid) == ({CPU}, policy)
        assert os.sched_getaffinity(proc.pid) == {CPU}
    assert proc.returncode == 0


def test_no_memory_nodes_binds_cpus_only() -> None:
    with child([CPU], [], True) as (proc, said):
        assert said == {"warnings": []}
        assert read_binding(proc.pid) == ({CPU}, "default")


def test_without_libnuma_cpus_only_and_one_warning() -> None:
    with child([CPU], [NODE], True, "no-libnuma") as (proc, said):
        assert len(said["warnings"]) == 1
        assert "libnuma unavailable" in said["warnings"][0]
        assert read_binding(proc.pid) == ({CPU}, "default")


@pytest.mark.parametrize(
    ("cpus", "nodes", "strict", "message"),
    [
        ([CPU], [64], True, "cannot bind memory to NUMA node(s) [64]"),
        ([CPU], [64], False, "cannot bind memory to NUMA node(s) [64]"),
        ([CPU], [-1], True, "NUMA node(s) [-1]"),
        ([CPU], [NODE, 9], True, "NUMA node(s) [9]"),
        ([4096], [NODE], True, "cannot bind to CPUs [4096]"),
        ([], [NODE], False, "empty CPU set"),
    ],
)
def test_out_of_range_is_an_error_not_a_segfault(
    cpus: list[int], nodes: list[int], strict: bool, message: str
) -> None:
    with child(cpus, nodes, strict) as (proc, said):
        pass
    assert proc.returncode == 3  # py-libnuma itself would have died with SIGSEGV (rc -11 / 139)
    assert message in said["error"]
    assert "--numa-binding off" in said["error"]


def test_read_binding_of_this_process() -> None:
    cpus, policy = read_binding(os.getpid())
    assert cpus == os.sched_getaffinity(0)
    assert policy == "default"
