"""dshbak -c style grouping of per-node command results (pure)."""

from __future__ import annotations

import pytest

from agent.remote.collate import Group, NodeOutput, collate, failures, render


def out(node: int, text: str, code: int | None = 0, **kw) -> NodeOutput:
    return NodeOutput(node, f"n{node + 1}", text, code, **kw)


@pytest.mark.parametrize(
    ("results", "groups"),
    [
        pytest.param(
            [out(0, "a\n"), out(1, "a\n"), out(2, "a\n"), out(3, "b\n")],
            [("n[1-3]", "a\n", "exit 0", True), ("n4", "b\n", "exit 0", True)],
            id="three alike, one differs",
        ),
        pytest.param(
            [out(3, "a\n"), out(0, "a\n"), out(6, "a\n"), out(1, "a\n"), out(2, "a\n")],
            [("n[1-4,7]", "a\n", "exit 0", True)],
            id="order of arrival does not matter",
        ),
        pytest.param(
            [out(0, "x\n"), out(1, "x\n", 3), out(2, "x\n")],
            [("n[1,3]", "x\n", "exit 0", True), ("n2", "x\n", "exit 3", False)],
            id="same output, other exit code",
        ),
        pytest.param(
            [
                out(0, "", -9),
                out(1, "", 0, timed_out=True),
                out(2, "", None, missing="never joined"),
            ],
            [
                ("n1", "", "killed by SIGKILL", False),
                ("n2", "", "timed out, killed", False),
                ("n3", "", "no result: never joined", False),
            ],
            id="signal, timeout, missing",
        ),
        pytest.param([], [], id="nothing"),
    ],
)
def test_collate(results, groups) -> None:
    got = [(g.label, g.output, g.status, g.ok) for g in collate(results)]
    assert got == groups


def test_label_names_nodes_when_hosts_repeat() -> None:
    same_host = [NodeOutput(i, "box", "hi\n", 0) for i in (0, 2, 3)]
    assert collate(same_host)[0].label == "box (nodes 0,2-3)"


def test_render_is_dshbak_c_with_status() -> None:
    text = render(collate([out(0, "a\nb"), out(1, "a\nb"), out(2, "", 1)]))
    assert text == (
        "----------------\nn[1-2] (exit 0)\n----------------\na\nb\n"
        "----------------\nn3 (exit 1)\n----------------\n"
    )


def test_failures_names_every_failed_group() -> None:
    groups = collate([out(0, "ok\n"), out(1, "boom\n", 2), out(2, "boom\n", 2), out(3, "", None)])
    assert failures(groups) == "n[2-3] (exit 2); n4 (no result)"
    assert failures([Group((0,), ("n1",), "", "exit 0", True)]) is None
