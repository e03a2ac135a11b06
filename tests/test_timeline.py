"""`agent logs --timeline`: the picture's layout (pure, table-tested on synthetic summaries) and
its SVG (well-formed XML, escaped, bounded in size at 4,096 nodes)."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET

import pytest

from agent.logs.timeline import MAX_ATTEMPTS, MAX_LANES, RANK_LANES, Timeline, layout
from agent.logs.timeline_svg import svg

SVG = "{http://www.w3.org/2000/svg}"


def rank(r, node, state="succeeded", start=100.0, end=110.0, host=None, attempt=0):
    return {
        "rank": r, "local_rank": 0, "node_rank": node, "host": host or f"n{node}",
        "state": state, "start": start, "end": end, "attempt": attempt,
    }  # fmt: skip


def job(nodes, per_node, attempts, cause=None, code=None):
    return {
        "job": {"id": "42", "step": "0", "nnodes": nodes, "world_size": nodes * per_node},
        "status": "failed" if cause else "succeeded",
        "exit_code": code if code is not None else (1 if cause else 0),
        "root_cause": cause,
        "attempts": attempts,
    }


def world(nodes, per_node, attempt=0, t=100.0, failing=None, hosts=None):
    ranks = []
    for node in range(nodes):
        for local in range(per_node):
            r = node * per_node + local
            state = (
                "failed" if r == failing else "terminated" if failing is not None else "succeeded"
            )
            host = hosts[node] if hosts else None
            ranks.append(rank(r, node, state, t, t + 10 + (r == failing), host, attempt))
    return ranks


def cause_of(r, node, t, how="exit code 3", host=None):
    return {"kind": "rank", "rank": r, "node_rank": node, "host": host or f"n{node}",
            "how": how, "time": t, "stderr_tail": ["Traceback", "ValueError: <bad> & \x1b[31m"]}  # fmt: skip


RESTART = job(
    1, 2,
    [
        {"attempt": 0, "root_cause": cause_of(1, 0, 111.0), "ranks": world(1, 2, 0, 100.0, 1)},
        {"attempt": 1, "root_cause": None, "ranks": world(1, 2, 1, 120.0)},
    ],
)  # fmt: skip
FAILED = job(
    2, 2, [{"attempt": 0, "root_cause": cause_of(3, 1, 111.0), "ranks": world(2, 2, 0, 100.0, 3)}],
    cause=cause_of(3, 1, 111.0),
)  # fmt: skip
SPARE = job(
    3, 1,
    [
        {"attempt": 0, "root_cause": {"kind": "lost", "node_rank": 1, "host": "n1", "how": "gone",
                                      "time": 105.0},
         "ranks": world(2, 40, 0, 100.0, hosts=["n0", "n1"]), "lost_nodes": [1],
         "nodes": [{"node": 0, "host": "n0", "ranks": [0, 39]},
                   {"node": 1, "host": "n1", "ranks": [40, 79]}], "spares": ["n2"]},
        {"attempt": 1, "root_cause": None, "ranks": world(2, 40, 1, 130.0, hosts=["n0", "n2"]),
         "nodes": [{"node": 0, "host": "n0", "ranks": [0, 39]},
                   {"node": 1, "host": "n2", "ranks": [40, 79]}], "spares": []},
    ],
)  # fmt: skip
HUGE = job(
    4096, 8,
    [
        {"attempt": 0, "root_cause": cause_of(4001, 500, 111.0), "ranks": world(4096, 8, 0, 100.0, 4001)},
        {"attempt": 1, "root_cause": None, "ranks": world(4096, 8, 1, 120.0)},
    ],
)  # fmt: skip
EARLY = job(4, 1, [], cause={"kind": "join", "how": "node 3 never arrived", "time": 50.0}, code=3)


@pytest.mark.parametrize(
    "summary, unit, lanes, bands, marks",
    [
        (RESTART, "rank", 2, 2, [("cause", 1)]),
        (FAILED, "rank", 4, 1, [("failure", 3)]),
        (SPARE, "node", 2, 2, [("cause", 1), ("lost", 1), ("spare", 1)]),
        (HUGE, "nodes", MAX_LANES, 2, [("cause", 500 // 32)]),
        (EARLY, "node", 0, 0, [("failure", None)]),
        (job(100, 1, [{"attempt": 0, "ranks": world(100, 1)}]), "node", 100, 1, []),
        (job(64, 1, [{"attempt": 0, "ranks": world(64, 1)}]), "rank", RANK_LANES, 1, []),
    ],
    ids=["restart", "failed", "spare", "4096-nodes", "before-any-rank", "100-ranks", "64-ranks"],
)
def test_layout(summary, unit, lanes, bands, marks):
    t = layout(summary)
    assert isinstance(t, Timeline)
    assert (t.unit, len(t.lanes), len(t.bands)) == (unit, lanes, bands)
    assert [(m.kind, m.lane) for m in t.marks] == marks
    assert len(t.bars) <= max(1, lanes) * max(1, bands)
    root = ET.fromstring(svg(t))  # well-formed whatever the input
    assert root.tag == f"{SVG}svg"


def test_restart_picture_has_both_attempts_the_failure_and_the_restart():
    t = layout(RESTART)
    assert [b.text for b in t.bands] == [
        "attempt 0: rank 1 on n0 (node 0) exit code 3",
        "attempt 1",
    ]
    assert [(b.lane, b.attempt, b.state) for b in t.bars] == [
        (0, 0, "terminated"), (0, 1, "succeeded"), (1, 0, "failed"), (1, 1, "succeeded"),
    ]  # fmt: skip
    assert t.bands[0].end <= t.bands[1].start  # side by side in time
    root = ET.fromstring(svg(t))
    assert len(root.findall(f".//{SVG}g[@class='attempt']")) == 2
    assert len(root.findall(f".//{SVG}line[@class='restart']")) == 1
    assert len(root.findall(f".//{SVG}g[@class='mark cause']")) == 1


def test_spare_and_lost_node_are_visible():
    t = layout(SPARE)
    assert t.lanes[1] == "node 1 · n1→n2"
    assert "spare n2 runs node 1" in [m.text for m in t.marks]
    assert "attempt 0: spares waiting: n2" in t.notes


def test_a_4096_node_job_stays_bounded():
    text = svg(layout(HUGE))
    assert len(text) < 150_000, len(text)
    root = ET.fromstring(text)
    assert len(root.findall(f".//{SVG}rect[@class]")) == 2 * MAX_LANES
    assert "nodes 480-511" in text  # the failing node's group
    assert len(root.findall(f".//{SVG}g[@class='mark cause']")) == 1


def test_many_attempts_are_bounded():
    attempts = [{"attempt": k, "ranks": world(1, 1, k, 100.0 + 20 * k)} for k in range(200)]
    t = layout(job(1, 1, attempts))
    assert len(t.bands) == MAX_ATTEMPTS and t.bands[-1].attempt == 199
    assert f"the first {200 - MAX_ATTEMPTS} attempts are not drawn" in t.notes


def test_text_from_files_is_escaped():
    hostile = "<script>alert(1)</script>&\x00\x1b]8;;\u202e"
    summary = job(1, 1, [{"attempt": 0, "ranks": [rank(0, 0, "failed", host=hostile)],
                          "root_cause": cause_of(0, 0, 105.0, how=hostile, host=hostile)}],
                  cause=cause_of(0, 0, 105.0, how=hostile, host=hostile))  # fmt: skip
    summary["job"]["id"] = hostile
    text = svg(layout(summary))
    root = ET.fromstring(text)
    assert "<script>" not in text and not root.findall(f".//{SVG}script")
    assert "\x00" not in text and "\x1b" not in text
    assert any("<script>alert(1)</script>" in (e.text or "") for e in root.iter())


@pytest.mark.parametrize(
    "summary",
    [{}, {"attempts": "x"}, {"attempts": [1, {"ranks": [None, {"rank": "a"}]}], "job": []},
     {"attempts": [{"ranks": [rank(0, 0, start=float("nan"), end=None)]}], "root_cause": "x"},
     {"attempts": [{"ranks": [rank(10**9, 10**9)]}]}],
)  # fmt: skip
def test_odd_summaries_still_draw(summary):
    t = layout(summary)
    assert len(t.lanes) <= MAX_LANES
    ET.fromstring(svg(t))


def test_a_lost_node_and_its_spare_by_rank():
    """As summary.json has it: a lost node's record has rank -1; its seating names its ranks."""
    seating0 = [{"node": n, "host": f"n{n}", "ranks": [2 * n, 2 * n + 1]} for n in range(3)]
    seating1 = [dict(seating0[0]), {"node": 1, "host": "n3", "ranks": [2, 3]}, dict(seating0[2])]
    lost = {"kind": "lost", "node_rank": 1, "host": "n1", "how": "stopped answering",
            "time": 104.0}  # fmt: skip
    attempt0 = [r for r in world(3, 2, 0, 100.0, hosts=["n0", "n1", "n2"]) if r["node_rank"] != 1]
    attempt0.append({**rank(-1, 1, "lost", 0.0, None), "local_rank": -1})
    summary = job(
        3, 2,
        [
            {"attempt": 0, "root_cause": lost, "ranks": attempt0, "lost_nodes": [1],
             "nodes": seating0, "spares": ["n3"]},
            {"attempt": 1, "root_cause": None,
             "ranks": world(3, 2, 1, 120.0, hosts=["n0", "n3", "n2"]), "nodes": seating1,
             "spares": []},
        ],
    )  # fmt: skip
    t = layout(summary)
    assert t.unit == "rank" and t.lanes[2] == "rank 2 · n1→n3" and t.lanes[3] == "rank 3 · n1→n3"
    assert [(b.lane, b.state) for b in t.bars if b.attempt == 0] == [
        (0, "succeeded"), (1, "succeeded"), (2, "lost"), (3, "lost"), (4, "succeeded"),
        (5, "succeeded"),
    ]  # fmt: skip
    assert [(m.kind, m.lane) for m in t.marks] == [
        ("cause", 2), ("lost", 2), ("spare", 2), ("spare", 3),
    ]  # fmt: skip
    ET.fromstring(svg(t))


