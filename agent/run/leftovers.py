"""What still holds this node's accelerators once its ranks are gone, after every attempt.

The job's own leftovers — processes descending from the agent (a child subreaper: escaped
ranks' children come back to it) or carrying the job's marker (LAUNCH_AGENT_JOB) and orphaned
to init — are ended: a grace to exit by themselves, SIGTERM, a grace, SIGKILL, a bounded wait.
Any other process holding an NVIDIA device file (`/dev/nvidia<N>`) or, where NVML answers, a
compute context is named, never signalled: another user's, or another job's. What stays is
reported (pid, command, state — D state named —, devices, user); a node whose GPUs stay held is
unusable, and node 0 excludes it at the next lineup like a node that failed its health check.

The scan (`scan`) is pure over typed snapshots (`Proc`); `snapshot` is the one function that
reads /proc (bounded: a pid that cannot be read is skipped; reading a D-state process's /proc is
fine), and `LeftoverAudit` signals and waits, every wait bounded.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import re
import signal as signals
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import psutil

MARKER = "LAUNCH_AGENT_JOB"  # the job's marker in every rank's env (agent.plan.ranks)
# A test seam: where the agent looks for NVIDIA device files (default /dev), so tests hold
# files of their own; one per simulated node, hence an env var rather than a (node 0) option.
DEVICE_ROOT_ENV = "LAUNCH_AGENT_DEVICE_ROOT"
DEVICE_NAME = re.compile(r"nvidia\d+")  # one GPU's file; nvidiactl/nvidia-uvm name none
# The driver's own daemons hold every GPU's file all the time: never a job's leftover.
SYSTEM_HOLDERS = frozenset({"nvidia-persistenced", "nv-hostengine", "dcgm-exporter", "dcgmi"})
KILL_WAIT = 2.0  # seconds after SIGKILL: a process still there is stuck in the kernel (D state)
COMMAND_CAP = 200  # characters of a command line kept in a report
REPORT_CAP = 50  # holders kept per node in a report
_STATES = {
    "R": psutil.STATUS_RUNNING,
    "S": psutil.STATUS_SLEEPING,
    "D": psutil.STATUS_DISK_SLEEP,
    "Z": psutil.STATUS_ZOMBIE,
    "T": psutil.STATUS_STOPPED,
    "t": psutil.STATUS_TRACING_STOP,
    "X": psutil.STATUS_DEAD,
    "I": psutil.STATUS_IDLE,
}


@dataclass(frozen=True)
class Proc:
    """One process as the snapshot saw it."""

    pid: int
    ppid: int
    uid: int
    status: str  # psutil's words: "disk-sleep" is D state
    command: str = ""
    marker: str | None = None  # its LAUNCH_AGENT_JOB (None: none, or its env unreadable)
    devices: tuple[str, ...] = ()  # NVIDIA device files it holds open, or "GPU <bus id>" (NVML)

    @property
    def name(self) -> str:
        return os.path.basename(self.command.split(" ", 1)[0])


@dataclass(frozen=True)
class Holder:
    """A process that still held something of the node after its ranks were gone."""

    pid: int
    command: str
    status: str
    devices: tuple[str, ...]
    user: str
    ours: bool  # the job's own (its marker or the agent's descent): the agent may end it

    @property
    def stuck(self) -> bool:
        return self.status == psutil.STATUS_DISK_SLEEP

    def line(self) -> str:
        """`pid 412 (D state, user bob) holds nvidia0: python train.py`"""
        state = "D state, " if self.stuck else ""
        holds = f" holds {', '.join(self.devices)}" if self.devices else ""
        return f"pid {self.pid} ({state}user {self.user}){holds}: {self.command or '?'}"

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "command": self.command,
            "state": self.status,
            "devices": list(self.devices),
            "user": self.user,
            "ours": self.ours,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Holder:
        pid = data.get("pid")
        return cls(
            pid if isinstance(pid, int) and not isinstance(pid, bool) else -1,
            str(data.get("command") or "")[:COMMAND_CAP],
            str(data.get("state") or "")[:40],
            tuple(str(d)[:200] for d in (data.get("devices") or ())[:20]),
            str(data.get("user") or "")[:64],
            bool(data.get("ours")),
        )


@dataclass(frozen=True)
class Scan:
    """The pure scan's answer: what is the job's to end, and what holds a GPU but is not."""

    ours: tuple[Holder, ...] = ()
    foreign: tuple[Holder, ...] = ()


@dataclass(frozen=True)
class Leftovers:
    """One node's audit after an attempt: what it ended, and what stays."""

    host: str
    killed: tuple[Holder, ...] = ()
    stays: tuple[Holder, ...] = ()
    seconds: float = 0.0

    @property
    def blocking(self) -> tuple[Holder, ...]:
        """What stays holding a GPU: the node cannot be trusted with the next attempt."""
        return tuple(h for h in self.stays if h.devices)

    @property
    def unusable(self) -> bool:
        return bool(self.blocking)

    def reason(self) -> str:
        """`GPUs still held by pid 412 (D state)`, or `... (user bob)`: the exclusion's words,
        a stuck process named first (no restart clears it)."""
        held = sorted(self.blocking, key=lambda h: not h.stuck)
        if not held:
            return ""
        first = held[0]
        more = f" and {len(held) - 1} more" if len(held) > 1 else ""
        why = "D state" if first.stuck else f"user {first.user}"
        return f"GPUs still held by pid {first.pid} ({why}){more}"

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "killed": [h.to_json() for h in self.killed[:REPORT_CAP]],
            "stays": [h.to_json() for h in self.stays[:REPORT_CAP]],
            "unusable": self.unusable,
            **({"reason": self.reason()} if self.unusable else {}),
            "s": self.seconds,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Leftovers:
        def holders(key: str) -> tuple[Holder, ...]:
            found = data.get(key) or ()
            return tuple(Holder.from_json(h) for h in found[:REPORT_CAP] if isinstance(h, dict))

        seconds = data.get("s")
        return cls(
            str(data.get("host") or "")[:256],
            holders("killed"),
            holders("stays"),
            float(seconds) if isinstance(seconds, (int, float)) else 0.0,
        )


