"""The project's one argparse parser: a usage error is one AgentError line, never a usage dump."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from agent.errors import AgentError


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
