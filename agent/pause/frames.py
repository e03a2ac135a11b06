"""The frames a paused rank and its agent exchange over the unix socket: one JSON object a line.

Rank → agent: {"hello": {"rank", "pid"}}, {"paused": {"file", "line", "function", "reason"}},
{"out": text}, {"ready": prompt} (pdb waits for a line), {"running": true, "done": bool}.
Agent → rank: first {"welcome": true} (pdb may start) or {"refused": why} (the agent holds all
the paused processes it takes: the rank runs on without pdb), then {"line": text}. Anything else
is ignored; a line over MAX_FRAME ends the link.
"""

from __future__ import annotations

import json
from typing import Any, BinaryIO

MAX_FRAME = 1 << 20  # bytes of one line: pdb output of a huge repr is cut, not the link
# Characters of one pdb line a client may send: refused beyond it (agent.pause.paused
# .line_refused), so that it always fits one frame to the rank (even as \uXXXX escapes) and one
# sealed request in the job store; no one types more at a pdb prompt.
MAX_LINE = 64 << 10


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, ensure_ascii=True) + "\n").encode("ascii")


def read(stream: BinaryIO) -> dict[str, Any] | None:
    """The next frame; None at end of stream, or when the peer sends something else."""
    line = stream.readline(MAX_FRAME + 1)
    if not line or len(line) > MAX_FRAME or not line.endswith(b"\n"):
        return None
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None
