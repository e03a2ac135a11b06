"""The project's one argparse parser: a usage error is one AgentError line, never a usage dump."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from agent.errors import AgentError


def version_line() -> str:
    """`launch-agent 0.1.0`, from the installed package's metadata (what pip installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"launch-agent {version('launch-agent')}"
    except PackageNotFoundError:  # imported from a checkout that was never pip-installed
        return "launch-agent (version unknown: not installed; pip install -e . in the checkout)"


class VersionAction(argparse.Action):
    """--version: prints `version_line()` and exits 0; the metadata is read only when asked."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "print the version and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(version_line())
        parser.exit()


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise AgentError (exit 2) as one line:
    `[SUBCOMMAND: ]MESSAGE (see PROG --help)`, e.g. `logs: ... (see python -m agent logs --help)`."""

    def __init__(self, *args: Any, subcommand: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.subcommand = subcommand

    @property
    def flags(self) -> dict[str, bool]:
        """Each option string this parser takes (its groups' too) → whether it takes a value."""
        return {flag: action.nargs != 0 for flag, action in self._option_string_actions.items()}

    def error(self, message: str) -> NoReturn:
        head = f"{self.subcommand}: " if self.subcommand else ""
        raise AgentError(f"{head}{message} (see {self.prog} --help)")
