"""The connection file: where clients of a job find node 0's resident agent.

`agent serve` on node 0 writes <state dir>/serve-<job id>.json (host, port, job, step, pid,
hostname, started) once it listens; `agent run|status|down` read it from the allocation's shell.
The file names no secret (clients prove the job's secret in the handshake, and the agent proves
it back), but it is still private to the user (0600 in a 0700 directory) and written atomically,
so a client never reads half a file. It is read with a size bound and checked field by field:
a stale or damaged file is one line telling the user what to do.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.errors import AgentError, ExitCode
from agent.world.shell import shell_job_id
from agent.world.state_dir import STATE_ENV, dir_problem, state_dir

if TYPE_CHECKING:  # clients read records without importing the world sources
    from agent.world import World

MAX_BYTES = 64 << 10
MAX_JOB_ID = 128
START_HINT = "start them with `srun --ntasks-per-node=1 python -m agent serve &`"
# Field name -> accepted types; bool is refused separately (it is an int to Python).
FIELDS: dict[str, tuple[type, ...]] = {
    "host": (str,),
    "port": (int,),
    "job": (str,),
    "step": (str,),
    "pid": (int,),
    "hostname": (str,),
    "started": (int, float),
}


def path_for(environ: Mapping[str, str], home: Path, job_id: str) -> Path:
    directory = state_dir(environ, home)
    problem = dir_problem(directory)
    if problem:
        raise AgentError(problem, ExitCode.USAGE)
    return directory / f"serve-{_checked_job_id(job_id)}.json"


def record_for(world: World, port: int, run: int | None = None) -> dict[str, Any]:
    """The one connection record: where node 0's endpoint listens, for whom, since when (a
    run's control.json also names its run, so `agent stacks LOG_DIR` never asks a later one)."""
    record: dict[str, Any] = {
        "host": world.master_addr,
        "port": port,
        "job": world.job_id or "",
        "step": world.step_id or "",
        "pid": os.getpid(),
        "hostname": world.host,
        "started": time.time(),
    }
    if run is not None:
        record["run"] = run
    return record


def write(path: Path, record: Mapping[str, Any]) -> None:
    """Atomically (a temporary file in the same directory, then rename), 0600, in a directory
    created 0700 when missing. AgentError (2) when the record is incomplete or too big, or the
    directory is not writable."""
    import secrets  # here: the clients only read this file, and start without it

    problem = _problem(record)
    if problem:
        raise AgentError(f"cannot write the connection file {path}: {problem}")
    data = json.dumps(dict(record), sort_keys=True, indent=1).encode() + b"\n"
    if len(data) > MAX_BYTES:
        raise AgentError(f"cannot write the connection file {path}: over {MAX_BYTES} bytes")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), 0o600)  # whatever the umask
            out.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise AgentError(
            f"cannot write the connection file {path}: {exc.strerror or exc}; "
            f"set {STATE_ENV} to a writable directory"
        ) from None


