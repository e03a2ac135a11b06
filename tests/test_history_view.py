"""What `agent history` says, and how: tables that fit an 80-column terminal without cutting the
job id, ranks the agents stopped counted as terminated (not failed), a whole-node straggler
named as a node, and a lost node's cause naming it once — the same words in every reader."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from cluster import REPO
from rich.cells import cell_len

from agent.history import store
from agent.history.record import attempt_record, cause_line, from_summary
from agent.history.summary_doc import Attempt
from agent.history.view import (
    ATTEMPT_COLUMNS,
    JOB_COLUMNS,
    Column,
    attempt_rows,
    fit,
    fitted_table,
    job_rows,
)
from agent.logs.timeline import cause_words
from agent.run import summary as run_summary

NOW = 1_700_000_000.0
LONG_ID = "1234567890.step-with-a-long-name"  # a job id that alone takes a third of the screen


def rank(r, state, node=0):
    return {"rank": r, "node_rank": node, "host": f"n{node}", "state": state,
            "start": 100.0, "end": 110.0}  # fmt: skip


def summary(job_id: str, cause: dict | None, command: list[str]) -> dict:
    return {
        "job": {"id": job_id, "step": "0", "nnodes": 2, "world_size": 4, "log_dir": "/l",
                "command": command},
        "exit_code": 1 if cause else 0,
        "root_cause": cause,
        "attempts": [{"attempt": 0, "root_cause": cause,
                      "ranks": [rank(0, "failed"), rank(1, "terminated"),
                                rank(2, "terminated", 1), rank(3, "lost", 1)],
                      "nodes": [{"host": "n0"}, {"host": "n1"}], "spares": ["n2"],
                      "lost_nodes": [1]}],
        "stragglers": [{"rank": None, "node_rank": 1, "host": "n1", "median": 0.4},
                       {"rank": 3, "node_rank": 1, "host": "n1", "median": 0.5}],
    }  # fmt: skip


RANK_CAUSE = {"kind": "rank", "rank": 0, "host": "n0", "node_rank": 0,
              "how": "exit code 3: " + " ".join(["a long story of what went wrong"] * 4)}  # fmt: skip
LONG_COMMAND = ["scripts/examples/ddp_train.py", "configs/data.yml", "configs/model.yml",
                "--lr", "0.001", "--epochs", "100"]  # fmt: skip


def stored(job_id: str, run: int = 0, cause=RANK_CAUSE) -> store.Stored:
    return store.Stored(run, from_summary(summary(job_id, cause, LONG_COMMAND), NOW))


@pytest.mark.parametrize("width", [80, 100])
def test_the_job_table_fits_the_width_and_never_cuts_the_id(width):
    jobs = [stored(LONG_ID), stored("77"), stored("78", cause=None)]
    lines = fitted_table("3 job(s), oldest first", job_rows(jobs), JOB_COLUMNS, width).lines(width)
    assert lines is not None
    assert max(cell_len(line) for line in lines) <= width, "\n".join(lines)
    ids = [line.split("│")[1].strip() for line in lines if line.startswith("│")]
    assert ids == [f"{LONG_ID}.0", "77.0", "78.0"], "\n".join(lines)
    header = [cell.strip() for cell in lines[2].strip("┃").split("┃")]
    assert header[0] == "job" and "exit" in header and "root cause" in header, header
    cause = lines[4].split("│")[header.index("root cause") + 1].strip()
    assert cause.startswith("rank 0 on n0 (node 0) exit") and cause.endswith("…"), cause


def test_too_narrow_for_the_id_the_table_runs_past_the_edge_rather_than_cut_it():
    rows = job_rows([stored(LONG_ID)])
    header, fitted = fit(JOB_COLUMNS, rows, 30)
    assert header == ("job", "exit") and fitted[0][0][0] == f"{LONG_ID}.0"


def test_at_80_columns_the_least_wanted_columns_go_first():
    header, rows = fit(JOB_COLUMNS, job_rows([stored("12345678")]), 80)
    assert header == ("job", "started", "exit", "root cause")
    assert cell_len(rows[0][0][3]) == 80 - 13 - len("12345678.0") - 19 - 4  # all the rest
    wide_header, wide_rows = fit(JOB_COLUMNS, job_rows([stored("77")]), 1 << 20)
    assert wide_header == tuple(c.title for c in JOB_COLUMNS)  # a pipe: everything, uncut
    assert wide_rows == job_rows([stored("77")])


def test_the_attempt_table_fits_80_columns():
    attempts = stored(LONG_ID).record.attempts
    table = fitted_table(f"attempts of {LONG_ID}.0", attempt_rows(attempts), ATTEMPT_COLUMNS, 80)
    lines = table.lines(80)
    assert lines is not None and max(cell_len(line) for line in lines) <= 80, lines
    assert "failed" in lines[2] and "cause" in lines[2]


@pytest.mark.parametrize(
    ("width", "header", "cells"),
    [
        (28, ("id", "a", "b", "text"), ["x", "1", "22", "abcdefghij"]),  # fits: 15 + 13 borders
        (27, ("id", "a", "b", "text"), ["x", "1", "22", "abcdefgh…"]),  # the text gives way
        (23, ("id", "a", "b", "text"), ["x", "1", "22", "abcd…"]),  # down to its shrink width
        (22, ("id", "b", "text"), ["x", "22", "abcdefg…"]),  # then `a` (drop 1) goes
        (18, ("id", "text"), ["x", "abcdefgh…"]),  # then `b`
        (14, ("id", "text"), ["x", "abcd…"]),
        (13, ("id",), ["x"]),  # then the text
        (3, ("id",), ["x"]),  # the id stays, whatever the width
    ],
)
def test_fit_drops_by_priority_and_cuts_texts_to_their_shrink_width(width, header, cells):
    columns = (Column("id"), Column("a", drop=1), Column("b", drop=2),
               Column("text", drop=3, shrink=5))  # fmt: skip
    fitted = fit(columns, [(["x", "1", "22", "abcdefghij"], "red")], width)
    assert fitted == (header, [(cells, "red")])


def test_the_cli_on_an_80_column_terminal(tmp_path):
    """`agent history` on a terminal 80 columns wide (a pty): no line longer, the id whole."""
    state = tmp_path / "state"
    for summary_ in (summary(LONG_ID, RANK_CAUSE, LONG_COMMAND), summary("78", None, ["t.py"])):
        store.append(from_summary(summary_, NOW), {"AGENT_STATE_DIR": str(state)}, state,
                     os.getuid(), print)  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO),
           "AGENT_STATE_DIR": str(state), "TMPDIR": str(tmp_path / "tmp"), "COLUMNS": "80"}  # fmt: skip
    text = _on_a_terminal([sys.executable, "-m", "agent", "history"], env)
    lines = text.splitlines()
    assert max(cell_len(line) for line in lines) <= 80, text
    assert any(line.startswith(f"│ {LONG_ID}.0 ") for line in lines), text


def _on_a_terminal(argv: list[str], env: dict[str, str]) -> str:
    parent, child = pty.openpty()
    with subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=child, stderr=child, env=env) as p:
        os.close(child)
        chunks = []
        while True:
            try:
                chunk = os.read(parent, 65536)
            except OSError:  # EIO: the child's side closed, everything read
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert p.wait(60) == 0, b"".join(chunks)
    os.close(parent)
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_ranks_the_agents_stopped_are_not_counted_failed():
    attempt = attempt_record(Attempt.from_json(summary("1", RANK_CAUSE, [])["attempts"][0], 0))
    assert (attempt.ranks, attempt.failed) == (4, 2)  # rank 0 failed, rank 3 lost with its node


@pytest.mark.parametrize(
    ("nodes", "ranks", "failed"),
    [
        ([[0, 1], [2, 3]], 4, 2),  # node 1's two ranks went with it: both count, as failed
        ([[0, 1], [2, 10**9]], 2 + 2 + (1 << 16) - 2, (1 << 16)),  # a forged range: capped
        ([None, None], 2, 1),  # an older summary without ranges: its rows, the lost one once
    ],
)
def test_a_lost_nodes_ranks_count_by_its_planned_range(nodes, ranks, failed):
    """A lost node has one row for all its ranks (rank -1, as node 0 writes it): the attempt
    still ran 4 ranks, and both of the lost node's failed with it."""
    attempt = attempt_record(Attempt.from_json(
        {"ranks": [rank(0, "terminated"), rank(1, "terminated"), rank(-1, "lost", 1)],
         "nodes": [{"node": n, "host": f"n{n}", "ranks": r} for n, r in enumerate(nodes)],
         "lost_nodes": [1]},
        0,
    ))  # fmt: skip
    assert (attempt.ranks, attempt.failed) == (ranks, failed)


