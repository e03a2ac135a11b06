"""The agent's log lines, made safe for a terminal (agent.text.printable): kept apart from text.py
so that the clients, which print and never log, start without importing logging."""

from __future__ import annotations

import logging

from agent.text import printable


class PrintableFormatter(logging.Formatter):
    """A log formatter whose output never carries a control sequence to the terminal."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))
