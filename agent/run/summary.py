"""Rank exits → one root cause for the whole job, summary.json and a short report (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# The rank exits are summary.json's own records: written here, read back by every reader.
from agent.history.summary_doc import SCHEMA, RankExit, Straggler, describe, signal_name
from agent.node.failure import Failure, Kind, words


def rank_failure(
    exit: RankExit, stderr_tail: Sequence[str], error_file: Mapping[str, Any] | None
) -> Failure:
    """What the first failing rank's agent publishes: enough to explain the job's death."""
    traceback = _traceback(error_file)
    return Failure(
        Kind.RANK,
        describe(exit.returncode),
        exit.node_rank,
        exit.host,
        exit.end,
        rank=exit.rank,
        local_rank=exit.local_rank,
        returncode=exit.returncode,
        signal=signal_name(exit.returncode),
        stderr_tail=tuple(cap(line, LINE_CAP) for line in stderr_tail[-20:]),
        traceback=cap(traceback, TRACEBACK_CAP, keep_end=True) if traceback else None,
    )


# What a failure record may carry: it travels through the store (8 MiB a value) and into
# summary.json; the full text always stays in the rank's own files.
LINE_CAP = 2000
TRACEBACK_CAP = 64 * 1024


def cap(text: str, limit: int, keep_end: bool = False) -> str:
    """`text` cut to about `limit` characters, saying so (the end is what a traceback needs)."""
    if len(text) <= limit:
        return text
    note = f"[... {len(text) - limit} characters cut; the full text is in the rank's files ...]"
    return f"{note}\n{text[-limit:]}" if keep_end else f"{text[:limit]} {note}"


def _traceback(error_file: Mapping[str, Any] | None) -> str | None:
    """torch's @record writes {"message": {"message": ..., "extraInfo": {"py_callstack": ...}}}."""
    if not error_file:
        return None
    message = error_file.get("message")
    if isinstance(message, Mapping):
        extra = message.get("extraInfo") or {}
        stack = extra.get("py_callstack") if isinstance(extra, Mapping) else None
        return str(stack or message.get("message") or "") or None
    return str(message) if message else None


def job_record(world: Any, plan: Any) -> dict[str, Any]:
    """summary.json's "job": who ran what, where (from a World and a RunPlan)."""
    return {
        "run_id": plan.run_id,  # the id every command takes (agent.plan.run_id)
        "id": world.job_id,
        "step": world.step_id,
        "source": world.source,
        "nnodes": plan.nnodes,
        "agents": world.agents,
        "spares": plan.options.spares,
        # the restart budgets (agent.run.verdict.Budget); each attempt's "failure" says which
        # one it spent
        "max_restarts": plan.options.max_restarts,
        "max_infra_restarts": plan.options.max_infra_restarts,
        "restart_same_failure": plan.options.restart_same_failure,
        "world_size": plan.world_size,
        "nproc_per_node": plan.nproc_per_node,
        "hosts": list(world.hosts),
        "log_dir": plan.log_dir,
        "command": [plan.script, *plan.configs, *plan.script_args],
    }


def started_summary(job: Mapping[str, Any], node0: Mapping[str, Any]) -> dict[str, Any]:
    """summary.json while the job runs: who runs what, and node 0's agent that will complete it
    (`node0`: a reader tells a running job from a killed one by it, agent.history.liveness)."""
    return {
        "schema": SCHEMA,
        "job": dict(job),
        "status": "running",
        "exit_code": None,
        "root_cause": None,
        "excluded": [],
        "stragglers": [],
        "attempts": [],
        "node0": dict(node0),
    }


def build_summary(
    job: Mapping[str, Any],
    attempts: Sequence[Mapping[str, Any]],
    exit_code: int,
    cause: Failure | None = None,
    excluded: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """`cause`: why a run ended before its first attempt (a node never joined, a mismatch);
    `excluded`: the nodes taken out of the job, when and why."""
    last = attempts[-1] if attempts else {}
    return {
        "schema": SCHEMA,
        "job": dict(job),
        "status": "succeeded" if exit_code == 0 else "failed",
        "exit_code": exit_code,
        "root_cause": last.get("root_cause", cause.to_json() if cause else None),
        "excluded": [dict(e) for e in excluded],
        "stragglers": [dict(s) for a in attempts for s in a.get("stragglers") or []],
        "attempts": list(attempts),
    }


def render_report(summary: Mapping[str, Any]) -> str:
    """A few lines for the console, root cause first."""
    attempts = summary.get("attempts") or []
    ranks = [r for a in attempts[-1:] for r in a.get("ranks", [])]
    counts: dict[str, int] = {}
    for r in ranks:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    tally = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    head = f"job {summary['status']} (exit {summary['exit_code']}) after {len(attempts)} attempt(s): {tally}"
    cause = summary.get("root_cause")
    lines = [head]
    stop = summary.get("preemption")  # agent.run.preemption: its line says it all
    if isinstance(stop, Mapping) and isinstance(stop.get("line"), str):
        lines.append(stop["line"])
    lines += [excluded_line(e) for e in (summary.get("excluded") or [])[:20]]
    lines += [straggler_line(s) for s in (summary.get("stragglers") or [])[:20]]
    if not cause:
        return "\n".join(lines)
    lines.append("root cause: " + cause_line(cause))
    if cause.get("traceback"):
        lines += ["  traceback (from TORCHELASTIC_ERROR_FILE):"]
        lines += ["    " + line for line in str(cause["traceback"]).rstrip().splitlines()[-15:]]
    elif cause.get("stderr_tail"):
        lines += ["  last stderr lines:"] + ["    " + line for line in cause["stderr_tail"][-10:]]
    return "\n".join(lines)


def excluded_line(exclusion: Mapping[str, Any]) -> str:
    """`excluded n1 before attempt 1: lost: its agent stopped answering` (+ a check's output)."""
    line = (
        f"excluded {exclusion.get('host')} before attempt {exclusion.get('attempt')}: "
        f"{exclusion.get('why')}"
    )
    output = exclusion.get("output") or []
    return line + "".join(f"\n    {text}" for text in output[-5:])


def straggler_line(entry: Mapping[str, Any]) -> str:
    """One summary.json `stragglers` entry, as every reader words it."""
    return Straggler.from_json(entry).words


def cause_line(cause: Mapping[str, Any]) -> str:
    """One line naming a failure of summary.json: shared by the agent's report and `agent logs
    --summary` (agent.node.failure's words)."""
    return words(cause) or ""
