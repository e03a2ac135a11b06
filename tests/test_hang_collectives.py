"""Every rank's flight recorder collated (pure tables), the probe's answers parsed as hostile,
and the probe itself in a real rank: gloo, two groups, a deadlock by order."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.hang.collectives import findings
from agent.hang.recorder import (
    NO_PROBE,
    PROBE_DIR,
    Collective,
    GroupState,
    RankRecorder,
    ask,
    ask_all,
    probe_env,
    with_probe,
)

WORLD = (0, 1, 2, 3)


def _group(name, ranks, entered, completed, last=(), desc=""):
    desc = desc or ("default_pg" if name == "0" else "undefined")
    return GroupState(name, desc, tuple(ranks), entered, completed, tuple(last))


def _ar(seq, shape="[4] Float", op="all_reduce"):  # as the probe's answer reads
    return Collective(seq, op, shape)


def _rec(*groups):
    return RankRecorder(True, True, tuple(groups))


WAITING_4 = _group("0", WORLD, 4, 3, [_ar(3), _ar(4)])
DONE_3 = _group("0", WORLD, 3, 3, [_ar(3)])

SHAPES = [
    pytest.param(
        {0: _rec(WAITING_4), 1: _rec(WAITING_4), 2: _rec(WAITING_4, _group("1", (2, 3), 0, 0)),
         3: _rec(DONE_3, _group("1", (2, 3), 1, 0, [_ar(1, "[2, 3] Float")]))},
        {}, {},
        ["ranks 0-2 entered all_reduce #4 on default_pg ([4] Float); rank 3 last entered #3 and "
         "waits in all_reduce #1 on group 1 (ranks 2,3)",
         "rank 3 entered all_reduce #1 on group 1 (ranks 2,3) ([2, 3] Float); rank 2 has entered "
         "none on it and waits in all_reduce #4 on default_pg"],
        id="deadlock-by-order",
    ),
    pytest.param(
        {0: _rec(WAITING_4), 1: _rec(WAITING_4), 2: _rec(WAITING_4)}, {}, {3: 0},
        ["ranks 0-2 entered all_reduce #4 on default_pg ([4] Float); rank 3 exited 0"],
        id="uneven-loop-rank-exited",
    ),
    pytest.param(
        {0: _rec(WAITING_4), 1: _rec(WAITING_4), 2: _rec(WAITING_4), 3: _rec(DONE_3)},
        {3: "load_batch (data.py:88)"}, {},
        ["ranks 0-2 entered all_reduce #4 on default_pg ([4] Float); rank 3 last entered #3 and "
         "is in load_batch (data.py:88)"],
        id="one-rank-behind-in-its-code",
    ),
    pytest.param(
        {0: _rec(WAITING_4), 1: _rec(WAITING_4),
         2: _rec(_group("0", WORLD, 4, 3, [_ar(4, op="all_gather")])), 3: _rec(WAITING_4)},
        {}, {},
        ["ranks 0-1,3 entered all_reduce #4 on default_pg ([4] Float)",
         "rank 2 entered all_gather #4 ([4] Float) where ranks 0-1,3 entered all_reduce #4 on "
         "default_pg"],
        id="desync-same-seq-other-op",
    ),
    pytest.param(
        {0: _rec(WAITING_4), 1: _rec(WAITING_4), 2: _rec(WAITING_4),
         3: RankRecorder(True, False)},
        {}, {},
        ["ranks 0-2 entered all_reduce #4 on default_pg ([4] Float); rank 3 never initialised "
         "torch.distributed", "rank 3 never initialised torch.distributed"],
        id="never-initialised",
    ),
    pytest.param(
        {0: _rec(WAITING_4), 1: _rec(WAITING_4), 2: _rec(WAITING_4),
         3: RankRecorder(False, False, (), "no answer within 1 s (holding the GIL?)")},
        {}, {},
        ["ranks 0-2 entered all_reduce #4 on default_pg ([4] Float); rank 3 did not answer (no "
         "answer within 1 s (holding the GIL?))"],
        id="silent-rank",
    ),
    pytest.param({r: _rec(DONE_3) for r in WORLD}, {}, {}, [], id="all-between-collectives"),
    pytest.param({r: RankRecorder(False, False) for r in WORLD}, {}, {}, [], id="no-torch"),
]  # fmt: skip


@pytest.mark.parametrize(("recorders", "where", "ended", "lines"), SHAPES)
def test_findings(recorders, where, ended, lines):
    assert findings(recorders, where, ended) == lines


@pytest.mark.parametrize(
    "data",
    [None, 3, {"groups": "x"}, {"groups": [{"ranks": ["a"], "entered": 1, "completed": 0}]},
     {"groups": [{"ranks": [0], "entered": True, "completed": 0}]},
     {"groups": [{"ranks": [0], "entered": 1, "completed": 0, "last": [{"seq": "1"}]}]}],
)  # fmt: skip
def test_a_recorder_answer_is_parsed_as_hostile(data):
    parsed = RankRecorder.from_json(data)
    assert all(g.ranks == (0,) and g.last == () for g in parsed.groups)


def test_a_recorder_round_trips():
    rec = _rec(WAITING_4, _group("1", (2, 3), 1, 0, [_ar(1, "[2, 3] Float")]))
    assert RankRecorder.from_json(rec.to_json()) == rec


# -- the probe in real processes -----------------------------------------------------------------
def _rank(script: Path, code: str, probe: Path, env: dict | None = None) -> subprocess.Popen:
    """A Python rank started as the exec wrapper starts one: AGENT_PROBE_PID is its own pid."""
    script.write_text(code)
    full = {**os.environ, **(env or {}), **probe_env(str(probe), os.environ)}
    return subprocess.Popen(
        [sys.executable, "-c", "import os, sys; os.environ['AGENT_PROBE_PID'] = str(os.getpid()); "
         f"os.execv(sys.executable, [sys.executable, {str(script)!r}])"],
        env=full, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


def _answer(probe: Path, pid: int) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = ask(str(probe), pid)
        if "error" not in found or "no probe" not in found["error"]:
            return found
        time.sleep(0.05)  # the rank's interpreter is still starting: its socket is not there yet
    raise AssertionError("the probe never listened")


def test_a_rank_without_torch_answers_without_importing_it(tmp_path):
    probe = tmp_path / "p"
    probe.mkdir(mode=0o700)
    proc = _rank(tmp_path / "rank.py", "import time\nprint(flush=True)\ntime.sleep(60)\n", probe)
    try:
        proc.stdout.readline()
        assert _answer(probe, proc.pid) == {"torch": False}
        modules = Path(f"/proc/{proc.pid}/maps").read_text()
        assert "libtorch" not in modules  # the probe imported nothing of torch
    finally:
        proc.kill()
        proc.wait()


def test_ranks_asked_together_each_get_their_own_answer_and_one_without_a_probe_is_told_so(
    tmp_path,
):
    probe = tmp_path / "p"
    probe.mkdir(mode=0o700)
    proc = _rank(tmp_path / "rank.py", "import time\nprint(flush=True)\ntime.sleep(60)\n", probe)
    try:
        proc.stdout.readline()
        assert _answer(probe, proc.pid) == {"torch": False}  # listening now
        no_such = 1 << 30  # above any pid_max: no process, no socket
        answers = ask_all(str(probe), [(0, proc.pid), (1, no_such), (2, no_such + 1)])
        assert answers == {0: {"torch": False}, 1: {"error": NO_PROBE}, 2: {"error": NO_PROBE}}
    finally:
        proc.kill()
        proc.wait()


def test_the_probe_shadows_no_sitecustomize(tmp_path):
    """A site's own sitecustomize further down the path still runs."""
    own = tmp_path / "site"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['SITE_RAN'] = '1'\n")
    env = {**os.environ, "PYTHONPATH": f"{PROBE_DIR}{os.pathsep}{own}"}
    out = subprocess.run(
        [sys.executable, "-c", "import os, sitecustomize; print(os.environ.get('SITE_RAN'), "
         "sitecustomize.__file__)"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert out == ["1", str(own / "sitecustomize.py")]


DEADLOCK = """
import os, sys, time, torch, torch.distributed as dist
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=rank, world_size=4)
pair = dist.new_group([2, 3])
for _ in range(3):
    dist.all_reduce(torch.ones(4))
print("ready", flush=True)
if rank < 3:
    dist.all_reduce(torch.ones(4))
else:
    dist.all_reduce(torch.ones(2, 3), group=pair)
"""


@pytest.mark.e2e
def test_the_probes_of_a_deadlock_by_order_name_who_never_came(tmp_path):
    """The issue's shape: every stack reads all_reduce; the recorders tell them apart."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    probe = tmp_path / "p"
    probe.mkdir(mode=0o700)
    code = DEADLOCK.format(port=port)
    ranks = [_rank(tmp_path / f"rank{r}.py", code, probe, {"RANK": str(r)}) for r in range(4)]
    want = {0: 4, 1: 4, 2: 4}  # the ranks that enter the fourth world collective

    def entered() -> dict[int, RankRecorder] | None:
        found = {r: RankRecorder.from_json(_answer(probe, p.pid)) for r, p in enumerate(ranks)}
        world = {r: next((g.entered for g in found[r].groups if g.name == "0"), 0) for r in want}
        pair = next((g.entered for g in found[3].groups if g.name == "1"), 0)
        return found if world == want and pair == 1 else None

    try:
        for proc in ranks:
            assert proc.stdout.readline() == "ready\n"
        deadline = time.monotonic() + 60
        while (recorders := entered()) is None:  # each rank enters its last collective soon
            assert time.monotonic() < deadline, "the ranks never entered their last collective"
    finally:
        for proc in ranks:
            proc.kill()
            proc.wait()
    assert findings(recorders) == [
        "ranks 0-2 entered all_reduce #4 on default_pg ([4] Float); rank 3 last entered #3 and "
        "waits in all_reduce #1 on group 1 (ranks 2,3)",
        "rank 3 entered all_reduce #1 on group 1 (ranks 2,3) ([2, 3] Float); rank 2 has entered "
        "none on it and waits in all_reduce #4 on default_pg",
    ], recorders


def test_the_probe_env_is_added_once_and_a_zygote_prepared_with_it_fits_the_ranks():
    """A warm interpreter fits only ranks whose import-time environment (PYTHONPATH included)
    is its own: the node's environment, the run's and the ranks' carry the probe alike."""
    from agent.warm.command import import_fingerprint

    node = with_probe({"PYTHONPATH": "/site", "HOME": "/h"}, "/private")
    run = with_probe({**node, "FROM_CLIENT": "1"}, "/private")  # a run's env over the node's
    assert run["PYTHONPATH"] == f"{PROBE_DIR}{os.pathsep}/site" == node["PYTHONPATH"]
    rank = {**run, **probe_env("/private", run), "RANK": "3"}
    assert import_fingerprint(rank) == import_fingerprint(node)
    assert with_probe({"PYTHONPATH": "/site"}, None) == {"PYTHONPATH": "/site"}


class _FakeRecorderTorch:
    """torch as the probe sees it: `_dump_fr_trace_json(include_collectives, only_active)`
    answering from `status` and `entries`, counting the full dumps."""

    def __init__(self, status: dict, entries: list) -> None:
        import types

        self.status, self.entries, self.full_dumps = status, entries, 0
        c10d = types.SimpleNamespace(_dump_fr_trace_json=self._dump)
        self._C = types.SimpleNamespace(_distributed_c10d=c10d)

    def _dump(self, include_collectives: bool, only_active: bool) -> str:
        import json

        trace: dict = {"pg_status": self.status}
        if include_collectives:
            self.full_dumps += 1
            trace["entries"] = self.entries
        return json.dumps(trace)


def test_the_probe_reads_the_entries_only_for_a_pending_collective_and_once(monkeypatch):
    """A full recorder dump costs a rank 5-20 ms: none while nothing is pending, one per change
    of the counters while a collective is (the watch and `agent stacks` ask again and again)."""
    import types

    from agent.hang.probe import sitecustomize as probe

    group = object()
    world = types.SimpleNamespace(pg_group_ranks={group: {0: 0, 1: 1}})
    c10d = types.SimpleNamespace(_world=world, _get_process_group_name=lambda pg: "0")
    dist = types.SimpleNamespace(distributed_c10d=c10d)
    entry = {
        "collective_seq_id": 8,
        "profiling_name": "gloo:all_reduce",
        "process_group": ["0", "default_pg"],
        "input_sizes": [[4]],
        "input_dtypes": ["Float"],
    }
    torch = _FakeRecorderTorch(
        {"0": {"last_enqueued_collective": "7", "last_completed_collective": "7"}}, [entry]
    )
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(probe, "_entries_seen", None)

    idle = probe._groups(dist)
    assert (torch.full_dumps, idle[0]["entered"], idle[0]["last"]) == (0, 7, [])

    torch.status = {"0": {"last_enqueued_collective": "8", "last_completed_collective": "7"}}
    for _ in range(3):
        waiting = probe._groups(dist)
    assert torch.full_dumps == 1
    assert (waiting[0]["entered"], waiting[0]["completed"]) == (8, 7)
    assert [(e["seq"], e["op"]) for e in waiting[0]["last"]] == [(8, "all_reduce")]

    torch.status = {"0": {"last_enqueued_collective": "9", "last_completed_collective": "8"}}
    probe._groups(dist)
    assert torch.full_dumps == 2


class _TwoRecorders:
    """torch's CUDA build as the probe sees it: NCCL's groups in `_dump_nccl_trace_json`, the
    other backends' in `_dump_fr_trace_json` (a CPU build has only the second)."""

    def __init__(self, nccl: dict | None, generic: dict) -> None:
        import types

        recorders = {"_dump_fr_trace_json": _recorder(generic)}
        if nccl is not None:
            recorders["_dump_nccl_trace_json"] = _recorder(nccl)
        self._C = types.SimpleNamespace(_distributed_c10d=types.SimpleNamespace(**recorders))


def _recorder(groups: dict):
    """groups: name -> (entered, completed); the entry of each pending collective."""
    import json

    def dump(include_collectives: bool, only_active: bool) -> str:
        trace: dict = {
            "pg_status": {
                name: {"last_enqueued_collective": str(e), "last_completed_collective": str(c)}
                for name, (e, c) in groups.items()
            }
        }
        if include_collectives:
            trace["entries"] = [
                {"collective_seq_id": e, "profiling_name": "nccl:all_reduce",
                 "process_group": [name, "pg"], "state": "scheduled"}
                for name, (e, c) in groups.items() if e > c
            ]  # fmt: skip
        return json.dumps(trace)

    return dump


@pytest.mark.parametrize(
    ("nccl", "generic", "expected"),
    [
        # a CUDA build, the job on NCCL: the generic recorder knows the groups but saw nothing
        ({"0": (5, 4)}, {"0": (0, 0)}, {"0": (5, 4, [5])}),
        ({"0": (5, 4)}, {}, {"0": (5, 4, [5])}),
        # a CPU build (no NCCL recorder): gloo's collectives in the generic one
        (None, {"0": (3, 2)}, {"0": (3, 2, [3])}),
        # a CUDA build running gloo only
        ({}, {"0": (3, 2)}, {"0": (3, 2, [3])}),
        # NCCL's default group and a gloo side group, each pending in its own recorder
        ({"0": (9, 8)}, {"1": (2, 1)}, {"0": (9, 8, [9]), "1": (2, 1, [2])}),
        # one group name in both (cpu:gloo,cuda:nccl): the recorder that saw more
        ({"0": (7, 7)}, {"0": (2, 1)}, {"0": (7, 7, [])}),
        ({"0": (1, 1)}, {"0": (4, 3)}, {"0": (4, 3, [4])}),
    ],
)
def test_the_probe_reads_the_recorder_that_saw_each_group(monkeypatch, nccl, generic, expected):
    """A rank stuck in an NCCL collective showed no collective at all on a real H200 (the
    probe read only the generic recorder, where NCCL's groups never record)."""
    import types

    from agent.hang.probe import sitecustomize as probe

    groups = {name: object() for name in expected}
    world = types.SimpleNamespace(pg_group_ranks={pg: {0: 0, 1: 1} for pg in groups.values()})
    names = {id(pg): name for name, pg in groups.items()}
    c10d = types.SimpleNamespace(_world=world, _get_process_group_name=lambda pg: names[id(pg)])
    monkeypatch.setitem(sys.modules, "torch", _TwoRecorders(nccl, generic))
    monkeypatch.setattr(probe, "_entries_seen", None)

    found = probe._groups(types.SimpleNamespace(distributed_c10d=c10d))
    assert {
        g["name"]: (g["entered"], g["completed"], [e["seq"] for e in g["last"]]) for g in found
    } == expected
