"""CMD on every node: join node 0's exec store, publish sealed results; node 0 collates them."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from agent.errors import AgentError, ExitCode
from agent.node.sealed import POLL_FIRST, POLL_MAX, TAMPERING, tell_refused
from agent.node.trust import Refused
from agent.remote.cli import ExecCommand
from agent.remote.collate import NodeOutput, collate, failures, render
from agent.remote.local import KILL_GRACE, LocalRun, exit_status
from agent.world import PORT_HIGH, PORT_LOW, World, WorldFlags, derive_port, world_from_env

log = logging.getLogger("agent")
_SLICE = 1.0  # store waits are sliced so that Ctrl-C reaches Python between slices
_SLACK = KILL_GRACE + 5.0  # how long after --timeout node 0 still waits for a node's result
RECHECK = 2.0  # seconds between a reported node's looks at its own records (re-posted if gone)
SCOPE = "exec"  # the exec records' keys: joined/<i>, result/<i>, done (node 0 read them all)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached this agent: stop the command, report, exit 128 + signum."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signum)
        self.signum = signum


def exec_port(world: World, flags: WorldFlags) -> int:
    """--master-port as given; else the agent's port moved by half the range PORT_LOW..PORT_HIGH."""
    if flags.master_port is not None:
        return flags.master_port
    base = (
        world.master_port
        if world.master_port is not None
        else derive_port(world.job_id, world.step_id)
    )
    span = PORT_HIGH - PORT_LOW + 1
    return PORT_LOW + (base - PORT_LOW + span // 2) % span


def verdict(results: Sequence[NodeOutput]) -> int:
    if any(r.tampered for r in results):
        return int(ExitCode.REFUSED)
    if any(r.code is None for r in results):
        return int(ExitCode.RENDEZVOUS)
    return int(ExitCode.OK) if all(r.ok for r in results) else int(ExitCode.RANK_FAILED)


def run(command: ExecCommand, env: Mapping[str, str]) -> int:
    env = dict(env)  # CMD's environment: a snapshot, before we quiet c10d below
    world = world_from_env(env, command.flags, hostname=socket.gethostname())
    if world.task is not None:
        raise AgentError(
            f"exec runs one agent per node, not per task (--world {world.source}): "
            "srun --ntasks-per-node=1 python -m agent exec -- CMD"
        )
    previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if world.agents == 1:
            with LocalRun(command.argv, env, command.timeout) as local:
                return _report([local.result(0, world.host)])
        return _run_distributed(command, world, env)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _interrupt(signum: int, frame: Any) -> None:
    raise Interrupted(signum)


def _run_distributed(command: ExecCommand, world: World, env: Mapping[str, str]) -> int:
    from agent.node import signing
    from agent.node.scope import Scope
    from agent.node.trust import JobKeys

    keys = JobKeys.derive(signing.load_secret(env, Path.home()), world.job_id, world.step_id)
    records = Scope(open_exec_store(world, command, keys), SCOPE, world.agent_index, keys)
    me = world.agent_index
    # Joined before CMD starts: node 0 tells a node that never came from one still running.
    mine = {f"joined/{me}": {"i": me, "host": world.host, "pid": os.getpid()}}
    records.put(f"joined/{me}", mine[f"joined/{me}"])
    with LocalRun(command.argv, env, command.timeout) as local:
        if me == 0:
            return _lead(records, world, command, local)
        result = local.result(me, world.host)
    mine[f"result/{me}"] = asdict(result)
    records.put(f"result/{me}", mine[f"result/{me}"])
    _stay_until_read(records, mine)
    return exit_status(result)


def open_exec_store(world: World, command: ExecCommand, keys: Any) -> Any:
    """Node 0 hosts the exec store (keys under the job's secret namespace + exec/), the other
    nodes connect."""
    from agent.node.store import Endpoint, Store

    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    endpoint = Endpoint(world.master_addr, exec_port(world, command.flags))
    if world.agent_index == 0:
        return Store.host(endpoint, keys.namespace, f"{world.host} (node 0)")
    who = "node 0's exec agent" + (f" ({world.hosts[0]})" if world.hosts else "")
    return Store.connect(endpoint, keys.namespace, command.rdzv_timeout, who)


def _stay_until_read(records: Any, mine: dict[str, dict[str, Any]]) -> None:
    """A node other than 0, once it reported: until node 0 has read every result (its sealed
    `done`) or is gone, our records are looked at every RECHECK seconds and written again when
    an outsider deleted or garbled them (node 0 waits for them: a deletion only delays it)."""
    done = records.key("done")
    with contextlib.suppress(Exception):  # node 0's store closed: it has what it needs
        while True:
            if records.store.wait([done], RECHECK):
                if records.get_if("done", "exec done record") is not None:
                    return
                time.sleep(RECHECK)  # a value that does not open: not node 0's word
            for name, record in mine.items():
                if records.get_if(name, "exec record") is None:
                    log.warning("%s is gone or does not open; written again", records.key(name))
                    records.put(name, record)


def _lead(records: Any, world: World, command: ExecCommand, local: LocalRun) -> int:
    """Node 0: wait for joins (bounded), its own command, then the others' results; every record
    read sealed, a value that does not open waited past within the phase's bound."""
    others = range(1, world.agents)
    joins = {i: f"joined/{i}" for i in others}
    own: NodeOutput | None = None
    interrupted: Interrupted | None = None
    joined: dict[int, dict[str, Any]] = {}
    results: dict[int, dict[str, Any]] = {}
    forged: set[int] = set()
    try:
        rdzv = time.monotonic() + command.rdzv_timeout
        joined, _ = _sealed(records, joins, "exec join record", rdzv)
        own = local.result(0, world.host)
        late, _ = _sealed(records, {i: n for i, n in joins.items() if i not in joined}, "", 0.0)
        joined.update(late)  # joined while node 0's command ran: waited for as well
        deadline = None if command.timeout is None else time.monotonic() + command.timeout + _SLACK
        awaited = {i: f"result/{i}" for i in others if i in joined}
        results, forged = _sealed(records, awaited, "exec result", deadline)
        rest = {i: f"result/{i}" for i in others if i not in joined}
        results.update(_sealed(records, rest, "exec result", 0.0)[0])  # a join that was garbled
        with contextlib.suppress(Exception):
            records.put("done", {})  # the others may go
    except Interrupted as exc:
        interrupted = exc
    if own is None:  # interrupted while it ran: show what it printed so far
        local.kill()
        own = replace(local.result(0, world.host), code=None, missing="interrupted")
    gone = "interrupted" if interrupted else "no result in time"
    never = "never joined" + ("" if interrupted else f" within {command.rdzv_timeout:g}s")
    outputs = [own]
    for i in others:
        host = world.hosts[i] if i < len(world.hosts) else f"node {i}"
        if i in results:
            outputs.append(_output(i, host, results[i]))
            continue
        why = never if i not in joined else gone
        tampered = i in forged and not interrupted
        if tampered:
            why = f"{TAMPERING} at {records.key(f'result/{i}')}"
        outputs.append(NodeOutput(i, host, "", None, missing=why, tampered=tampered))
    code = _report(outputs)
    return 128 + interrupted.signum if interrupted else code


def _sealed(
    records: Any, names: dict[int, str], what: str, deadline: float | None
) -> tuple[dict[int, dict[str, Any]], set[int]]:
    """Each node's sealed record among `names` (node → name) that is there by `deadline`
    (None: however long it takes; waits sliced so Ctrl-C gets through). A value that does not
    open is absent: logged once and read again, less and less often. Returns the records, and
    the nodes whose key held such a value when the wait ended."""
    store = records.store
    found: dict[int, dict[str, Any]] = {}
    forged: set[int] = set()
    pending = dict(names)
    pause, look = POLL_FIRST, True
    while True:
        for i, name in list(pending.items()) if look else ():
            key = records.key(name)
            if not store.exists(key):
                forged.discard(i)
                continue
            try:
                found[i] = records.keys.unseal(store.get_bytes(key, present=True), key, what)
            except Refused as exc:
                tell_refused(key, exc)
                forged.add(i)
                continue
            forged.discard(i)
            del pending[i]
        if not pending:
            return found, forged
        left = _SLICE if deadline is None else min(_SLICE, deadline - time.monotonic())
        if left <= 0:
            if look:
                return found, forged
            look = True  # one last look at the deadline
            deadline = None if deadline is None else time.monotonic()
            continue
        if forged:
            time.sleep(min(pause, left))
            pause, look = min(pause * 2, POLL_MAX), True
        else:
            look = store.wait([records.key(name) for name in pending.values()], left)


def _output(index: int, host: str, data: dict[str, Any]) -> NodeOutput:
    code = data.get("code")
    return NodeOutput(
        node=index,  # from the key, not the record: a node speaks only for its own slot
        host=str(data.get("host") or host),
        output=str(data.get("output", "")),
        code=code if isinstance(code, int) and not isinstance(code, bool) else None,
        timed_out=bool(data.get("timed_out")),
        missing=str(data.get("missing", "")),
    )


def _report(results: Sequence[NodeOutput]) -> int:
    groups = collate(results)
    sys.stdout.write(render(groups))
    sys.stdout.flush()
    failed = failures(groups)
    if failed:
        print(f"agent: exec: failed on {failed}", file=sys.stderr)
    return verdict(results)
