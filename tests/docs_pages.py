"""The user documentation as tests read it: README.md and every page under docs/."""

from __future__ import annotations

from pathlib import Path

from cluster import REPO


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def text() -> str:
    """Every page, one after the other: a test that looks for what the docs say finds it on
    whichever page now holds it."""
    return "\n".join(page.read_text() for page in pages())
