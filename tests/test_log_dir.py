"""A job's log dir names every file once (agent.plan.log_dir, pure): the names writers and
readers share, and the names read back."""

from __future__ import annotations

import pytest

from agent.plan.log_dir import (
    LogDir,
    RankFileName,
    RankFiles,
    is_agent_log,
    is_nccl_trace,
    job_files,
    nccl_trace_rank,
    rank_file,
    stacks_attempt,
)

D = LogDir("/logs/8.0")


def test_the_job_files_of_node_0():
    assert (D.summary, D.ranks, D.control, D.metrics, D.summary_reserve) == (
        "/logs/8.0/summary.json",
        "/logs/8.0/ranks.json",
        "/logs/8.0/control.json",
        "/logs/8.0/metrics.prom",
        "/logs/8.0/.summary-reserve",
    )


@pytest.mark.parametrize(
    ("rank", "attempt", "files"),
    [
        (3, 0, ("rank-00003.out", "rank-00003.err", "rank-00003.error.json")),
        (3, 1, ("rank-00003.r1.out", "rank-00003.r1.err", "rank-00003.r1.error.json")),
        (123456, 12, ("rank-123456.r12.out", "rank-123456.r12.err", "rank-123456.r12.error.json")),
    ],
)
def test_rank_files_are_written_and_read_back_alike(rank, attempt, files):
    written = D.rank_files(rank, attempt)
    assert written == RankFiles(*(f"/logs/8.0/{name}" for name in files))
    for path, stream in zip(written[:2], ("out", "err"), strict=True):
        assert rank_file(path.rsplit("/", 1)[1]) == RankFileName(rank, attempt, stream)


@pytest.mark.parametrize(
    "name",
    [
        "rank-00003.error.json",
        "rank-3.out.tmp",
        "rank-.out",
        "xrank-00003.out",
        "rank-00003.rx.out",
    ],
)
def test_other_names_are_no_rank_files(name):
    assert rank_file(name) is None


def test_agent_logs_stacks_and_dumps():
    assert D.agent_log(2) == "/logs/8.0/agent-00002.log" and is_agent_log("agent-00002.log")
    assert not is_agent_log("agent-2.log.1")
    assert D.resolved_config(2) == "/logs/8.0/resolved-config.agent-00002.json"
    assert D.resolved_config(None) == "/logs/8.0/resolved-config.agent-NNNNN.json"
    assert D.stacks(4) == "/logs/8.0/stacks-a4.txt" and stacks_attempt("stacks-a4.txt") == 4
    assert stacks_attempt("stacks-a.txt") is None
    prefix = D.nccl_trace_prefix(1)
    assert prefix == "/logs/8.0/nccl-trace.a1.rank-"
    name = prefix.rsplit("/", 1)[1] + "7"
    assert nccl_trace_rank(name, 1) == 7 and nccl_trace_rank(name, 0) is None
    assert is_nccl_trace(name) and not is_nccl_trace("nccl-tracer")


def test_job_files_are_what_a_job_writes():
    names = ["summary.json", "notes.txt", "rank-00000.out", ".summary-reserve", "data", "x.json"]
    assert job_files(names) == [".summary-reserve", "rank-00000.out", "summary.json"]
