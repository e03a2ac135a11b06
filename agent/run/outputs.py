"""What a run leaves on disk: the log dir, each agent's resolved config, ranks.json, summary.json."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from agent import history
from agent.errors import AgentError
from agent.history import liveness
from agent.history.summary_doc import read_summary
from agent.node.failure import Failure
from agent.plan.log_dir import LogDir, job_files
from agent.plan.run_id import copied
from agent.plan.run_plan import RunPlan
from agent.run.summary import build_summary, job_record, started_summary
from agent.world import World

log = logging.getLogger("agent")


COMPACT: dict[str, Any] = {"separators": (",", ":")}
# The resolved config's layout, for people: sorted keys, indented (orjson's 2 spaces).
READABLE: dict[str, Any] = {"sort_keys": True, "indent": 2, "ensure_ascii": False}


def write_json(path: str, data: Any, **dump: Any) -> None:
    """Write-then-rename, so a reader never sees half a file (`agent logs --follow` polls them),
    UTF-8. The COMPACT and READABLE layouts are orjson's: node 0 writes a 32,768-rank summary
    between the last result and the verdict, 7.6 MB in 0.03 s where json's C encoder took 0.3 s
    (0.8 s on 2 cores shared with 4,095 simulated agents), and every agent writes its copy of
    the resolved config, which json indents in Python (a 35 KB config: 4.1 ms against 0.12 ms,
    on every node of a 4,096-node start). What orjson refuses (a type it does not know, an int
    past 64 bits) goes through json as before."""
    tmp = f"{path}.tmp-{os.getpid()}"
    encoded = _by_orjson(data, dump)
    if encoded is None:
        try:
            encoded = json.dumps(data, **dump).encode()
        except UnicodeEncodeError:  # a lone surrogate (a config's "\udcff"): escaped instead
            encoded = json.dumps(data, **{**dump, "ensure_ascii": True}).encode()
    with open(tmp, "wb") as f:
        f.write(encoded)
        f.write(b"\n")
    os.replace(tmp, path)


def _by_orjson(data: Any, dump: dict[str, Any]) -> bytes | None:
    if dump not in (COMPACT, READABLE):
        return None
    import orjson  # only where a large job's file or a config is written

    option = orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2 if dump == READABLE else 0
    try:
        return orjson.dumps(data, option=option)
    except TypeError:
        return None


def prepare_log_dir(path: str) -> str:
    """Create it and prove we can write there, before anything starts."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".probe-{os.getpid()}-{threading.get_ident()}")
        with open(probe, "w"):
            pass
        os.unlink(probe)
    except OSError as exc:
        raise AgentError(
            f"log dir {path!r} is not writable ({exc.strerror}); pass --log-dir DIR on a writable filesystem"
        ) from None
    return path


CLAIM_TRIES = 1000


