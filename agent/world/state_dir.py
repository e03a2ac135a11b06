"""The per-user state dir: where resident agents leave their connection files and node 0 its
history database. One place decides where it is and whether it may be trusted."""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from pathlib import Path

STATE_ENV = "AGENT_STATE_DIR"
STATE_RELPATH = Path(".cache") / "launch-agent"

__all__ = ["STATE_ENV", "STATE_RELPATH", "dir_problem", "state_dir"]


def state_dir(environ: Mapping[str, str], home: Path) -> Path:
    """AGENT_STATE_DIR if set and non-empty, else ~/.cache/launch-agent."""
    given = environ.get(STATE_ENV)
    return Path(given).expanduser() if given else home / STATE_RELPATH


def dir_problem(directory: Path, uid: int | None = None) -> str:
    """Why a state dir must not be used ('' if it may, or does not exist yet): another user's,
    or writable by others (either could plant a connection file that sends clients elsewhere)."""
    uid = os.getuid() if uid is None else uid
    try:
        st = os.stat(directory)
    except OSError:
        return ""
    me = _user(uid)
    if st.st_uid != uid:
        return (
            f"state dir {directory} belongs to {_user(st.st_uid)}, not to you ({me}): run "
            f"`chown {me} {directory}` (as root or its owner), or set {STATE_ENV} to a "
            "directory of your own"
        )
    if st.st_mode & 0o022:
        return (
            f"state dir {directory} is writable by others (mode {st.st_mode & 0o7777:o}): run "
            f"`chmod go-w {directory}`, or set {STATE_ENV} to a directory of your own"
        )
    return ""


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
