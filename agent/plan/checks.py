"""Checks an agent makes on its own before it waits for anyone: script, log dir (reads only)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from agent.errors import AgentError
from agent.plan.options import Options


def check_script(script: str, options: Options, cwd: str | None = None) -> None:
    """`cwd`: where the ranks start (a client's directory), when not the agent's."""
    if options.module:
        return
    if options.no_python:
        where = os.path.join(cwd, script) if cwd and os.sep in script else script
        if shutil.which(where) is None:
            raise AgentError(
                f"program {script!r} not found or not executable (--no-python); check the path or PATH"
            )
        return
    path = Path(cwd or ".") / script
    if not path.exists():
        raise AgentError(
            f"script {script!r} not found (cwd {cwd or os.getcwd()}); pass the path of your "
            "training script"
        )
    if path.is_dir():
        raise AgentError(
            f"script {script!r} is a directory; pass a .py file, or -m MODULE for a package"
        )
    if not os.access(path, os.R_OK):
        raise AgentError(f"script {script!r} is not readable; fix its permissions (chmod a+r)")


def check_log_dir(path: str) -> None:
    """Fail fast on a log dir we could not create or write, without creating anything yet."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise AgentError(f"log dir {path!r}: {probe!r} is not a directory; pass --log-dir DIR")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise AgentError(
            f"log dir {path!r}: {probe!r} is not writable; pass --log-dir DIR on a writable filesystem"
        )
