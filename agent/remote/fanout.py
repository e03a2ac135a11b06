"""CMD on every node: join node 0's exec store, publish sealed results; node 0 collates them."""

from __future__ import annotations

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
from agent.remote.cli import ExecCommand
from agent.remote.collate import NodeOutput, collate, failures, render
from agent.remote.local import KILL_GRACE, LocalRun, exit_status
from agent.world import PORT_HIGH, PORT_LOW, World, WorldFlags, derive_port, world_from_env

_SLICE = 1.0  # store waits are sliced so that Ctrl-C reaches Python between slices
_SLACK = KILL_GRACE + 5.0  # how long after --timeout node 0 still waits for a node's result


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
    from agent.node.trust import JobKeys

    keys = JobKeys.derive(signing.load_secret(env, Path.home()), world.job_id, world.step_id)
    store = open_exec_store(world, command, keys)
    # Joined before CMD starts: node 0 tells a node that never came from one still running.
    store.set_json(store.key("joined", world.agent_index), 1)
    with LocalRun(command.argv, env, command.timeout) as local:
        if world.agent_index == 0:
            return _lead(store, world, command, local, keys)
        result = local.result(world.agent_index, world.host)
        key = store.key("result", world.agent_index)
        store.set_bytes(key, keys.seal(asdict(result), key))
        return exit_status(result)


def open_exec_store(world: World, command: ExecCommand, keys: Any) -> Any:
    """Node 0 hosts the exec store (keys under the job's secret namespace + exec/), the other
    nodes connect."""
    from agent.node.store import Endpoint, Store

    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    endpoint = Endpoint(world.master_addr, exec_port(world, command.flags))
    ns = keys.namespace + "exec/"
    if world.agent_index == 0:
        return Store.host(endpoint, ns, f"{world.host} (node 0)")
    who = "node 0's exec agent" + (f" ({world.hosts[0]})" if world.hosts else "")
    return Store.connect(endpoint, ns, command.rdzv_timeout, who)


def _lead(store: Any, world: World, command: ExecCommand, local: LocalRun, keys: Any) -> int:
    """Node 0: wait for joins (bounded), its own command, then the others' results."""
    others = range(1, world.agents)
    own: NodeOutput | None = None
    interrupted: Interrupted | None = None
    try:
        _wait_keys(
            store, [store.key("joined", i) for i in others], time.monotonic() + command.rdzv_timeout
        )
        own = local.result(0, world.host)
        joined = [i for i in others if store.exists(store.key("joined", i))]
        deadline = None if command.timeout is None else time.monotonic() + command.timeout + _SLACK
        _wait_keys(store, [store.key("result", i) for i in joined], deadline)
    except Interrupted as exc:
        interrupted = exc
    if own is None:  # interrupted while it ran: show what it printed so far
        local.kill()
        own = replace(local.result(0, world.host), code=None, missing="interrupted")
    late = "interrupted" if interrupted else "no result in time"
    never = "never joined" + ("" if interrupted else f" within {command.rdzv_timeout:g}s")
    results = [own] + [_result_of(store, i, world, keys, late, never) for i in others]
    code = _report(results)
    return 128 + interrupted.signum if interrupted else code


def _wait_keys(store: Any, keys: list[str], deadline: float | None) -> None:
    """Block until every key exists or the deadline passes; sliced, so Ctrl-C gets through."""
    while True:
        left = _SLICE if deadline is None else min(_SLICE, deadline - time.monotonic())
        if left <= 0 or store.wait(keys, left):
            return


def _result_of(
    store: Any, index: int, world: World, keys: Any, late: str, never: str
) -> NodeOutput:
    host = world.hosts[index] if index < len(world.hosts) else f"node {index}"
    key = store.key("result", index)
    if not store.exists(key):
        joined = store.exists(store.key("joined", index))
        return NodeOutput(index, host, "", None, missing=late if joined else never)
    from agent.node.sealed import tell_refused
    from agent.node.trust import Refused

    try:
        data = keys.unseal(store.get_bytes(key), key, f"the exec result of node {index}")
    except Refused as exc:  # an outsider's value: no answer from that node
        tell_refused(key, exc)
        return NodeOutput(index, host, "", None, missing=late)
    return NodeOutput(
        node=index,  # from the key, not the record: a node speaks only for its own slot
        host=str(data.get("host") or host),
        output=str(data.get("output", "")),
        code=None if data.get("code") is None else int(data["code"]),
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