def test_a_whole_node_straggler_is_named_as_a_node():
    record = from_summary(summary("1", None, []), NOW)
    assert record.stragglers == ("node 1 (n1)", "rank 3 on n1")


LOST = {"kind": "lost", "node_rank": 1, "host": "127.0.0.2",
        "how": "lost: its agent stopped answering"}  # fmt: skip


@pytest.mark.parametrize(
    ("cause", "words"),
    [
        (LOST, "node 1 (127.0.0.2) lost: its agent stopped answering"),
        ({**LOST, "how": "left: agent received SIGTERM"},
         "node 1 (127.0.0.2) left: agent received SIGTERM"),
        (RANK_CAUSE, f"rank 0 on n0 (node 0) {RANK_CAUSE['how']}"),
        ({"kind": "signal", "node_rank": 0, "host": "n0", "how": "agent received SIGINT"},
         "node 0 (n0): agent received SIGINT"),
        ({"kind": "join", "how": "node 3 never arrived"}, "join: node 3 never arrived"),
    ],
)  # fmt: skip
def test_every_reader_words_a_cause_the_same(cause, words):
    """The console report and `agent logs --summary` (run.summary), the history and the
    timeline: a node is named once, by its fields."""
    assert run_summary.cause_line(cause) == words
    assert cause_line(cause) == words[:1000]
    assert cause_words(cause) == words
    report = run_summary.render_report(
        {"status": "failed", "exit_code": 3, "attempts": [], "root_cause": cause}
    )
    assert report.splitlines()[1] == f"root cause: {words}"
    assert "node 1 (127.0.0.2): node" not in report


def test_layer_imports_stay_as_documented():
    """history.view draws with console.rank_table and escapes with text (lower layers):
    nothing else of the agent's."""
    text = Path(REPO / "agent" / "history" / "view.py").read_text()
    imports = [
        line for line in text.splitlines() if line.startswith(("from agent", "import agent"))
    ]
    assert all(
        line.startswith(("from agent.history", "from agent.console.rank_table", "from agent.text"))
        for line in imports
    ), imports
