"""The leftover audit (agent.run.leftovers): the pure scan over typed snapshots, and the audit on
real processes — the job's own ended, another user's named and let be, a real D state named."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from agent.run.leftovers import (
    KILL_WAIT,
    Holder,
    LeftoverAudit,
    Leftovers,
    Proc,
    markers_needed,
    scan,
    snapshot,
)
from tests.cluster import wait_for

ME, UID, OTHER = 100, 1000, 65534
MARK = "42.0"
DEV = ("/dev/nvidia0",)

root_only = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root to start another user's process"
)


def users(uid: int) -> str:
    return {UID: "alice", OTHER: "nobody"}.get(uid, str(uid))


def scanned(*procs: Proc, keep=()):
    return scan(procs, me=ME, uid=UID, marker=MARK, keep=keep, users=users)


# --- the pure scan -----------------------------------------------------------------------------


def test_the_agents_descendants_are_its_own_at_any_depth():
    found = scanned(
        Proc(ME, 1, UID, "sleeping"),
        Proc(200, ME, UID, "sleeping", "python rank.py"),
        Proc(201, 200, UID, "sleeping", "daemon", devices=DEV),
        Proc(300, 1, UID, "sleeping", "bash"),  # the user's shell: not ours
    )
    assert [h.pid for h in found.ours] == [200, 201]
    assert found.ours[1].devices == DEV and found.ours[1].user == "alice"
    assert found.foreign == ()


def test_a_marked_orphan_is_the_jobs_own_but_a_marked_rank_of_another_agent_is_not():
    found = scanned(
        Proc(ME, 1, UID, "sleeping"),
        Proc(400, 1, UID, "sleeping", "escaped", MARK, DEV),  # orphaned to init
        Proc(500, 1, UID, "sleeping", "python -m agent"),  # another agent of the job (no marker)
        Proc(501, 500, UID, "sleeping", "python rank.py", MARK, DEV),
        Proc(502, 501, UID, "sleeping", "worker", MARK, DEV),
        Proc(600, 1, UID, "sleeping", "other job", "7.0", DEV),  # another job of this user
    )
    assert [h.pid for h in found.ours] == [400]
    # 501/502 are the job's under a live agent: left to it; 600 holds a GPU: named, not ours
    assert [(h.pid, h.ours) for h in found.foreign] == [(600, False)]


def test_another_users_process_is_never_ours_even_below_the_agent():
    found = scanned(
        Proc(ME, 1, UID, "sleeping"),
        Proc(700, ME, OTHER, "sleeping", "setuid helper", devices=DEV),
        Proc(701, 1, OTHER, "sleeping", "foreign", MARK, DEV),
    )
    assert found.ours == ()
    assert [(h.pid, h.user) for h in found.foreign] == [(700, "nobody"), (701, "nobody")]


def test_the_agents_own_launchers_are_never_holders_but_their_other_children_are():
    """A notebook or launcher script that holds a GPU and runs `python -m agent` (seen on an
    H200: the node was called unusable after every attempt for its own parent)."""
    found = scanned(
        Proc(10, 1, UID, "sleeping", "python notebook.py", devices=DEV),
        Proc(11, 10, UID, "sleeping", "bash -c python -m agent train.py"),
        Proc(ME, 11, UID, "sleeping", "python -m agent train.py"),
        Proc(12, 10, UID, "sleeping", "python eval.py", devices=DEV),  # the notebook's other child
    )
    assert found.ours == ()
    assert [h.pid for h in found.foreign] == [12]


def test_zombies_kept_pids_the_drivers_daemons_and_idle_processes_are_left_out():
    found = scanned(
        Proc(ME, 1, UID, "sleeping"),
        Proc(800, ME, UID, "zombie", "gone", devices=DEV),
        Proc(801, ME, UID, "sleeping", "zygote"),
        Proc(802, 1, 0, "sleeping", "/usr/bin/nvidia-persistenced --user x", devices=DEV),
        Proc(803, 1, OTHER, "sleeping", "holds nothing"),
        keep={801},
    )
    assert found == type(found)()


# Every shape of the scan's tests in one node, with the kernel threads and services of a real one.
NODE = (
    Proc(1, 0, 0, "sleeping", "init"),
    Proc(2, 0, 0, "sleeping", "kthreadd"),
    *(Proc(pid, 2, 0, "idle", f"kworker/{pid}") for pid in range(3, 40)),
    Proc(41, 1, 0, "sleeping", "sshd"),
    Proc(42, 41, UID, "sleeping", "bash"),
    Proc(ME, 42, UID, "sleeping", "python -m agent"),
    Proc(200, ME, UID, "sleeping", "python rank.py", MARK, DEV),
    Proc(201, 200, UID, "sleeping", "worker", MARK),
    Proc(400, 1, UID, "sleeping", "escaped", MARK, DEV),  # orphaned to init, with its children
    Proc(401, 400, UID, "sleeping", "escaped's child", MARK),
    Proc(402, 401, UID, "sleeping", "its child", MARK, DEV),
    Proc(403, 400, UID, "sleeping", "unmarked child"),
    Proc(500, 1, UID, "sleeping", "python -m agent"),  # another agent of the job
    Proc(501, 500, UID, "sleeping", "python rank.py", MARK, DEV),
    Proc(502, 501, UID, "sleeping", "worker", MARK),
    Proc(600, 1, UID, "sleeping", "other job", "7.0", DEV),
    Proc(601, 42, UID, "sleeping", "marked under the shell", MARK),
    Proc(700, 1, OTHER, "sleeping", "foreign", MARK, DEV),
    Proc(802, 1, 0, "sleeping", "nvidia-persistenced", devices=DEV),
)


@pytest.mark.parametrize("reader", ["root", "user"])
def test_markers_are_read_only_where_the_scan_needs_them_and_it_finds_the_same(reader):
    """A node shows a thousand processes, most of them kernel threads; root's agent read every
    env (up to 1 MB each) after every attempt: at 2,048 simulated agents half their teardown."""
    own = (lambda uid: True) if reader == "root" else (lambda uid: uid == UID)
    table = {p.pid: p for p in NODE}
    asked: list[int] = []

    def read(pid: int) -> str | None:
        asked.append(pid)
        return table[pid].marker

    bare = [replace(p, marker=None) for p in NODE]
    markers = markers_needed(bare, ME, own, read)
    lazy = [replace(p, marker=markers.get(p.pid)) for p in bare]
    eager = [p if own(p.uid) else replace(p, marker=None) for p in NODE]
    assert scanned(*lazy) == scanned(*eager)
    assert [h.pid for h in scanned(*lazy).ours] == [200, 201, 400, 401, 402]
    assert len(asked) == len(set(asked))  # each env read once
    # init's children (and their marked subtrees), and device holders outside the descent
    expected = {400, 401, 402, 403, 500, 501, 600}
    if reader == "root":
        expected |= {1, 2, 41, 700, 802}
    assert set(asked) == expected


def test_the_reason_names_a_d_state_holder_first_else_the_user():
    stuck = Holder(9, "python", "disk-sleep", DEV, "alice", True)
    foreign = Holder(3, "sim", "sleeping", DEV, "nobody", False)
    quiet = Holder(4, "no gpu", "disk-sleep", (), "alice", True)
    assert Leftovers("n1", stays=(foreign, stuck)).reason() == (
        "GPUs still held by pid 9 (D state) and 1 more"
    )
    assert Leftovers("n1", stays=(foreign,)).reason() == "GPUs still held by pid 3 (user nobody)"
    # a process that stays without holding a GPU is reported, but the node is usable
    assert not Leftovers("n1", stays=(quiet,)).unusable
    assert "D state" in stuck.line() and "/dev/nvidia0" in stuck.line()


def test_a_report_round_trips_through_json_and_odd_input_is_bounded():
    left = Leftovers("n1", (Holder(5, "a", "sleeping", DEV, "alice", True),), (), 0.01)
    assert Leftovers.from_json(left.to_json()) == left
    odd = Leftovers.from_json({"host": 3, "stays": [{"pid": True, "devices": ["x"] * 99}, 7]})
    assert odd.stays[0].pid == -1 and len(odd.stays[0].devices) == 20


# --- real processes ----------------------------------------------------------------------------


@pytest.fixture
def devices():
    """A device root another user can read (pytest's tmp_path is private to root)."""
    where = Path(tempfile.mkdtemp(prefix="devroot-"))
    where.chmod(0o755)
    for name in ("nvidia0", "nvidiactl"):
        (where / name).write_text("")
        (where / name).chmod(0o644)
    yield where
    shutil.rmtree(where, ignore_errors=True)


HOLD = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
fds = [os.open(p, os.O_RDONLY) for p in sys.argv[1:]]
print("holding", flush=True)
while True:
    time.sleep(60)
"""


def python(user: int | None) -> str:
    """Another user cannot run the venv's interpreter (under /work, private): the system's."""
    return sys.executable if user is None else "/usr/bin/python3"


def hold(*paths: Path, user: int | None = None) -> subprocess.Popen:
    """A process that ignores SIGTERM and holds `paths` open; returns once they are open."""
    proc = subprocess.Popen(
        [python(user), "-c", HOLD, *map(str, paths)],
        stdout=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=(lambda: os.setuid(user)) if user is not None else None,
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"holding\n"
    return proc


def end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_the_snapshot_reads_which_device_files_a_process_holds(devices):
    proc = hold(devices / "nvidia0", devices / "nvidiactl")
    try:
        mine = {p.pid: p for p in snapshot(str(devices))}[proc.pid]
    finally:
        end(proc)
    # nvidiactl names no GPU; the GPU's file is named with its full path
    assert mine.devices == (str(devices / "nvidia0"),)
    assert mine.ppid == os.getpid() and mine.uid == os.geteuid()
    assert mine.command.startswith(sys.executable) and mine.status == "sleeping"


def test_the_jobs_own_holder_is_ended_and_named(devices):
    proc = hold(devices / "nvidia0")  # our child: ignores SIGTERM, so it takes the SIGKILL
    try:
        left = LeftoverAudit("n0", None, str(devices)).run(grace=0.2)
        gone = not psutil.pid_exists(proc.pid)  # the audit reaped it (psutil waits for a child)
    finally:
        end(proc)
    assert [(h.pid, h.devices, h.ours) for h in left.killed] == [
        (proc.pid, (str(devices / "nvidia0"),), True)
    ]
    assert gone and left.stays == () and not left.unusable


@root_only
def test_another_users_holder_is_named_and_let_be(devices):
    proc = hold(devices / "nvidia0", user=OTHER)
    try:
        left = LeftoverAudit("n0", None, str(devices)).run(grace=0.2)
        assert proc.poll() is None, "another user's process was signalled"
    finally:
        end(proc)
    assert left.killed == ()
    assert [(h.pid, h.user, h.ours) for h in left.stays] == [(proc.pid, "nobody", False)]
    assert left.reason() == f"GPUs still held by pid {proc.pid} (user nobody)"


VFORK = """
import ctypes, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
libc = ctypes.CDLL(None, use_errno=True)
if libc.vfork() == 0:  # the child shares our memory: it only waits, and is killed
    libc.pause()
    libc._exit(0)
"""


@root_only
def test_a_real_d_state_holder_is_named_as_such_without_a_wait(devices):
    """A vfork parent waits in the kernel (state D) until its child execs or exits."""
    proc = subprocess.Popen(
        [python(OTHER), "-c", VFORK, str(devices / "nvidia0")],
        start_new_session=True,
        preexec_fn=lambda: os.setuid(OTHER),
    )
    parent = psutil.Process(proc.pid)
    try:
        # In D with its vfork child made: a fresh interpreter is in D too while it reads its
        # modules from a cold disk, before it opened the device (the CI flake of 2026-11-26).
        wait_for(
            lambda: bool(parent.children()) and parent.status() == psutil.STATUS_DISK_SLEEP,
            10,
            "the vfork parent in D",
        )
        begin = time.monotonic()
        left = LeftoverAudit("n0", None, str(devices)).run(grace=0.2)
        took = time.monotonic() - begin
    finally:
        for child in parent.children():
            child.kill()
        end(proc)
    stuck = next(h for h in left.stays if h.pid == proc.pid)
    assert stuck.status == psutil.STATUS_DISK_SLEEP and not stuck.ours
    assert left.reason().startswith(f"GPUs still held by pid {proc.pid} (D state)")
    assert took < 2.0, took  # nothing of another user's is waited for


def test_a_process_of_ours_that_will_not_die_is_waited_for_a_bounded_time(devices):
    """Signals that do not end it (as for a process stuck in D state): the audit gives up
    after its bound and reports it as staying, state and all."""
    proc = hold(devices / "nvidia0")
    stuck = LeftoverAudit("n0", None, str(devices), signal=lambda p, signum: None)
    try:
        begin = time.monotonic()
        left = stuck.run(grace=0.2)
        took = time.monotonic() - begin
        assert proc.poll() is None
    finally:
        end(proc)
    assert left.killed == () and [h.pid for h in left.stays] == [proc.pid]
    assert left.stays[0].ours and left.unusable
    assert took < 2 * 0.2 + KILL_WAIT + 1.0, took


def test_d_state_of_our_own_through_the_typed_snapshot():
    """Our own holder stuck in D state (SIGKILL pending until the kernel lets go), fed as a
    typed snapshot: it stays, named, and the audit's bound holds."""
    me = os.getpid()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    shot = [
        Proc(me, 1, os.geteuid(), "sleeping"),
        Proc(sleeper.pid, me, os.geteuid(), "disk-sleep", "python", None, DEV),
    ]
    audit = LeftoverAudit("n0", None, "/nowhere", snap=lambda root: shot, signal=lambda p, s: None)
    try:
        begin = time.monotonic()
        left = audit.run(grace=0.1)
        took = time.monotonic() - begin
    finally:
        end(sleeper)
    assert left.reason() == f"GPUs still held by pid {sleeper.pid} (D state)"
    assert took < 2 * 0.1 + KILL_WAIT + 1.0


def test_still_held_keeps_only_the_holders_that_remain(devices):
    first = hold(devices / "nvidia0", user=OTHER if os.geteuid() == 0 else None)
    audit = LeftoverAudit("n0", None, str(devices), signal=lambda p, signum: None)
    try:
        left = audit.run(grace=0.1)
        assert left.unusable
        assert audit.still_held(left).unusable
        end(first)
        assert not audit.still_held(left).unusable
    finally:
        end(first)


def test_a_node_without_leftovers_costs_little(devices):
    audit = LeftoverAudit("n0", "no-such-job", str(devices))
    audit.run(grace=1.0)  # warm: the first look imports pwd, tries pynvml
    begin = time.monotonic()
    left = audit.run(grace=1.0)
    took = time.monotonic() - begin
    assert left == Leftovers("n0", seconds=left.seconds)
    assert took < 0.5, took  # measured ~20 ms here (scripts/bench/leftovers.py); slack for CI


def test_nvml_is_looked_for_once_per_process_not_at_every_attempts_end():
    """Without pynvml, every audit asked the import system again, under its lock: thousands of
    agents' threads (the scale bench) queued there at the attempt's end."""
    code = (
        "import sys\n"
        "asked = []\n"
        "class Counting:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'pynvml':\n"
        "            asked.append(name)\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Counting())\n"
        "from agent.run.leftovers import nvml_holders\n"
        "print([dict(nvml_holders()) for _ in range(3)], len(asked))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "[{}, {}, {}] 1\n"), done.stderr