def read(path: Path) -> dict[str, Any]:
    """The record in `path`, checked; AgentError (3) naming the path for anything else."""
    try:
        with open(path, "rb") as src:
            data = src.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise AgentError(f"{path} does not exist; {START_HINT}", ExitCode.RENDEZVOUS) from None
    except OSError as exc:
        raise _damaged(path, f"cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise _damaged(path, f"it is over {MAX_BYTES} bytes")
    try:
        record = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        raise _damaged(path, "it is not JSON") from None
    problem = _problem(record)
    if problem:
        raise _damaged(path, problem)
    return record


def find(environ: Mapping[str, str], home: Path, explicit: str | None) -> Path:
    """--serve FILE if given, else the file of this allocation's job (SLURM_JOB_ID, else
    AGENT_JOB_ID), else (no job id) the only connection file in the state dir; AgentError when
    there are several (2) or none (3)."""
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise AgentError(
                f"--serve {explicit}: {path} is not a file; pass the serve-<job>.json "
                f"the resident agents wrote (in {state_dir(environ, home)}), or {START_HINT}",
                ExitCode.RENDEZVOUS,
            )
        return path
    job_id = shell_job_id(environ)
    if not job_id:
        directory = state_dir(environ, home)
        problem = dir_problem(directory)  # as with a job id: another user could plant the file
        if problem:
            raise AgentError(problem, ExitCode.USAGE)
        path = _the_only_file(directory)
    else:
        path = path_for(environ, home, job_id)
        if not path.is_file():
            raise AgentError(
                f"no resident agents for job {job_id}: {path} does not exist; {START_HINT}",
                ExitCode.RENDEZVOUS,
            )
    problem = file_problem(path)
    if problem:
        raise AgentError(problem, ExitCode.USAGE)
    return path


def file_problem(path: Path, uid: int | None = None) -> str:
    """Why a connection file found in the state dir must not be used ('' if it may): another
    user's, or writable by others (it would send this user's secret proof elsewhere)."""
    uid = os.getuid() if uid is None else uid
    try:
        st = os.stat(path)
    except OSError:
        return ""  # read() says what is wrong with a file that went away
    if st.st_uid != uid:
        return (
            f"the connection file {path} belongs to uid {st.st_uid}, not to you (uid {uid}): "
            "someone else may have planted it; remove it, or pass --serve FILE"
        )
    if st.st_mode & 0o022:
        return (
            f"the connection file {path} is writable by others (mode {st.st_mode & 0o7777:o}): "
            "remove it and start the resident agents again, or pass --serve FILE"
        )
    return ""


def files_in(directory: Path) -> list[Path]:
    """The connection files in a state dir, sorted (none when it cannot be listed)."""
    try:
        return sorted(p for p in directory.glob("serve-*.json") if p.is_file())
    except OSError:
        return []


def client_command(environ: Mapping[str, str], home: Path, path: Path) -> str:
    """The client command line that finds `path` from a shell like the one `serve` started in
    (what `serve` tells the user): the job id's file inside the allocation, the only file of the
    state dir without one, else `--serve PATH`."""
    given = environ.get(STATE_ENV)
    base = f"{STATE_ENV}={given} " if given else ""
    base += "python -m agent run|status|down"
    job_id = shell_job_id(environ)
    if job_id and path.name == f"serve-{job_id}.json":
        return f"`{base}` (inside this allocation; elsewhere add `--serve {path}`)"
    if job_id or files_in(path.parent) != [path]:
        return f"`python -m agent run|status|down --serve {path}`"
    return f"`{base}`"


def _the_only_file(directory: Path) -> Path:
    """No job id: the one connection file of this user's state dir; AgentError (3) when there
    is none, (2) naming them when there are several."""
    found = files_in(directory)
    if len(found) == 1:
        return found[0]
    if not found:
        raise AgentError(
            f"no resident agents: no job id (SLURM_JOB_ID) and no serve-*.json in {directory}; "
            "start them with `python -m agent serve &` (in an allocation: "
            "`srun --ntasks-per-node=1 python -m agent serve &`)",
            ExitCode.RENDEZVOUS,
        )
    names = ", ".join(p.name for p in found)
    raise AgentError(
        f"no job id (SLURM_JOB_ID) and {len(found)} resident agents' connection files in "
        f"{directory} ({names}): pass --serve FILE"
    )


def remove(path: Path, pid: int) -> None:
    """Delete the file if it still names `pid`: a newer `agent serve` may have replaced it, and
    its file must survive the old agent's exit. Never raises (this runs while shutting down)."""
    try:
        with open(path, "rb") as src:
            named = json.loads(src.read(MAX_BYTES + 1)).get("pid")
            inode = os.fstat(src.fileno()).st_ino
        # The same inode still at the path: not replaced between our read and the unlink.
        if named == pid and os.stat(path).st_ino == inode:
            os.unlink(path)
    except (OSError, ValueError, AttributeError):
        pass  # gone already, or not ours to judge: leave it


def _checked_job_id(job_id: str) -> str:
    """The job id as a file-name part; AgentError (2) for one that could leave the directory."""
    checks = (
        (not job_id, "it is empty"),
        (len(job_id) > MAX_JOB_ID, f"it is over {MAX_JOB_ID} characters"),
        ("/" in job_id or "\\" in job_id or ".." in job_id, "it contains '/', '\\' or '..'"),
        (any(ord(ch) < 32 or ord(ch) == 127 for ch in job_id), "it contains control characters"),
    )
    for failed, why in checks:
        if failed:
            raise AgentError(
                f"job id {job_id[:40]!r} cannot name a connection file: {why}; "
                "use the allocation's SLURM_JOB_ID, or pass --serve FILE"
            )
    return job_id


def _damaged(path: Path, problem: str) -> AgentError:
    return AgentError(
        f"the connection file {path} is unusable ({problem}); remove it and start the resident "
        "agents again (`srun --ntasks-per-node=1 python -m agent serve &`)",
        ExitCode.RENDEZVOUS,
    )


def _problem(record: object) -> str:
    """What is wrong with a connection record, or ''."""
    if not isinstance(record, Mapping):
        return "it is not a JSON object"
    for name, types in FIELDS.items():
        value = record.get(name)
        if value is None:
            return f"{name} is missing"
        if isinstance(value, bool) or not isinstance(value, types):
            return f"{name} is not {' or '.join(t.__name__ for t in types)}"
    if not 1 <= record["port"] <= 65535:
        return f"port {record['port']} is out of range 1..65535"
    if not record["host"]:
        return "host is empty"
    if not resolvable(record["host"]):
        return f"host {record['host'][:80]!r} is not a host name or an address"
    return ""


def resolvable(host: str) -> bool:
    """Whether the resolver can be asked for `host` at all: socket encodes a name with IDNA,
    and a label over 63 characters or a lone surrogate raises UnicodeError there."""
    try:
        host.encode("idna")
    except UnicodeError:
        return False
    return True
