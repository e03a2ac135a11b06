"""`python -m agent exec -- CMD`: CMD on every node; node 0 prints the outputs collated (pdsh + dshbak -c).

Every node's agent joins a store hosted by the node-0 agent (namespace `la/<job>/<step>/exec/`),
runs CMD with stdout and stderr captured together, and publishes {host, code, output}, signed.
Node 0 prints the groups of identical output under compressed hostlists and exits 0 when every
command succeeded, 1 when one failed, 3 when a node never reported, naming the nodes; the other
nodes print nothing but their own errors and exit with their command's status.

The store's port: --master-port, else the agent's port (MASTER_PORT, or derived from job and step
id) moved by half the derived range, so an exec never collides with an agent of the same step.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from agent.collate import NodeOutput, collate, failures, render
from agent.errors import AgentError, ExitCode
from agent.workers import CHILD_WRAPPER
from agent.world import PORT_HIGH, PORT_LOW, SOURCES, World, WorldFlags, derive_port, world_from_env

OUTPUT_CAP = 1 << 20  # bytes of output per node kept and sent to node 0
_GRACE = 2.0  # SIGTERM → SIGKILL, for a command past --timeout
_SLICE = 1.0  # store waits are sliced so that Ctrl-C reaches Python between slices
_SLACK = _GRACE + 5.0  # how long after --timeout node 0 still waits for a node's result


@dataclass(frozen=True)
class ExecCommand:
    flags: WorldFlags
    rdzv_timeout: float
    timeout: float | None
    argv: tuple[str, ...]


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached this agent: stop the command, report, exit 128 + signum."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signum)
        self.signum = signum


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, no usage dump
        raise AgentError(f"exec: {message} (see python -m agent exec --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m agent exec",
        description="Run CMD once on every node of the job step; node 0 prints the outputs "
        "collated like `pdsh CMD | dshbak -c`. Run it as `srun --ntasks-per-node=1 python -m "
        "agent exec -- CMD`.",
        epilog="Exit status on node 0: 0 every command succeeded, 1 a command failed, 2 bad "
        "input, 3 a node never reported, 4 a forged result, 128+N interrupted by signal N. "
        "Other nodes exit with their own command's status (124: timed out).",
        allow_abbrev=False,
    )
    parser.add_argument("--world", choices=SOURCES, default="auto", help="where the node list comes from (default: auto)")
    parser.add_argument("--nnodes", type=int, help="number of nodes (explicit world)")
    parser.add_argument("--node-rank", type=int, help="this node's index (explicit world)")
    parser.add_argument("--master-addr", help="node 0's address (explicit world)")
    parser.add_argument("--master-port", type=int, help="the exec store's port on node 0 (default: derived, see the module doc)")
    parser.add_argument("--rdzv-timeout", type=float, default=300.0, metavar="SECONDS", help="how long to wait for every node to join (default: 300)")
    parser.add_argument("--timeout", type=float, metavar="SECONDS", help="kill CMD after this long on each node (default: none)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command and its arguments")
    return parser


def parse(argv: Sequence[str]) -> ExecCommand:
    ns = build_parser().parse_args(list(argv))
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not command:
        raise AgentError("exec needs a command: python -m agent exec [OPTIONS] -- CMD [ARGS...]")
    for flag, value in (("--rdzv-timeout", ns.rdzv_timeout), ("--timeout", ns.timeout)):
        if value is not None and value <= 0:
            raise AgentError(f"exec {flag}={value:g}: pass a number of seconds above 0")
    flags = WorldFlags(ns.world, ns.nnodes, ns.node_rank, ns.master_addr, ns.master_port)
    return ExecCommand(flags, ns.rdzv_timeout, ns.timeout, tuple(command))


def exec_port(world: World, flags: WorldFlags) -> int:
    """--master-port as given; else the agent's port moved by half the range PORT_LOW..PORT_HIGH."""
    if flags.master_port is not None:
        return flags.master_port
    base = world.master_port if world.master_port is not None else derive_port(world.job_id, world.step_id)
    span = PORT_HIGH - PORT_LOW + 1
    return PORT_LOW + (base - PORT_LOW + span // 2) % span


def exit_status(result: NodeOutput) -> int:
    """This node's own exit code, shell-style: 124 timed out, 128+N killed by signal N."""
    if result.code is None:
        return int(ExitCode.RANK_FAILED)
    if result.timed_out:
        return 124
    return 128 - result.code if result.code < 0 else min(result.code, 255)


def verdict(results: Sequence[NodeOutput]) -> int:
    if any(r.code is None for r in results):
        return int(ExitCode.RENDEZVOUS)
    return int(ExitCode.OK) if all(r.ok for r in results) else int(ExitCode.RANK_FAILED)


# --- act -----------------------------------------------------------------------------------


def main(argv: Sequence[str], env: Mapping[str, str]) -> int:
    try:
        return run(parse(argv), env)
    except AgentError as exc:
        print(f"agent: error: {exc.message}", file=sys.stderr)
        return int(exc.code)
    except Interrupted as exc:
        return 128 + exc.signum


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
                return _print([local.result(0, world.host)])
        return _run_distributed(command, world, env)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _interrupt(signum: int, frame: Any) -> None:
    raise Interrupted(signum)


def _run_distributed(command: ExecCommand, world: World, env: Mapping[str, str]) -> int:
    from agent import signing
    from agent.store import Endpoint, Store, namespace

    secret = signing.load_secret(env, Path.home())
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    endpoint = Endpoint(world.master_addr, exec_port(world, command.flags))
    ns = namespace(world.job_id, world.step_id) + "exec/"
    if world.agent_index == 0:
        store = Store.host(endpoint, ns, f"{world.host} (node 0)")
    else:
        who = "node 0's exec agent" + (f" ({world.hosts[0]})" if world.hosts else "")
        store = Store.connect(endpoint, ns, command.rdzv_timeout, who)
    # Joined before CMD starts: node 0 tells a node that never came from one still running.
    store.set_json(store.key("joined", world.agent_index), 1)
    with LocalRun(command.argv, env, command.timeout) as local:
        if world.agent_index == 0:
            return _lead(store, world, command, local, secret)
        result = local.result(world.agent_index, world.host)
        store.set_bytes(store.key("result", world.agent_index), signing.seal(asdict(result), secret))
        return exit_status(result)


def _lead(store, world: World, command: ExecCommand, local: LocalRun, secret: bytes) -> int:
    """Node 0: wait for joins (bounded), its own command, then the others' results."""
    others = range(1, world.agents)
    own: NodeOutput | None = None
    interrupted: Interrupted | None = None
    try:
        _wait_keys(store, [store.key("joined", i) for i in others], time.monotonic() + command.rdzv_timeout)
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
    results = [own] + [_result_of(store, i, world, secret, late, never) for i in others]
    code = _print(results)
    return 128 + interrupted.signum if interrupted else code


def _wait_keys(store, keys: list[str], deadline: float | None) -> bool:
    """Block until every key exists or the deadline passes; sliced, so Ctrl-C gets through."""
    while True:
        left = _SLICE if deadline is None else min(_SLICE, deadline - time.monotonic())
        if left <= 0:
            return False
        if store.wait(keys, left):
            return True


def _result_of(store, index: int, world: World, secret: bytes, late: str, never: str) -> NodeOutput:
    from agent.signing import unseal

    host = world.hosts[index] if index < len(world.hosts) else f"node {index}"
    key = store.key("result", index)
    if not store.exists(key):
        joined = store.exists(store.key("joined", index))
        return NodeOutput(index, host, "", None, missing=late if joined else never)
    data = unseal(store.get_bytes(key), secret, f"the exec result of node {index}")
    return NodeOutput(
        node=index,  # from the key, not the record: a node speaks only for its own slot
        host=str(data.get("host") or host),
        output=str(data.get("output", "")),
        code=None if data.get("code") is None else int(data["code"]),
        timed_out=bool(data.get("timed_out")),
        missing=str(data.get("missing", "")),
    )


def _print(results: Sequence[NodeOutput]) -> int:
    groups = collate(results)
    sys.stdout.write(render(groups))
    sys.stdout.flush()
    failed = failures(groups)
    if failed:
        print(f"agent: exec: failed on {failed}", file=sys.stderr)
    return verdict(results)


class LocalRun:
    """CMD on this node. Output goes to an unnamed temp file: nothing blocks on a full pipe, and a
    daemonised grandchild holding the output open cannot keep us waiting."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], timeout: float | None) -> None:
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._out = tempfile.TemporaryFile()  # noqa: SIM115 (closed by __exit__)
        self._timed_out = False
        # agent.child sets PDEATHSIG, so CMD dies with us even if we are SIGKILLed.
        wrapped = [sys.executable, "-S", "-E", CHILD_WRAPPER, str(os.getpid()), "-", "-", "preferred", "-", "--", *argv]
        self._proc = subprocess.Popen(
            wrapped, env=dict(env), stdin=subprocess.DEVNULL, stdout=self._out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )

    def __enter__(self) -> LocalRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        self._out.close()

    def result(self, node: int, host: str) -> NodeOutput:
        code = self._wait()
        return NodeOutput(node, host, self._output(), code, timed_out=self._timed_out)

    def kill(self) -> None:
        """Stop CMD's whole process group if it is still running (idempotent)."""
        if self._proc.poll() is None:
            self._signal(signal.SIGKILL)
            self._proc.wait()

    def _wait(self) -> int:
        try:
            left = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
            return self._proc.wait(left)
        except subprocess.TimeoutExpired:
            self._timed_out = True
            self._signal(signal.SIGTERM)
            try:
                return self._proc.wait(_GRACE)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                return self._proc.wait()

    def _signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signum)

    def _output(self) -> str:
        size = os.fstat(self._out.fileno()).st_size
        self._out.seek(0)
        text = self._out.read(OUTPUT_CAP).decode("utf-8", "replace")
        if size > OUTPUT_CAP:
            text += f"\n[agent exec: output truncated: first {OUTPUT_CAP} of {size} bytes shown]\n"
        return text
