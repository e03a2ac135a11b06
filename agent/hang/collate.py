"""Every rank's stacks → groups of identical stacks, `dshbak -c` style, and a one-line headline
for summary.json (pure).

Ranks group when their significant threads (active ones, and the main thread always) hold the
same frames (function, file, line) and were captured the same way; idle threads are folded:
ignored for grouping, counted when printed. The smallest groups, the odd ones out, come first.
A warm rank's outermost frames are the agent's own (agent/warm: zygote_main.py ... script.py
<lambda>, above the user's <module>): folded into one line, and ignored for grouping, so a warm
and a fresh rank at the same place group together.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

import hostlist

from agent.hang.stacks import MAIN_THREAD, PROBE_THREAD, Frame, RankStack, ThreadStack
from agent.plan.rank_set import format_ranges

MAX_RENDER = 200 << 10  # bytes of rendered text
HEADLINE_GROUPS = 4
# Not the user's code: the standard library, installed packages, frozen modules, native code.
_LIBRARY = re.compile(r"/(?:site|dist)-packages/|/lib/python\d[\d.]*t?/|^<frozen |\.so(?:\.\d+)*$")
# Where a library's path starts to say something: torch/autograd/graph.py, threading.py.
_LIBRARY_ROOT = re.compile(r"^.*/(?:site|dist)-packages/|^.*/lib/python\d[\d.]*t?/")
# The agent's frames that start a warm rank's script (the outermost ones of its main thread).
_WARM_START = re.compile(r"(?:^|/)agent/warm/\w+\.py$")
_BOLD, _KEY, _RED, _RESET = "\x1b[1m", "\x1b[33m", "\x1b[31m", "\x1b[0m"


@dataclass(frozen=True)
class Group:
    ranks: tuple[int, ...]  # ascending
    hosts: tuple[str, ...]  # each rank's host, in the order of ranks
    key_frame: Frame | None  # the innermost user frame of the main (or first active) thread
    threads: tuple[ThreadStack, ...]  # the lowest rank's, idle ones included
    method: str
    error: str | None = None  # why these ranks have no stack
    inner_frame: Frame | None = None  # the innermost frame of that thread, library or not


def is_user_frame(frame: Frame) -> bool:
    """A frame of the user's Python code, not of the stdlib, site-packages or a library."""
    return frame.line > 0 and not _LIBRARY.search(frame.file)


def warm_start(frames: Sequence[Frame]) -> int:
    """How many of the outermost frames are the agent starting a warm rank's script."""
    count = 0
    for frame in frames:
        if not _WARM_START.search(frame.file):
            break
        count += 1
    return count


def own_frames(frames: Sequence[Frame]) -> Sequence[Frame]:
    """The frames of the rank's own program: the agent's warm start left out (all of them
    while the warm start is all there is: a rank stuck before its script)."""
    return frames[warm_start(frames) :] or frames


def significant(threads: Sequence[ThreadStack]) -> list[ThreadStack]:
    """Threads that decide a group: active ones and the main thread (all, when none is). The
    agent's probe thread never does: it is active exactly while it answers the agent, so a
    dump that catches it mid-answer would set that rank apart from its peers."""
    chosen = [
        t for t in threads if t.name != PROBE_THREAD and (not t.idle or t.name == MAIN_THREAD)
    ]
    return chosen or list(threads)


def collate(stacks: Sequence[RankStack]) -> list[Group]:
    """Groups of identical stacks, smallest first, ties by lowest rank; ranks without a stack
    group by their error."""
    members: dict[tuple, list[RankStack]] = {}
    for stack in sorted(stacks, key=lambda s: s.rank):
        members.setdefault(_key(stack), []).append(stack)
    groups = [_group(found) for found in members.values()]
    return sorted(groups, key=lambda g: (len(g.ranks), g.ranks[0]))


def render(groups: Sequence[Group], *, colour: bool = False) -> str:
    """The groups as text: a header per group, then its threads, innermost frame last; cut at
    MAX_RENDER bytes with a note."""
    out: list[str] = []
    size = 0
    for shown, group in enumerate(groups):
        lines = _group_lines(group, colour)
        for line in lines:
            size += len(line.encode(errors="replace")) + 1
            if size > MAX_RENDER:
                left = len(groups) - shown
                out.append(f"... cut at {MAX_RENDER >> 10} KiB: {left} group(s) not all shown")
                return "\n".join(out) + "\n"
            out.append(line)
    return "\n".join(out) + ("\n" if out else "")