def _straggling(per_node: int, entries: list[dict]) -> dict:
    summary = job(2, per_node, [{"attempt": 0, "root_cause": None, "ranks": world(2, per_node)}])
    summary["stragglers"] = entries
    return summary


STRAGGLER = {"attempt": 0, "node_rank": 1, "host": "n1", "rank": None, "median": 0.4,
             "job_median": 0.2, "step": 6, "since": 103.0, "until": 107.0}  # fmt: skip


@pytest.mark.parametrize(
    "per_node, entry, lanes, span",
    [
        (2, STRAGGLER, [2, 3], (103.0, 107.0)),  # a whole node: each of its rank lanes
        (
            2,
            {**STRAGGLER, "rank": 3, "until": None},
            [3],
            (103.0, 110.0),
        ),  # open: the attempt's end
        (40, STRAGGLER, [1], (103.0, 107.0)),  # 80 ranks: a lane per node
        (2, {**STRAGGLER, "attempt": 7}, [], None),  # an attempt not drawn
        (2, {**STRAGGLER, "node_rank": "x"}, [], None),  # odd values: skipped
    ],
    ids=["node", "rank-open", "per-node-lanes", "other-attempt", "odd"],
)
def test_stragglers_are_shaded_on_their_lanes(per_node, entry, lanes, span):
    t = layout(_straggling(per_node, [entry]))
    assert [s.lane for s in t.shades] == lanes
    if span:
        assert {(s.start, s.end) for s in t.shades} == {span}
        assert "straggler in attempt 0: " in t.shades[0].text and "0.4 s/step" in t.shades[0].text
    shaded = ET.fromstring(svg(t)).findall(f".//{SVG}rect[@class='straggler']")
    assert len(shaded) == len(lanes)


