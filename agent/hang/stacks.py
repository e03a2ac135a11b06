"""What a hang dump holds: each rank's threads and their frames (pure, bounded, JSON both ways).

A record crosses nodes, so `RankStack.from_json` trusts nothing: wrong types raise ValueError,
sizes are cut to MAX_THREADS threads of MAX_FRAMES frames and strings to MAX_TEXT characters.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from agent.hang.recorder import RankRecorder

MAX_THREADS = 64
MAX_FRAMES = 256  # the innermost ones are kept
MAX_TEXT = 512
MAIN_THREAD = "MainThread"  # threading's name for it; faulthandler dumps get it too
# The thread the agent's probe (hang/probe/sitecustomize.py) runs in every rank: the agent's own,
# busy only while it answers the agent, so never a reason to tell ranks apart.
PROBE_THREAD = "agent-probe"
METHODS = ("py-spy", "py-spy --native", "faulthandler", "none")


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int  # 0: unknown (a native frame, or faulthandler's "???")


@dataclass(frozen=True)
class ThreadStack:
    name: str
    idle: bool  # py-spy's "not active" (waiting in a syscall); faulthandler cannot tell: False
    frames: tuple[Frame, ...]  # innermost LAST


@dataclass(frozen=True)
class RankStack:
    rank: int
    host: str
    pid: int
    method: str  # one of METHODS; "none" when nothing could be captured
    threads: tuple[ThreadStack, ...]  # the main thread first where it is known
    error: str | None = None  # why nothing could be captured (one line)
    recorder: RankRecorder | None = None  # its flight recorder (agent.hang.recorder), if asked

    def to_json(self) -> dict[str, Any]:
        return {
            "recorder": None if self.recorder is None else self.recorder.to_json(),
            "rank": self.rank,
            "host": self.host,
            "pid": self.pid,
            "method": self.method,
            "error": self.error,
            "threads": [
                {
                    "name": t.name,
                    "idle": t.idle,
                    "frames": [[f.function, f.file, f.line] for f in t.frames],
                }
                for t in self.threads
            ],
        }

    @classmethod
    def from_json(cls, data: object) -> RankStack:
        """The record another node sent; ValueError when it is not one."""
        if not isinstance(data, dict):
            raise ValueError("stack record is not an object")
        error = data.get("error")
        if error is not None and not isinstance(error, str):
            raise ValueError("stack record: error is not a string")
        threads = data.get("threads", [])
        if not isinstance(threads, list):
            raise ValueError("stack record: threads is not a list")
        method = _text(data.get("method"), "method")
        recorder = data.get("recorder")
        return rank_stack(
            _int(data.get("rank"), "rank"),
            _text(data.get("host"), "host"),
            _int(data.get("pid"), "pid"),
            method if method in METHODS else "none",
            [_thread(item) for item in threads[:MAX_THREADS]],
            error,
            None if recorder is None else RankRecorder.from_json(recorder),
        )


def one_line(text: str) -> str:
    """A message as one bounded line."""
    return " ".join(text.split())[:MAX_TEXT]


def thread_stack(name: str, idle: bool, frames: Iterable[Frame]) -> ThreadStack:
    """A thread cut to the bounds: its innermost MAX_FRAMES frames, strings to MAX_TEXT."""
    kept = tuple(frames)[-MAX_FRAMES:]
    return ThreadStack(name[:MAX_TEXT], idle, tuple(_bounded(f) for f in kept))


def _bounded(frame: Frame) -> Frame:
    if len(frame.function) <= MAX_TEXT and len(frame.file) <= MAX_TEXT:
        return frame  # frozen: the same object will do
    return Frame(frame.function[:MAX_TEXT], frame.file[:MAX_TEXT], frame.line)


def rank_stack(
    rank: int,
    host: str,
    pid: int,
    method: str,
    threads: Iterable[ThreadStack],
    error: str | None = None,
    recorder: RankRecorder | None = None,
) -> RankStack:
    """A rank's record cut to the bounds (threads beyond MAX_THREADS are dropped)."""
    kept = tuple(threads)[:MAX_THREADS]
    why = None if error is None else one_line(error)
    return RankStack(rank, host[:MAX_TEXT], pid, method, kept, why, recorder)


def failed(rank: int, host: str, pid: int, error: str) -> RankStack:
    """A rank nothing could be captured from, and why."""
    return rank_stack(rank, host, pid, "none", (), error or "unknown error")


def _thread(item: object) -> ThreadStack:
    if not isinstance(item, dict):
        raise ValueError("stack record: a thread is not an object")
    frames = item.get("frames", [])
    if not isinstance(frames, list):
        raise ValueError("stack record: frames is not a list")
    idle = item.get("idle", False)
    if not isinstance(idle, bool):
        raise ValueError("stack record: idle is not a boolean")
    return thread_stack(
        _text(item.get("name"), "thread name"), idle, [_frame(f) for f in frames[-MAX_FRAMES:]]
    )


# Frames already made from JSON, by (function, file, line): the ranks of a job share most of
# theirs, so 32K ranks' stacks hold each distinct frame once (and compare by identity first).
_FRAMES: dict[tuple[str, str, int], Frame] = {}
_FRAMES_KEPT = 1 << 16


def _frame(item: object) -> Frame:
    if not isinstance(item, list) or len(item) != 3:
        raise ValueError("stack record: a frame is not [function, file, line]")
    key = (_text(item[0], "function"), _text(item[1], "file"), _int(item[2], "line"))
    found = _FRAMES.get(key)
    if found is None:
        if len(_FRAMES) >= _FRAMES_KEPT:
            _FRAMES.clear()
        found = _FRAMES[key] = Frame(*key)
    return found


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"stack record: {what} is not a string")
    return value[:MAX_TEXT]


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**63:
        raise ValueError(f"stack record: {what} is not an integer")
    return value
