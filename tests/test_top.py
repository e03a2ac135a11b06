"""`agent top` on node 0 and in the client, without a job: one gather at a time shared by every
client asking meanwhile, rows from other nodes checked (its client is torch-free:
tests/test_torch_free.py)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from agent.console.top import TopRow, render_plain
from agent.control.top_service import TopService
from agent.node.stage import Stage

ROW = TopRow(3, "node-b", "running", 42, 12.0, 300.0, 2.0).to_json()


class _Desk:
    """Node 0's StackDesk as TopService uses it: `gather` blocks until the test lets it go."""

    def __init__(self) -> None:
        self.nodes, self.stage = (0, 1), Stage(0, 0)
        self.calls = 0
        self.entered, self.release = threading.Event(), threading.Event()

    def gather(self, request, wait):
        assert request == {"desk": "top"}
        self.calls += 1
        self.entered.set()
        self.release.wait(10)
        return [{"rows": [ROW, {"rank": True, "host": "x"}, "junk"], "more": 2}, None]


def test_concurrent_clients_share_one_gather() -> None:
    desk = _Desk()
    service = TopService(SimpleNamespace(desk=desk), wait=1.0)  # type: ignore[arg-type]
    answers: list[dict] = []
    first = threading.Thread(target=lambda: answers.append(service.reply({"op": "top"})))
    first.start()
    assert desk.entered.wait(10)
    others = [
        threading.Thread(target=lambda: answers.append(service.reply({"op": "top"})))
        for _ in range(5)
    ]
    for thread in others:
        thread.start()
    desk.release.set()
    for thread in [first, *others]:
        thread.join(10)
    assert desk.calls == 1 and len(answers) == 6
    top = answers[0]["top"]
    assert all(answer["top"] is top for answer in answers)
    assert top["rows"] == [ROW]  # the malformed rows are dropped, the good one kept
    assert top["notes"] == [
        "node 0: 2 more ranks not listed",
        "node 1's agent did not answer within 1 s",
    ]


def test_no_attempt_and_another_run_are_errors_the_client_can_tell() -> None:
    assert TopService(SimpleNamespace(desk=None)).reply({})["code"] == 2  # type: ignore[arg-type]
    desk = _Desk()
    service = TopService(SimpleNamespace(desk=desk))  # type: ignore[arg-type]
    assert "run 4 is over" in service.reply({"run": 4})["error"]
    assert desk.calls == 0


def test_plain_table_adds_step_columns_only_when_steps_are_known() -> None:
    rows = [
        TopRow(0, "a", "running", 10, 99.0, 1024.0, 0.4, step=12, per_step=0.25),
        TopRow(1, "b", "exited 1", 11, None, None, None),
    ]
    text = render_plain(rows).splitlines()
    assert text[0].split() == [
        "rank",
        "host",
        "state",
        "pid",
        "cpu",
        "%",
        "rss",
        "silent",
        "step",
        "s/step",
        "behind",
    ]
    assert text[1].split() == [
        "0",
        "a",
        "running",
        "10",
        "99",
        "1024",
        "MiB",
        "0s",
        "12",
        "0.25",
        "0",
    ]
    assert text[2].split() == ["1", "b", "exited", "1", "11", "-", "-", "-", "-", "-", "-"]
    assert "step" not in render_plain(rows[1:])