def headline(groups: Sequence[Group]) -> str:
    """One line: where each group is, smallest groups first, at most HEADLINE_GROUPS of them;
    the innermost frame, and when that is a library's, the innermost user frame that called it
    (`rank 0 in backward (torch/_tensor.py:625) called from step (train.py:88)`)."""
    parts = []
    for group in groups[:HEADLINE_GROUPS]:
        who = _who(group.ranks)
        frame, inner = group.key_frame, group.inner_frame
        if group.error is not None or frame is None:
            why = " ".join((group.error or "no frames").split())
            parts.append(f"{who}: no stack ({why[:100]})")
        elif inner is not None and inner != frame:
            parts.append(f"{who} in {_at(inner)} called from {_at(frame)}")
        else:
            parts.append(f"{who} in {_at(frame)}")
    if len(groups) > HEADLINE_GROUPS:
        parts.append(f"and {len(groups) - HEADLINE_GROUPS} more")
    return "; ".join(parts)


def places(groups: Sequence[Group]) -> dict[int, str]:
    """rank → where its stack says it is (`step (train.py:88)`), as the headline words it."""
    found: dict[int, str] = {}
    for group in groups:
        if group.key_frame is not None and group.error is None:
            for rank in group.ranks:
                found[rank] = _at(group.key_frame)
    return found


def _at(frame: Frame) -> str:
    """`step (train.py:88)`; a library's frame with its path inside the library."""
    if is_user_frame(frame):
        where = os.path.basename(frame.file) or frame.file
    elif frame.file.startswith("<"):
        where = frame.file
    else:
        where = _LIBRARY_ROOT.sub("", frame.file)
        where = os.path.basename(where) if where.startswith("/") else where
    return f"{frame.function} ({where}:{frame.line})"


def _key(stack: RankStack) -> tuple:
    if stack.error is not None or not stack.threads:
        return ("none", stack.error or "no threads")
    frames = sorted(
        tuple((f.function, f.file, f.line) for f in own_frames(t.frames))
        for t in significant(stack.threads)
    )
    return (stack.method, tuple(frames))


def _group(stacks: list[RankStack]) -> Group:
    first = stacks[0]
    failed = first.error is not None or not first.threads
    return Group(
        ranks=tuple(s.rank for s in stacks),
        hosts=tuple(s.host for s in stacks),
        key_frame=None if failed else _key_frame(first.threads),
        threads=first.threads,
        method="none" if failed else first.method,
        error=(first.error or "no threads") if failed else None,
        inner_frame=None if failed else _innermost(_key_frames(first.threads)),
    )


def _key_frames(threads: Sequence[ThreadStack]) -> Sequence[Frame]:
    """The frames of the thread that names a group: the main one, else the first active one."""
    chosen = significant(threads)
    main = [t for t in chosen if t.name == MAIN_THREAD] or [t for t in chosen if not t.idle]
    return own_frames((main or chosen)[0].frames)


def _key_frame(threads: Sequence[ThreadStack]) -> Frame | None:
    frames = _key_frames(threads)
    user = [f for f in frames if is_user_frame(f)]
    return _innermost(user) or _innermost(frames)


def _innermost(frames: Sequence[Frame]) -> Frame | None:
    return frames[-1] if frames else None


def _hostlist(hosts: Sequence[str]) -> str:
    """n[1-2]; hosts hostlist cannot fold (a "," or "[" in a name) are listed as they are."""
    unique = sorted(set(hosts))
    try:
        return hostlist.collect_hostlist(unique) or ",".join(unique)
    except hostlist.BadHostlist:
        return ",".join(unique)


def _who(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(set(ranks)) == 1 else f"ranks {format_ranges(ranks)}"


def _group_lines(group: Group, colour: bool) -> list[str]:
    def paint(text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if colour else text

    hosts = _hostlist(group.hosts)
    count = f"{len(group.ranks)} rank{'s' if len(group.ranks) != 1 else ''} on {hosts}"
    via = "" if group.method.startswith("py-spy") or group.error else f", {group.method}"
    lines = [paint(f"---- {_who(group.ranks)} ({count}{via}) ----", _BOLD)]
    if group.error is not None:
        return [*lines, paint(f"  no stack: {group.error}", _RED)]
    shown = significant(group.threads)
    states = group.method.startswith("py-spy")
    for thread in shown:
        state = (" (idle)" if thread.idle else " (active)") if states else ""
        lines.append(f"Thread {thread.name}{state}")
        folded_start = len(thread.frames) - len(own_frames(thread.frames))
        if folded_start:
            plural = "s" if folded_start != 1 else ""
            lines.append(f"  ({folded_start} frame{plural} of the agent's warm start folded)")
        for frame in thread.frames[folded_start:]:
            text = f"  {frame.file}:{frame.line} in {frame.function}"
            lines.append(paint(text, _KEY) if frame == group.key_frame else text)
    folded = len(group.threads) - len(shown)
    if folded:
        lines.append(f"  ({folded} idle thread{'s' if folded != 1 else ''} folded)")
    return lines