ELEMENTS = {"svg", "rect", "text", "g", "title", "line", "path", "polygon", "circle"}
ATTRIBUTES = {
    "x", "y", "width", "height", "viewBox", "font-family", "font-size", "font-weight", "fill",
    "class", "data-attempt", "text-anchor", "x1", "y1", "x2", "y2", "stroke", "stroke-dasharray",
    "stroke-width", "fill-opacity", "d", "points", "cx", "cy", "r",
}  # fmt: skip
PAYLOADS = ['"><script>alert(1)</script>', '" onmouseover="alert(1)', "' onmouseover='alert(1)"]


def poisoned(value, payload: str, replace: bool):
    """`value` with every string in it (keys kept) replaced by, or ending in, `payload`."""
    if isinstance(value, str):
        return payload if replace else value + payload
    if isinstance(value, dict):
        return {k: poisoned(v, payload, replace) for k, v in value.items()}
    if isinstance(value, list):
        return [poisoned(v, payload, replace) for v in value]
    return value


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("replace", [False, True], ids=["appended", "replaced"])
@pytest.mark.parametrize(
    "summary",
    [FAILED, SPARE, EARLY, _straggling(2, [STRAGGLER])],
    ids=["failed", "spare", "before-any-rank", "straggler"],
)
def test_no_string_from_the_summary_becomes_markup(summary, payload, replace):
    """Every string of summary.json (states, hosts, causes, ids...) lands in text or in an
    attribute's value, quoted: never an element or an attribute of its own."""
    seatings = [{"attempt": 0, "nodes": [{"node": 0, "host": "n0", "ranks": [0, 1]}]}]
    t = layout(poisoned(summary, payload, replace), poisoned(seatings, payload, replace))
    root = ET.fromstring(svg(t))
    for element in root.iter():
        assert element.tag.removeprefix(SVG) in ELEMENTS, element.tag
        assert set(element.attrib) <= ATTRIBUTES, element.attrib


def test_a_local_job_is_named_by_its_run_id_and_every_text_stays_in_the_picture():
    local = {**RESTART, "job": {**RESTART["job"], "id": "", "step": "", "run_id": "local-9-1"}}
    t = layout(local)
    assert t.title.startswith("local job local-9-1: succeeded"), t.title
    assert "job 42 (step 0)" in layout(RESTART).title  # a scheduler's job keeps its ids
    long_host = "h" * 120  # a lane label and a late attempt's text as long as a host can be
    t = layout(RESTART)
    t = dataclasses.replace(t, title="x" * 400, lanes=(f"rank 0 · {long_host}", *t.lanes[1:]))
    root = ET.fromstring(svg(t))
    width = float(root.get("width"))
    for text in root.iter(f"{SVG}text"):
        words = "".join(text.itertext())
        x = float(text.get("x", 0))
        size = float(text.get("font-size", 11))
        drawn = len(words) * 6.5 * size / 11  # the widest a character is drawn, on average
        left, right = (x - drawn, x) if text.get("text-anchor") == "end" else (x, x + drawn)
        if text.get("text-anchor") == "middle":
            left, right = x - drawn / 2, x + drawn / 2
        assert left >= 0 and right <= width, (words, left, right)
