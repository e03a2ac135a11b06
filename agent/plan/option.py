"""One option of the agent: its type, default, range and help (the table is option_table)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

DAY = 86400.0


class OptionScope(enum.Enum):
    """Whose value an option is: the node agent's, fixed when it starts, or one run's."""

    RUN = "run"  # one run's: the one-shot command line, `agent run`, the configs
    NODE = "node"  # fixed when a node's agent starts: `agent serve` takes it, a run cannot
    BOTH = "both"  # each its own: `serve --cold` starts no warm interpreter, `run --cold` one run


@dataclass(frozen=True)
class Option:
    name: str  # launcher key; the flag is --name-with-dashes
    kind: type  # int | float | str | bool
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    in_config: bool = True  # False: every node needs it before node 0's configs arrive
    low: float | None = None  # numbers: the smallest value allowed (always finite)...
    high: float | None = None  # ...and the largest
    above: bool = False  # True: the value must be more than `low`, not equal to it
    scope: OptionScope = OptionScope.RUN  # a NODE option never comes from a config (in_config)

    def range_text(self) -> str:
        """`from 0 to 86400`, `more than 0, at most 604800`: for error messages."""
        low, high = number_text(self.low), number_text(self.high)
        return f"more than {low}, at most {high}" if self.above else f"from {low} to {high}"


def number_text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and value.bit_length() > 80:  # str() refuses over 4300 digits
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return text if len(text) <= 24 else f"{text[:12]}...({len(text)} digits)"
