"""Whether a job whose record says "running" still runs, or ended without writing its summary.

Node 0 writes the job's record when the job starts (summary.json `"status": "running"`, the
history row) and completes it at the end. A job whose agents were killed (srun's second Ctrl-C,
`scancel -s KILL`, a node that rebooted) never completes it; every reader asks `state` and says
KILLED_WORDS instead of "running". The record names node 0's agent (`node0`): its process on
its machine, and the endpoint it answers on.

- Read on node 0's own machine (the same host name and boot): the process is there, with the
  start time recorded (a pid used again is another process), or the job was killed.
- From elsewhere: node 0's endpoint accepts a TCP connection within PROBE_SECONDS, or the job
  was killed (nothing listens, or nothing answers: a lost or rebooted node).
"""

from __future__ import annotations

import json
import os
import socket
import stat
from collections.abc import Mapping
from typing import Any

from agent.history.summary_doc import RUNNING, Summary, read_summary
from agent.plan.log_dir import LogDir
from agent.text import printable

KILLED, ENDED = "killed", "ended"
KILLED_WORDS = "ended without a summary (its agents were killed)"
PROBE_SECONDS = 2.0
RECORD_MAX = 16 << 20  # bytes of summary.json read to judge it: a running record is far smaller


def node0_record(host: str, address: str, port: int) -> dict[str, Any]:
    """Node 0's agent, as the job's running record names it (this process, this machine)."""
    pid = os.getpid()
    return {
        "host": host,
        "address": address,
        "port": port,
        "pid": pid,
        "machine": socket.gethostname(),
        "boot": _boot_id(),
        "process_start": _process_start(pid),
    }


def state(summary: Summary | Mapping[str, Any] | None) -> str:
    """ENDED (a summary with its verdict), RUNNING or KILLED, judged from the record of a job
    that is not over yet."""
    doc = summary if isinstance(summary, Summary) else read_summary(summary)
    if not doc.running:
        return ENDED
    return RUNNING if alive(doc.node0) else KILLED


def unfinished(log_dir: str, record: Mapping[str, Any] | None = None) -> tuple[str, str] | None:
    """LOG_DIR's job when its summary.json is still its running record: (RUNNING or KILLED, one
    line that says so, naming the job); None when it has its verdict, or nothing to judge.
    `record`: summary.json as the caller has read it already (not read again)."""
    if record is None:
        record = _record(LogDir(log_dir).summary)
    if record is None or record.get("status") != RUNNING:
        # Only a running record is judged: a verdict's summary is not parsed here (32,768
        # ranks' records: 0.6 s of `agent logs --summary`, which parses them once to show them)
        return None
    summary = read_summary(record)
    judged = state(summary)
    if judged == ENDED:
        return None
    name = _line(summary.job.run_id or log_dir)
    if judged == RUNNING:
        node0 = summary.node0 or {}
        agent = _line(f"pid {node0.get('pid')} on {node0.get('host')}")
        return judged, f"job {name} is running (node 0's agent: {agent})"
    return judged, f"job {name} {KILLED_WORDS}"


def alive(node0: Any) -> bool:
    """Whether node 0's agent of a running record is still there (a record that names none,
    or none that can be asked, is not)."""
    if not isinstance(node0, Mapping):
        return False
    if node0.get("machine") == socket.gethostname():
        boot = _boot_id()
        if boot and node0.get("boot") == boot:
            pid = node0.get("pid")
            if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
                return False
            start = _process_start(pid)
            return start is not None and start == node0.get("process_start")
        if boot and node0.get("boot"):
            return False  # this machine was started again since: its processes are gone
    return answers(node0.get("address"), node0.get("port"))


def answers(address: Any, port: Any, timeout: float = PROBE_SECONDS) -> bool:
    """Whether something accepts a TCP connection at address:port within `timeout`."""
    if not isinstance(address, str) or not address or isinstance(port, bool):
        return False
    if not isinstance(port, int) or not 0 < port < 65536:
        return False
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); None when
    there is no such process, or only its zombie (dead, not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:  # the command name (field 2) may hold spaces and parentheses: split after the last ')'
        fields = data[data.rindex(b")") + 2 :].split()
        return None if fields[0] in (b"Z", b"X") else int(fields[19])
    except (ValueError, IndexError):
        return None


def _record(path: str) -> Mapping[str, Any] | None:
    """summary.json as a map, read bounded from a regular file; None for anything else (not
    there, not readable, too large to be a running record, not JSON)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(RECORD_MAX + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > RECORD_MAX:
        return None
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, Mapping) else None


def _line(value: Any) -> str:
    """A value from a file anyone could write, as one printable line."""
    return printable(str(value)[:300], one_line=True)
