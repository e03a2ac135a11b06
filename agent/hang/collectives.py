"""Which collective, and who never came: every rank's flight recorder collated (pure).

Per process group (torch names them alike on every rank: "0" the world, then in creation order),
the last collective each member entered and completed. Where some members wait in collective #N
that others have not entered, one line names the waiting ranks, the collective and its shape,
and for the ranks behind: the last one they entered and where they are instead — waiting in
another group (a deadlock by order), in their own code (their stack's place), exited, or not
answering. Members that entered #N with another operation or shape are named too (a desync),
and ranks that never initialised torch.distributed while others did.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from agent.hang.collate import Group, places
from agent.hang.recorder import GroupState, RankRecorder
from agent.hang.stacks import RankStack
from agent.plan.rank_set import format_ranges


def _who(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranges(ranks)}"


def _order(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 62, name)


def collective_view(
    stacks: Sequence[RankStack], groups: Sequence[Group], ended: Mapping[int, int] | None = None
) -> list[str]:
    """The findings for `agent stacks`, stacks-a<N>.txt and a hang's root cause, from the
    stacks (with their recorders) and how they group."""
    recorders = {s.rank: s.recorder for s in stacks if s.rank >= 0 and s.recorder is not None}
    return findings(recorders, places(groups), ended)


def render_view(lines: Sequence[str]) -> str:
    """The findings as a block above the stacks ("" when there are none)."""
    if not lines:
        return ""
    return (
        "collectives (torch's flight recorder in every rank):\n"
        + "".join(f"  {line}\n" for line in lines)
        + "\n"
    )


def findings(
    recorders: Mapping[int, RankRecorder],  # every live rank's answer
    where: Mapping[int, str] | None = None,  # rank → its stack's place: "load_batch (data.py:88)"
    ended: Mapping[int, int] | None = None,  # ranks that exited → their exit code
) -> list[str]:
    """One line per process group where ranks wait on others, then the desyncs and the ranks
    that never initialised; [] when no rank uses torch.distributed."""
    where, ended = where or {}, ended or {}
    states: dict[str, dict[int, GroupState]] = {}
    for rank, recorder in recorders.items():
        for group in recorder.groups:
            states.setdefault(group.name, {})[rank] = group
    if not states:
        return []
    lines: list[str] = []
    for name in sorted(states, key=_order):
        lines += _group_lines(name, states, recorders, where, ended)
    never = sorted(r for r, rec in recorders.items() if rec.torch and not rec.initialised)
    if never:
        lines.append(f"{_who(never)} never initialised torch.distributed")
    return lines


def _group_lines(
    name: str,
    every: Mapping[str, Mapping[int, GroupState]],
    recorders: Mapping[int, RankRecorder],
    where: Mapping[int, str],
    ended: Mapping[int, int],
) -> list[str]:
    mine = every[name]
    top = max(g.entered for g in mine.values())
    waiting = sorted(r for r, g in mine.items() if g.entered == top and g.completed < top)
    if top == 0 or not waiting:
        return []
    label = next(iter(mine.values())).label()
    # Every member names the same members (torch's group): one list, and who answered for it.
    widest = max(mine.values(), key=lambda g: len(g.ranks))
    members = sorted(set(widest.ranks) | set(mine))
    shapes = {r: mine[r].at(top) for r in waiting}
    known = Counter((c.op, c.shape) for c in shapes.values() if c is not None)
    (op, shape), _ = known.most_common(1)[0] if known else (("a collective", ""), 0)
    same = [r for r in waiting if (c := shapes[r]) is None or (c.op, c.shape) == (op, shape)]
    alike = set(same)
    odd = [r for r in waiting if r not in alike]
    lines = [f"{_who(same)} entered {op} #{top} on {label}" + (f" ({shape})" if shape else "")]
    behind: dict[str, list[int]] = {}
    entered = set(waiting)
    for rank in members:
        if rank in entered:
            continue
        if rank in mine and mine[rank].entered >= top:
            continue  # it completed #top already: not behind
        behind.setdefault(_instead(rank, name, every, recorders, where, ended), []).append(rank)
    for text, ranks in behind.items():
        lines[0] += f"; {_who(ranks)} {text}"
    for rank in odd:
        other = shapes[rank]
        assert other is not None
        lines.append(
            f"{_who([rank])} entered {other.op} #{top} ({other.shape}) where {_who(same)} "
            f"entered {op} #{top} on {label}"
        )
    return lines


def _instead(
    rank: int,
    group: str,
    every: Mapping[str, Mapping[int, GroupState]],
    recorders: Mapping[int, RankRecorder],
    where: Mapping[int, str],
    ended: Mapping[int, int],
) -> str:
    """What a member behind is doing instead of the collective the others wait in."""
    if rank in ended:
        return (
            f"exited {ended[rank]}" if ended[rank] >= 0 else f"was killed by signal {-ended[rank]}"
        )
    recorder = recorders.get(rank)
    if recorder is None or recorder.error is not None:
        return "did not answer" + (f" ({recorder.error})" if recorder and recorder.error else "")
    if not recorder.initialised:
        return "never initialised torch.distributed"
    mine = every[group]
    last = mine[rank].entered if rank in mine else 0
    said = f"last entered #{last}" if last else "has entered none on it"
    for name in sorted(every, key=_order):
        other = every[name].get(rank)
        if name != group and other is not None and other.completed < other.entered:
            pending = other.at(other.entered)
            what = pending.op if pending is not None else "a collective"
            return f"{said} and waits in {what} #{other.entered} on {other.label()}"
    return f"{said} and is in {where[rank]}" if rank in where else said
