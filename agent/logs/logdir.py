"""A job's log dir on disk: checking it, listing it, reading its JSON files."""

from __future__ import annotations

import json
import os
from typing import Any

from agent.errors import AgentError


def check_dir(log_dir: str) -> None:
    if not os.path.isdir(log_dir):
        what = "is not a directory" if os.path.exists(log_dir) else "does not exist"
        raise AgentError(
            f"log dir {log_dir} {what}: pass the job's --log-dir (default logs/<job-id>)"
        )


def list_names(log_dir: str) -> list[str]:
    """The names in the log dir; none while it does not exist (yet)."""
    try:
        return os.listdir(log_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []


def read_json(path: str) -> Any:
    """The file's JSON, None when it does not exist; ValueError when it is not JSON."""
    try:
        with open(path, "rb") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