def scan(
    procs: Iterable[Proc],
    *,
    me: int,
    uid: int,
    marker: str | None,
    keep: Collection[int] = (),
    users: Callable[[int], str] = str,
) -> Scan:
    """Pure: the job's own processes (this agent's descendants but `keep`; carriers of `marker`
    orphaned to init — their agent is gone) and the other holders of a GPU. Never ours: another
    user's process, or one carrying the marker under another live process (the job's ranks of
    another agent on this node: a per-task world, loopback tests — that agent audits them),
    or the driver's own daemons, or the agent's own ancestors (whatever started it: a launcher
    script or notebook holding a GPU was there before the job and stays after it; seen on a
    real GPU node, where it made the node unusable after every attempt)."""
    table = {p.pid: p for p in procs if p.status != psutil.STATUS_ZOMBIE}
    descent = _descendants(table, me)
    launchers = _ancestors(table, me)

    def orphaned(proc: Proc) -> bool:
        """Its nearest ancestor without the marker is init (or gone)."""
        seen = set()
        while proc.marker is not None and proc.marker == marker and proc.pid not in seen:
            seen.add(proc.pid)
            parent = table.get(proc.ppid)
            if parent is None:
                return proc.ppid <= 1
            proc = parent
        return proc.pid == 1

    ours: list[Holder] = []
    foreign: list[Holder] = []
    for proc in table.values():
        if proc.pid == me or proc.pid in keep or proc.pid in launchers:
            continue
        mine = proc.uid == uid and (
            proc.pid in descent or (marker is not None and proc.marker == marker and orphaned(proc))
        )
        if not mine and (not proc.devices or proc.name in SYSTEM_HOLDERS):
            continue
        if not mine and marker is not None and proc.marker == marker and proc.uid == uid:
            continue  # the job's own, under another agent
        holder = Holder(proc.pid, proc.command[:COMMAND_CAP], proc.status, proc.devices,
                        users(proc.uid), mine)  # fmt: skip
        (ours if mine else foreign).append(holder)
    return Scan(tuple(sorted(ours, key=_pid)), tuple(sorted(foreign, key=_pid)))


def _pid(holder: Holder) -> int:
    return holder.pid


def _ancestors(table: Mapping[int, Proc], pid: int) -> set[int]:
    found: set[int] = set()
    proc = table.get(pid)
    while proc is not None and proc.ppid > 1 and proc.ppid not in found:
        found.add(proc.ppid)
        proc = table.get(proc.ppid)
    return found