def claim_log_dir(path: str) -> tuple[str, int, str | None]:
    """Node 0, before it offers the plan: the log dir this job writes into — `path`, or the first
    free `path-2`, `path-3`, ... when `path` holds another job's files —, which copy of the name
    that is (1: `path`) and the line that says so (None when `path` was free).

    A log dir holds one job: it is claimed at once by creating the summary reserve exclusively,
    so two jobs starting together never share one."""
    for copy in range(1, CLAIM_TRIES + 1):
        candidate = copied(path, copy)
        if os.path.isdir(candidate) and job_files(os.listdir(candidate)):
            continue  # a job's files already: never written into
        prepare_log_dir(candidate)
        try:
            reserve = LogDir(candidate).summary_reserve
            fd = os.open(reserve, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue  # another job claimed it a moment ago
        except OSError as exc:
            raise AgentError(
                f"log dir {candidate!r} is not writable ({exc.strerror}); pass --log-dir DIR on a "
                "writable filesystem"
            ) from None
        os.close(fd)
        if copy == 1:
            return candidate, copy, None
        taken = job_files(os.listdir(path)) if os.path.isdir(path) else []
        return (
            candidate,
            copy,
            (
                f"log dir {path} holds another job's files ({', '.join(taken[:3])}"
                f"{', ...' if len(taken) > 3 else ''}): this job's logs go to {candidate}"
            ),
        )
    raise AgentError(
        f"log dir {path!r} and {CLAIM_TRIES - 1} next names ({copied(path, 2)}, ...) hold other "
        "jobs' files; pass --log-dir DIR naming a new directory"
    )


def claim(plan: RunPlan) -> tuple[RunPlan, str | None]:
    """Node 0: the plan in the log dir it claimed, and the line to say when that is not the one
    asked for (`claim_log_dir`)."""
    log_dir, copy, note = claim_log_dir(plan.log_dir)
    name = plan.run_id
    if os.path.basename(plan.log_dir) == name:  # the default logs/<id>: the id follows its dir
        name = copied(name, copy)
    return replace(plan, log_dir=log_dir, run_id=name), note


def relaid(plan: RunPlan, first: RunPlan) -> RunPlan:
    """A plan made again (a smaller world, --min-nodes) in the log dir the run claimed first,
    under its id."""
    return replace(plan, log_dir=first.log_dir, run_id=first.run_id)


def write_config(log_dir: str, agent_index: int, config: Mapping[str, Any]) -> str:
    """Each agent writes its own copy (no two nodes write one file on a shared filesystem)."""
    path = os.path.abspath(LogDir(log_dir).resolved_config(agent_index))
    write_json(path, config, **READABLE)
    return path


def write_ranks(
    log_dir: str, seatings: Sequence[Mapping[str, Any]], nproc_per_node: int, per_task: bool
) -> None:
    """ranks.json: which host runs which rank now ("ranks", for `agent logs` and for people),
    and per attempt which hosts ran, waited as spares or were excluded ("attempts")."""
    last = seatings[-1]["nodes"] if seatings else []
    if per_task:
        ranks = [{"rank": n["ranks"][0], "host": n["host"]} for n in last]
    else:
        ranks = [
            {"rank": n["node"] * nproc_per_node + local, "host": n["host"], "node": n["node"],
             "local_rank": local}
            for n in last
            for local in range(nproc_per_node)
        ]  # fmt: skip
    data = {"ranks": ranks, "attempts": list(seatings)}
    try:
        write_json(LogDir(log_dir).ranks, data, **_layout(len(ranks)))
    except OSError as exc:  # `agent logs` then names hosts from the agent logs instead
        log.error("cannot write ranks.json in %s (%s)", log_dir, exc.strerror or exc)


def reserve_space(log_dir: str, size: int = 1 << 20) -> None:
    """Node 0 holds room for summary.json from the start: a log disk that fills up during the
    run must not also lose the verdict (the reserve is freed just before the summary is written)."""
    try:
        with open(LogDir(log_dir).summary_reserve, "wb") as f:
            f.write(bytes(size))
    except OSError:
        pass  # already full: the summary will try anyway


def write_started(plan: RunPlan, world: World, port: int) -> None:
    """Node 0, the job's endpoint open: its record from the start — summary.json `running` and
    the history row, naming node 0's agent — so that a job killed before its end (SIGKILL, a
    node rebooted) still leaves one that every reader reports as killed, never as running."""
    node0 = liveness.node0_record(world.host, world.master_addr, port)
    summary = started_summary(job_record(world, plan), node0)
    path = LogDir(plan.log_dir).summary
    try:
        write_json(path, summary, indent=1)
    except OSError as exc:
        log.error("cannot write %s (%s)", path, exc.strerror or exc)
    # The history row on a thread of its own: a SQLite commit (25-50 ms here) stays off the
    # launch; the job's final row waits for it (`write_summary`), so it always comes second.
    row = threading.Thread(
        target=history.record_job, args=(summary, dict(os.environ)), name="history-start",
        daemon=True,
    )  # fmt: skip
    row.start()
    _STARTING[plan.log_dir] = row


_STARTING: dict[str, threading.Thread] = {}  # log dir → the thread appending its running row
_START_WAIT = 30.0  # seconds the final row waits for the running one (the store's busy timeout)


def write_unfinished(plan: RunPlan, world: World, code: int, cause: Failure) -> None:
    """Node 0, the run ended before its first attempt: summary.json still says why (unless the
    run's own verdict is there already)."""
    if has_verdict(plan.log_dir):
        return
    try:
        prepare_log_dir(plan.log_dir)
        summary = build_summary(job_record(world, plan), [], code, cause)
        write_summary(plan.log_dir, summary)
        record_history(plan.log_dir, summary)
    except (AgentError, OSError):
        pass  # the log dir itself may be what failed


def has_verdict(log_dir: str) -> bool:
    """Whether LOG_DIR/summary.json is the job's last word (not its running record)."""
    try:
        with open(LogDir(log_dir).summary) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and not read_summary(found).running


def write_summary(log_dir: str, summary: Mapping[str, Any]) -> str | None:
    """summary.json, or None (logged) when the disk refuses even after freeing the reserve.
    The history row is `record_history`'s, once every node has its verdict."""
    path = LogDir(log_dir).summary
    with contextlib.suppress(OSError):
        os.unlink(LogDir(log_dir).summary_reserve)
    try:
        ranks = sum(len(a.get("ranks") or ()) for a in summary.get("attempts") or ())
        write_json(path, summary, **_layout(ranks))
    except OSError as exc:
        log.error("cannot write %s (%s)", path, exc.strerror or exc)
        return None
    return path


def record_history(log_dir: str, summary: Mapping[str, Any]) -> None:
    """The job's final history row, after its running one (a thread of write_started). Called
    once the nodes were told their verdict: at 32,768 ranks reading the summary into its row
    costs ~0.6 s that no node needs to wait for (the agent still records it before it exits
    or answers its client)."""
    started = _STARTING.pop(log_dir, None)
    if started is not None:
        started.join(_START_WAIT)
    history.record_job(summary, os.environ)  # the user's job history; never raises


def _layout(entries: int) -> dict[str, Any]:
    """Indented for people up to a few thousand ranks; compact above (4x faster at 32K ranks:
    `agent logs --summary` is how people read those)."""
    return {"indent": 1} if entries <= 4096 else COMPACT
