"""The job's shared secret: AGENT_SECRET, else a per-user 0600 file (agent.node.trust uses it)."""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path

from agent.errors import AgentError

SECRET_ENV = "AGENT_SECRET"
SECRET_RELPATH = Path(".config") / "launch-agent" / "secret"
_MAC_RE = re.compile(r"[0-9a-f]{64}")
_SAME_SECRET_HINT = (
    f"every node must share the same {SECRET_ENV} (or the same ~/{SECRET_RELPATH}); "
    "the sbatch script from `python -m bootstrap` exports one"
)


def load_secret(env: Mapping[str, str], home: Path) -> bytes:
    """AGENT_SECRET if set and non-empty, else the per-user 0600 secret file (created if absent)."""
    if env.get(SECRET_ENV):
        return env[SECRET_ENV].encode("utf-8")
    path = home / SECRET_RELPATH
    if not path.exists():
        try:
            _create_secret(path)
        except OSError as exc:
            raise AgentError(
                f"cannot create the secret file {path}: {exc.strerror}; "
                f"set {SECRET_ENV} instead, or make {path.parent} writable"
            ) from None
    return _read_secret(path)


def _create_secret(path: Path) -> None:
    import secrets  # here: the clients only read this file, and start without it

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32) + "\n")
            out.flush()
            os.fsync(out.fileno())
        _publish(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _publish(tmp: Path, path: Path) -> None:
    # link(), unlike rename(), never replaces: agents on several nodes sharing one home race
    # here, and the losers must read the winner's secret rather than overwrite it.
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    except OSError:  # a filesystem without hard links: rename, accepting the small race
        if not path.exists():
            os.replace(tmp, path)


def _read_secret(path: Path) -> bytes:
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        secret = path.read_bytes().strip()
    except OSError as exc:
        raise AgentError(
            f"secret file {path} cannot be read: {exc.strerror}; fix or delete it"
        ) from None
    if mode & 0o077:
        raise AgentError(
            f"secret file {path} is readable by group or others (mode {mode:04o}); "
            f"run: chmod 600 {path}"
        )
    if not secret:
        raise AgentError(f"secret file {path} is empty; delete it and a new one is created")
    return secret