def _descendants(table: Mapping[int, Proc], root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def snapshot(
    device_root: str = "/dev",
    gpu_holders: Callable[[], Mapping[int, tuple[str, ...]]] = lambda: {},
    marker_of: Callable[[int], bool] = lambda uid: uid == os.geteuid(),
) -> list[Proc]:
    """Every process /proc shows: its parent, owner, state, and the NVIDIA device files under
    `device_root` it holds (psutil's open_files() lists regular files only, so the fd links
    are read). `gpu_holders`: pids with a compute context (NVML) → their GPUs. A marker and a
    command line are read only where the scan needs them (`markers_needed`), and an env only for
    the owners `marker_of` names (another user's cannot be read anyway). A pid that vanishes or
    cannot be read is skipped, or kept with what could be read."""
    root = os.path.realpath(device_root).rstrip("/") + "/"
    contexts = gpu_holders()
    # no NVIDIA device file on this node: nobody can hold one, and the fd walk (most of the
    # audit's cost, on the teardown's path) is skipped
    with_devices = _any_device(root)
    found: list[Proc] = []
    pids: list[int] = []
    with contextlib.suppress(OSError):
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    for pid in pids:
        base = f"/proc/{pid}"
        try:
            with open(f"{base}/stat", "rb") as f:
                stat = f.read()
            uid = os.stat(base).st_uid
        except OSError:
            continue
        # comm may hold spaces and parentheses: the fields follow the last ')'
        fields = stat[stat.rfind(b")") + 2 :].split()
        status = _STATES.get(fields[0].decode(), "?") if fields else "?"
        ppid = int(fields[1]) if len(fields) > 1 else 0
        devices = (_devices(base, root) if with_devices else ()) + contexts.get(pid, ())
        found.append(Proc(pid, ppid, uid, status, devices=devices))
    for pid, gpus in contexts.items():  # a context whose pid /proc does not show (another
        if not any(p.pid == pid for p in found):  # pid namespace): held all the same
            found.append(Proc(pid, 0, -1, "?", "", None, gpus))
    markers = markers_needed(found, os.getpid(), marker_of, lambda pid: _marker(f"/proc/{pid}"))
    named = _descendants({p.pid: p for p in found}, os.getpid())
    named |= {pid for pid, marker in markers.items() if marker is not None}
    return [
        replace(p, command=_command(f"/proc/{p.pid}"), marker=markers.get(p.pid))
        if p.pid in named or p.devices
        else p
        for p in found
    ]


def markers_needed(
    procs: Sequence[Proc],
    me: int,
    marker_of: Callable[[int], bool],
    read: Callable[[int], str | None],
) -> dict[int, str | None]:
    """The markers the scan needs, read through `read` (an env of up to 1 MB each; a node shows
    a thousand processes, most of them kernel threads, and root's agent may read them all):
    the top of every chain orphaned to init (a child of pid 1, or pid 1 and kthreadd) and,
    below a marked one, its children at any depth; and every holder of a device (a marked one
    is another agent's rank). The agent's own descent is its own without one; any other process
    is not the job's whatever it carries (`scan`). pid → marker, None where it has none."""
    children: dict[int, list[Proc]] = {}
    for proc in procs:
        children.setdefault(proc.ppid, []).append(proc)
    descent = _descendants({p.pid: p for p in procs}, me) | {me}
    read_for: dict[int, str | None] = {}
    todo = [p for p in procs if p.ppid <= 1]  # down orphaned chains, through marked ones
    while todo:
        proc = todo.pop()
        if proc.pid in read_for or proc.pid in descent or not marker_of(proc.uid):
            continue
        read_for[proc.pid] = marker = read(proc.pid)
        if marker is not None:
            todo += children.get(proc.pid, ())
    for proc in procs:
        fresh = proc.pid not in read_for and proc.pid not in descent
        if proc.devices and fresh and marker_of(proc.uid):
            read_for[proc.pid] = read(proc.pid)
    return read_for


def _any_device(root: str) -> bool:
    try:
        return any(DEVICE_NAME.fullmatch(name) for name in os.listdir(root))
    except OSError:
        return False


def _devices(base: str, root: str) -> tuple[str, ...]:
    try:  # the links read relative to the open dir: a third less than a path walk each
        where = os.open(f"{base}/fd", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # another user's process (not root), or gone: skipped
        return ()
    held = set()
    try:
        for fd in os.listdir(where):
            try:
                target = os.readlink(fd, dir_fd=where)
            except OSError:
                continue
            if target.startswith(root) and DEVICE_NAME.fullmatch(target[len(root) :]):
                held.add(target)
    except OSError:
        pass
    finally:
        os.close(where)
    return tuple(sorted(held))


def _marker(base: str) -> str | None:
    try:
        with open(f"{base}/environ", "rb") as f:
            env = f.read(1 << 20)
    except OSError:
        return None
    key = MARKER.encode() + b"="
    for entry in env.split(b"\0"):
        if entry.startswith(key):
            return entry[len(key) :].decode(errors="replace")
    return None


def _command(base: str) -> str:
    try:
        with open(f"{base}/cmdline", "rb") as f:
            raw = f.read(COMMAND_CAP * 4)
    except OSError:
        return ""
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")[:COMMAND_CAP]


@functools.cache
def _nvml() -> Any:
    """pynvml, initialised, once per process; None without it or a driver. Asked at every
    attempt's end: a failed import is not cached by Python, and each one takes the import
    lock (an agent's threads, and the scale bench's hundred agents a process, queue on it)."""
    try:
        import pynvml  # optional: launch-agent[nvml]

        pynvml.nvmlInit()
    except Exception:
        return None
    return pynvml


def nvml_holders() -> Mapping[int, tuple[str, ...]]:
    """Pids with a compute context on a GPU, where NVML answers; {} otherwise (no pynvml, no
    driver: skipped silently)."""
    pynvml = _nvml()
    if pynvml is None:
        return {}
    found: dict[int, tuple[str, ...]] = {}
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                bus = pynvml.nvmlDeviceGetPciInfo(handle).busId
                bus = bus.decode() if isinstance(bus, bytes) else str(bus)
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    found[int(p.pid)] = (*found.get(int(p.pid), ()), f"GPU {bus}")
            except pynvml.NVMLError:
                continue
    except Exception:
        return found
    return found


def user_name(uid: int) -> str:
    if uid < 0:
        return "?"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@dataclass
class LeftoverAudit:
    """One node's audit: `run` after each attempt, `still_held` before the next one's lineup.
    The snapshot and the signals go through constructor arguments so tests can feed them."""

    host: str
    marker: str | None
    device_root: str = "/dev"
    snap: Callable[[str], list[Proc]] = field(default=lambda root: snapshot(root, nvml_holders))
    signal: Callable[[psutil.Process, int], None] = lambda proc, signum: proc.send_signal(signum)

    def scan(self, keep: Collection[int] = ()) -> Scan:
        procs = self.snap(self.device_root)
        return scan(procs, me=os.getpid(), uid=os.geteuid(), marker=self.marker, keep=keep,
                    users=user_name)  # fmt: skip

    def run(self, grace: float, keep: Collection[int] = ()) -> Leftovers:
        """End the job's leftovers (those that exit by themselves within `grace` are let be:
        Python's resource_tracker ends when its rank's pipe closes, and ignores SIGTERM),
        then report what stays. At most 2 × grace + KILL_WAIT seconds, whatever stays."""
        begin = time.monotonic()
        found = self.scan(keep)
        procs = _processes(found.ours)
        killed: list[Holder] = []
        if procs:
            _, procs = psutil.wait_procs(procs, timeout=grace)
            self._signal_all(procs, signals.SIGTERM)
            _, alive = psutil.wait_procs(procs, timeout=grace)
            self._signal_all(alive, signals.SIGKILL)
            psutil.wait_procs(alive, timeout=KILL_WAIT)
            signalled = {p.pid for p in procs}
            killed = [h for h in found.ours if h.pid in signalled]
        stays: tuple[Holder, ...] = ()
        if killed or found.foreign:  # look again: what is still there now
            again = self.scan(keep)
            stays = again.ours + again.foreign
            gone = {h.pid for h in stays if h.ours}
            killed = [h for h in killed if h.pid not in gone]
        return Leftovers(self.host, tuple(killed), stays, round(time.monotonic() - begin, 3))

    def still_held(self, last: Leftovers, keep: Collection[int] = ()) -> Leftovers:
        """The last audit's GPU holders that are still there (their pids, holding a GPU)."""
        pids = {h.pid for h in last.blocking}
        found = self.scan(keep)
        stays = tuple(h for h in found.ours + found.foreign if h.pid in pids and h.devices)
        return replace(last, killed=(), stays=stays)

    def _signal_all(self, procs: Sequence[psutil.Process], signum: int) -> None:
        for proc in procs:
            with contextlib.suppress(psutil.Error, OSError):
                self.signal(proc, signum)


def node_audit(host: str, marker: str | None, environ: Mapping[str, str]) -> LeftoverAudit:
    """This node's audit (`marker`: the job's LAUNCH_AGENT_JOB); the device root is read from
    the agent's env, a test seam (DEVICE_ROOT_ENV), /dev otherwise."""
    return LeftoverAudit(host, marker, environ.get(DEVICE_ROOT_ENV) or "/dev")


def _processes(holders: Sequence[Holder]) -> list[psutil.Process]:
    """psutil handles (each checks its pid was not reused before it signals); a pid that
    changed owner since the snapshot (reused) is never ours to signal."""
    found, uid = [], os.geteuid()
    for holder in holders:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(holder.pid)
            if proc.uids().effective == uid:
                found.append(proc)
    return found
