"""NCCL's own flight-recorder dumps read into the probes' typed view: a dump made by torch's own
serializer, NCCL's pg_config, and files that are not dumps of ours (a pickle naming a class, a
link, one too large) skipped."""

from __future__ import annotations

import collections
import os
import pickle
import subprocess
import sys

import pytest

from agent.hang.nccl_dumps import DUMP_LIMIT, dump_findings, read_dump, recorder_of, recorders
from agent.hang.plain_data import NotPlainData, plain_data

MAKE_DUMP = """
import pickle, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:0")
pair = dist.new_group([0], group_desc="mine")
for _ in range(3):
    dist.all_reduce(torch.ones(4))
dist.all_reduce(torch.ones(2, 3), group=pair)
# gloo marks a collective completed from its future's callback, which may run after all_reduce
# has returned: dump once every group's status says so (CI once caught the third not yet). The
# status, not each entry's state: torch 2.13 leaves a one-rank gloo group's entries "scheduled"
# for good, and waiting on those cost this test its whole deadline.
deadline = time.monotonic() + 60
while True:
    dump = torch._C._distributed_c10d._dump_fr_trace(True, False)
    status = pickle.loads(dump)["pg_status"].values()
    done = all(s["last_completed_collective"] == s["last_enqueued_collective"] for s in status)
    if done or time.monotonic() > deadline:
        break
    time.sleep(0.01)
open(sys.argv[1], "wb").write(dump)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def torch_dump(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("dump") / "nccl-trace.a0.rank-0"
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "200"}
    subprocess.run([sys.executable, "-c", MAKE_DUMP, str(path)], check=True, env=env, timeout=120)
    return path.read_bytes()


def test_a_dump_by_torchs_serializer_reads_like_a_probes_answer(tmp_path, torch_dump):
    (tmp_path / "nccl-trace.a0.rank-0").write_bytes(torch_dump)
    (tmp_path / "nccl-trace.a1.rank-0").write_bytes(torch_dump)  # another attempt's
    (tmp_path / "nccl-trace.a0.rank-1.tmp").write_bytes(torch_dump)  # not a finished dump
    found = recorders(str(tmp_path), 0)
    assert list(found) == [0]
    world, pair = found[0].groups
    assert (world.name, world.label(), world.entered, world.completed) == ("0", "default_pg", 3, 3)
    assert [(c.seq, c.op, c.shape) for c in world.last] == [
        (1, "all_reduce", "[4] Float"), (2, "all_reduce", "[4] Float"),
        (3, "all_reduce", "[4] Float"),
    ]  # fmt: skip
    assert (pair.label(), pair.entered, pair.last[-1].shape) == ("mine", 1, "[2, 3] Float")


def test_nccls_group_members_and_who_waits(tmp_path):
    """NCCL's pg_config lists a group's members as text; rank 1 waits in #2 that rank 0 has
    not entered: the finding names both."""

    def trace(entered: int, completed: int) -> dict:
        entry = {"process_group": ("1", "undefined"), "collective_seq_id": entered,
                 "profiling_name": "nccl:all_gather", "input_sizes": [[8]],
                 "input_dtypes": ["Float"]}  # fmt: skip
        return {
            "pg_config": {"1": {"name": "1", "desc": "undefined", "ranks": "[0, 1]"}},
            "pg_status": {
                "1": {"last_enqueued_collective": entered, "last_completed_collective": completed}
            },  # fmt: skip
            "entries": [entry],
        }

    (tmp_path / "nccl-trace.a2.rank-0").write_bytes(pickle.dumps(trace(1, 1)))
    (tmp_path / "nccl-trace.a2.rank-1").write_bytes(pickle.dumps(trace(2, 1)))
    assert recorder_of(trace(2, 1)).groups[0].label() == "group 1 (ranks 0,1)"
    assert dump_findings(str(tmp_path), 2, {0: -6, 1: -6}) == [
        "rank 1 entered all_gather #2 on group 1 (ranks 0,1) ([8] Float); rank 0 last entered #1"
    ]  # placed by its dump, not by its exit (killed by signal 6, as every rank at a timeout)


@pytest.mark.parametrize(
    "make",
    [
        lambda path, dump: path.write_bytes(pickle.dumps(collections.OrderedDict(a=1))),
        lambda path, dump: path.write_bytes(b"not a pickle"),
        lambda path, dump: path.write_bytes(pickle.dumps(["a list"])),
        lambda path, dump: (
            (path.parent / "real").write_bytes(dump) or path.symlink_to(path.parent / "real")
        ),
        lambda path, dump: os.truncate(path.write_bytes(b"") or path, DUMP_LIMIT + 1),
    ],
    ids=["names-a-class", "garbage", "not-a-dict", "a-link", "too-large"],
)
def test_a_file_that_is_not_a_dump_of_ours_is_skipped(tmp_path, torch_dump, make):
    path = tmp_path / "nccl-trace.a0.rank-3"
    make(path, torch_dump)
    assert read_dump(str(path)) is None
    assert recorders(str(tmp_path), 0) == {}


PLAIN = {"a": [1, -2, 2**70, 1.5, None, True, False], "t": ("x", b"y"), (1, 2): {"s": {3}},
         "f": frozenset({4}), "u": "é" * 300, "big": list(range(2000))}  # fmt: skip


BASIC = {k: v for k, v in PLAIN.items() if k not in ("t", (1, 2), "f")}


@pytest.mark.parametrize("protocol", range(0, pickle.HIGHEST_PROTOCOL + 1))
def test_plain_data_decodes_every_protocol_without_unpickling(protocol):
    """Protocols before 4 spell bytes and sets through a class (refused); torch's dumps hold
    none of them (dicts, lists, tuples, strings, numbers: see the dump made above)."""
    assert plain_data(pickle.dumps(BASIC, protocol=protocol)) == BASIC
    if protocol >= 4:
        assert plain_data(pickle.dumps(PLAIN, protocol=protocol)) == PLAIN


class _Evil:
    def __reduce__(self):
        return (os.system, ("true",))


@pytest.mark.parametrize(
    "payload",
    [
        pickle.dumps(_Evil()),  # REDUCE of os.system
        pickle.dumps(collections.OrderedDict(a=1)),  # a class found
        pickle.dumps(os.getcwd, protocol=0),  # GLOBAL
        b"\x80\x04K\x01",  # no STOP
        b"garbage",
    ],
    ids=["reduce", "class", "global", "truncated", "garbage"],
)
def test_plain_data_refuses_anything_that_is_not(payload):
    with pytest.raises(NotPlainData):
        plain_data(payload)
