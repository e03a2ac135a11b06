"""Paused ranks without agents: the text (pure, tables), and a real rank process pausing at
breakpoint() / at its exception (--pdb), reached through two nodes' desks over one in-process
store, as `agent debug` reaches them through node 0."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.hang.desk import StackDesk
from agent.hang.watch import HangWatch
from agent.node.local_store import LocalStore
from agent.node.scope import Scope
from agent.node.stage import Stage
from agent.node.store import Endpoint, Store
from agent.node.trust import JobKeys
from agent.pause import hook, post_mortem
from agent.pause.desk import PauseDesk
from agent.pause.frames import encode, read
from agent.pause.link import GONE, PROMPT
from agent.pause.paused import Paused, console_line, render_answers, render_list
from agent.plan.ranks import (
    BREAKPOINT_HOOK,
    POST_MORTEM_MODULE,
    Launch,
    Placement,
    rank_argv,
    rank_env,
)

REPO = Path(__file__).resolve().parent.parent


def _paused(rank: int, line: int = 42, host: str = "n1", reason: str = "breakpoint") -> Paused:
    return Paused(rank, host, 100 + rank, "/w/train.py", line, "step", reason)


def test_the_console_line_names_the_command_that_opens_the_session():
    assert console_line(_paused(3), "logs/77.0") == (
        "rank 3 paused at train.py:42 in step (breakpoint): python -m agent debug logs/77.0 --rank 3"
    )


@pytest.mark.parametrize(
    ("paused", "expected"),
    [
        ([], "no rank is paused\n"),
        ([_paused(1)], "rank 1 (n1): /w/train.py:42 in step (breakpoint)\n"),
        (
            [_paused(2, host="n2"), _paused(0), _paused(1, 7), _paused(3, host="n2")],
            "ranks 0,2-3 (n1, n2): /w/train.py:42 in step (breakpoint)\n"
            "rank 1 (n1): /w/train.py:7 in step (breakpoint)\n",
        ),
    ],
)
def test_the_list_groups_ranks_by_where_they_paused(paused, expected):
    assert render_list(paused) == expected


def test_identical_answers_are_shown_once_under_their_ranks():
    rule = "-" * 16
    assert render_answers({(3, 30): "42\n", (0, 10): "42\n", (1, 11): "7\n"}) == (
        f"{rule}\nranks 0,3\n{rule}\n42\n{rule}\nrank 1\n{rule}\n7\n"
    )


def test_a_rank_with_several_paused_processes_is_named_by_process():
    rule = "-" * 16
    answers = {(0, 10): "7\n", (1, 11): "42\n", (1, 12): "7\n"}  # rank 1 forked a worker
    assert render_answers(answers) == (
        f"{rule}\nranks 0, 1 (pid 12)\n{rule}\n7\n{rule}\nrank 1 (pid 11)\n{rule}\n42\n"
    )
    worker = Paused(1, "n1", 12, "/w/data.py", 9, "__getitem__", "breakpoint")
    assert render_list([_paused(1), worker]) == (
        "rank 1 (pid 12) (n1): /w/data.py:9 in __getitem__ (breakpoint)\n"
        "rank 1 (pid 101) (n1): /w/train.py:42 in step (breakpoint)\n"
    )
    assert console_line(worker, "logs/7", pid=True).endswith("debug logs/7 --rank 1 --pid 12")


@pytest.mark.parametrize(
    "record",
    [
        None,
        [],
        {"rank": "1"},
        {**_paused(1).to_json(), "line": True},
        {**_paused(1).to_json(), "file": 3},
    ],
)
def test_a_record_from_another_node_that_is_not_one_is_refused(record):
    with pytest.raises(ValueError):
        Paused.from_json(record)


def test_a_record_round_trips_with_long_text_cut():
    long = {**_paused(1).to_json(), "function": "f" * 5000}
    assert Paused.from_json(_paused(1).to_json()) == _paused(1)
    assert len(Paused.from_json(long).function) == 512


def test_the_plan_names_the_hook_and_the_post_mortem_runner_as_they_are():
    assert BREAKPOINT_HOOK == hook.HOOK
    assert POST_MORTEM_MODULE == post_mortem.MODULE


def _launch(**kw) -> Launch:
    base = dict(
        job_id="1", step_id="0", world_size=2, nnodes=1, master_addr="h", master_port=1,
        attempt=0, max_restarts=0, log_dir="/l", config_file="", command=("py", "train.py", "a"),
    )  # fmt: skip
    return Launch(**{**base, **kw})


def test_ranks_pause_at_breakpoint_unless_the_user_chose_a_hook():
    env = rank_env(_launch(), 0, 0, 1, 0, Placement(), "/e", {})
    assert env["PYTHONBREAKPOINT"] == BREAKPOINT_HOOK and "AGENT_DEBUG_TIMEOUT" not in env
    theirs = rank_env(
        _launch(), 0, 0, 1, 0, Placement(), "/e", {"PYTHONBREAKPOINT": "ipdb.set_trace"}
    )
    assert "PYTHONBREAKPOINT" not in theirs  # the rank inherits the user's own


@pytest.mark.parametrize(
    ("command", "script_at", "expected"),
    [
        (("py", "train.py", "a"), 1, ("py", "-m", POST_MORTEM_MODULE, "train.py", "a")),
        (("py", "-m", "pkg", "a"), 2, ("py", "-m", POST_MORTEM_MODULE, "-m", "pkg", "a")),
        (("./train.sh", "a"), 0, ("./train.sh", "a")),  # --no-python: nothing to run it under
    ],
)
def test_pdb_runs_the_script_under_the_post_mortem_runner(command, script_at, expected):
    launch = _launch(command=command, script_at=script_at, pdb_timeout=60.0)
    assert rank_argv(launch, 0, 0, 0) == expected
    assert rank_env(launch, 0, 0, 1, 0, Placement(), "/e", {})["AGENT_DEBUG_TIMEOUT"] == "60"


# -- a real rank, two desks over one store -------------------------------------------------
class Nodes:
    """Node 0 (asks) and node 1 (holds the rank) over one in-process store."""

    def __init__(self, directory: str, **bounds: Any) -> None:
        store = Store(LocalStore(), Endpoint("127.0.0.1", 1), "t/")
        keys = JobKeys.derive(b"pause-test", "job", "0")
        self.said: list[Paused] = []
        scopes = [Scope(store, "r0/a0", node, keys) for node in (0, 1)]
        self.stacks = [StackDesk(scope, [0, 1], f"h{scope.index}", list) for scope in scopes]
        self.desks = [
            PauseDesk(
                scope,
                stacks,
                f"h{scope.index}",
                directory if scope.index == 1 else None,
                Stage(0, 0),
                lambda paused, pid: self.said.append(paused),
                **bounds,
            )
            for scope, stacks in zip(scopes, self.stacks, strict=True)
        ]
        for stacks, desk in zip(self.stacks, self.desks, strict=True):
            stacks.start()
            desk.start()

    def rank(self, *argv: str, timeout: float | None = None) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": "1", "PYTHONBREAKPOINT": hook.HOOK}
        env.update(self.desks[1].env())
        if timeout is not None:
            env[hook.TIMEOUT_ENV] = str(timeout)
        return subprocess.Popen(
            [sys.executable, *argv], env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def ask(self, request: dict) -> dict:
        merged: dict = {}
        for answer in self.desks[0].ask(request):
            merged.update((answer or {}).get("answers", {}))
            merged.setdefault("paused", []).extend((answer or {}).get("paused", []))
        return merged

    def wait_paused(self) -> list[dict]:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = self.ask({"op": "list"})["paused"]
            taken = self.ask({"op": "take", "ranks": [1], "wait": 5})
            if found and _one(taken)["state"] == PROMPT:
                return found
        raise AssertionError("the rank never paused")

    def close(self) -> None:
        self.stacks[0].end()
        for desk in self.desks:
            desk.close()


def _one(answers: dict) -> dict:
    """The answer of the one paused process (of rank 1) to a request."""
    [(key, answer)] = [(k, v) for k, v in answers.items() if k != "paused"]
    assert key.startswith("1:"), key
    return answer


@contextlib.contextmanager
def two_nodes(**bounds: Any) -> Iterator[Nodes]:
    with tempfile.TemporaryDirectory() as directory:
        os.chmod(directory, 0o700)
        pair = Nodes(directory, **bounds)
        yield pair
        pair.close()
        assert not os.listdir(directory), "the socket goes with the attempt"


@pytest.fixture
def nodes():
    with two_nodes() as pair:
        yield pair


def test_breakpoint_pauses_the_rank_until_pdb_continues_it(nodes, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("x = 40 + 2\nbreakpoint()\nprint('after', x)\n")
    rank = nodes.rank(str(script))
    [found] = nodes.wait_paused()
    assert (found["rank"], found["host"], found["line"], found["reason"]) == (
        1,
        "h1",
        3,
        "breakpoint",
    )
    assert nodes.desks[1].paused() and not nodes.desks[0].paused()
    assert nodes.said == [Paused.from_json(found)], "the console is told once"
    answer = _one(nodes.ask({"op": "send", "ranks": [1], "line": "p x", "wait": 10}))
    assert answer == {"output": "42\n", "state": PROMPT}
    gone = _one(nodes.ask({"op": "send", "ranks": [1], "line": "c", "wait": 10}))
    assert gone["state"] == GONE
    out, err = rank.communicate(timeout=30)
    assert (rank.returncode, out) == (0, "after 42\n"), err
    assert not nodes.desks[1].paused()
    assert nodes.ask({"op": "list"})["paused"] == []


def test_post_mortem_pauses_at_the_raising_frame_then_the_rank_fails_with_it(nodes, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("def step(batch):\n    raise ValueError(f'bad {batch}')\n\nstep(7)\n")
    rank = nodes.rank("-m", post_mortem.MODULE, str(script), timeout=60)
    [found] = nodes.wait_paused()
    assert (found["function"], found["line"], found["reason"]) == (
        "step",
        2,
        "exception: ValueError: bad 7",
    )
    assert (
        _one(nodes.ask({"op": "send", "ranks": [1], "line": "p batch", "wait": 10}))["output"]
        == "7\n"
    )
    assert _one(nodes.ask({"op": "send", "ranks": [1], "line": "q", "wait": 10}))["state"] == GONE
    _, err = rank.communicate(timeout=30)
    assert rank.returncode == 1 and err.rstrip().endswith("ValueError: bad 7"), err


def test_a_failed_rank_nobody_debugs_goes_on_to_fail_after_the_debug_timeout(nodes, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("raise KeyError('k')\n")
    start = time.monotonic()
    rank = nodes.rank("-m", post_mortem.MODULE, str(script), timeout=0.5)
    _, err = rank.communicate(timeout=30)
    assert rank.returncode == 1 and "KeyError: 'k'" in err, err
    assert time.monotonic() - start < 20  # a hang catcher: the timeout is 0.5 s
    assert "--debug-timeout passed" in err


def test_without_the_agents_socket_a_rank_gets_plain_pdb(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("x = 5\nbreakpoint()\nprint('after', x)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONBREAKPOINT": hook.HOOK}
    env.pop(hook.SOCKET_ENV, None)
    done = subprocess.run(
        [sys.executable, str(script)], env=env, input="p x\nc\n", capture_output=True, text=True,
        timeout=30,
    )  # fmt: skip
    assert done.returncode == 0 and "(Pdb) 5" in done.stdout and "after 5" in done.stdout


def test_a_node_with_a_paused_rank_is_not_quiet():
    store = Store(LocalStore(), Endpoint("127.0.0.1", 1), "t/")
    scope = Scope(store, "r0/a0", 0, JobKeys.derive(b"hang-test", "job", "0"))
    paused = [True]
    clock = [100.0]
    watch = HangWatch(scope, agent=0, node_rank=0, host="h0", timeout=5,
                      paused=lambda: paused[0], clock=lambda: clock[0])  # fmt: skip
    watch.started([0])
    watch.tick(3600)
    assert not watch.quiet
    paused[0] = False  # it just went on: the clock starts now, not at its last output
    clock[0] += 1.0
    watch.tick(3600)
    assert not watch.quiet and scope.get_if("standing/0", "standing")["quiet"] is False
    clock[0] += 5.0  # --hang-timeout after it went on, silent since
    watch.tick(3600)
    assert watch.quiet and scope.get_if("standing/0", "standing")["quiet"] is True


def test_the_live_table_shows_a_paused_rank_as_paused():
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from agent.console.live import LiveView

    now = time.monotonic()
    pipe = SimpleNamespace(last_output=now - 1000)  # silent far beyond --hang-warning
    worker = SimpleNamespace(
        spec=SimpleNamespace(rank=1, host="n1"), out=pipe, err=pipe, returncode=None,
        proc=SimpleNamespace(pid=os.getpid()),
    )  # fmt: skip
    screen = io.StringIO()
    view = LiveView(Console(file=screen, width=120), hang_warning=300)
    view.start([worker])
    view.paused = lambda: {1}
    view.stop()
    assert "paused (pdb)" in screen.getvalue() and "HUNG?" not in screen.getvalue()


class _Session:
    """What DebugService asks of node 0's session: the attempt's pause desk."""

    def __init__(self, pauses: PauseDesk) -> None:
        self.pauses = pauses


def _service_pair(nodes):
    """A client's channel to node 0's DebugService (a real channel over a socket pair), the
    service answering on a thread of its own as node 0's endpoint would."""
    import socket
    import threading

    from agent.control.channel import CLIENT, SERVER, Channel
    from agent.control.debug_service import DebugService

    key = os.urandom(32)
    mine, theirs = socket.socketpair()
    client = Channel(mine, key, CLIENT, "node 0", 30.0)
    server = Channel(theirs, key, SERVER, "client", 30.0)
    service = DebugService(_Session(nodes.desks[0]))

    def serve(first: dict) -> threading.Thread:
        thread = threading.Thread(target=service.handle, args=(server, first), daemon=True)
        thread.start()
        return thread

    return client, serve


@pytest.mark.parametrize("size", [1_500_000, 9_000_000])  # P7: over a frame; P8: over a value
def test_a_pdb_line_over_the_limit_is_refused_and_the_rank_stays_paused(nodes, tmp_path, size):
    script = tmp_path / "train.py"
    script.write_text("x = 40 + 2\nbreakpoint()\nprint('after', x)\n")
    rank = nodes.rank(str(script))
    nodes.wait_paused()
    client, serve = _service_pair(nodes)
    command = {"op": "debug", "action": "command", "ranks": [1], "line": "p '" + "y" * size}
    serve(command).join(30)
    refused = client.recv(30)
    assert refused["code"] == 2 and "limit" in refused["error"] and "\n" not in refused["error"]
    serve({"op": "debug", "action": "attach", "rank": 1, "client": "test"})
    assert client.recv(30)["attached"]["rank"] == 1
    client.send({"line": "p '" + "y" * size + "'"})
    answer = client.recv(30)
    assert answer["state"] == PROMPT and answer["output"].count("\n") == 1
    assert "refused" in answer["output"] and "stays paused" in answer["output"]
    client.send({"line": "p x"})
    assert client.recv(30) == {"output": "42\n", "state": PROMPT}  # the same session goes on
    client.send({"line": "c"})
    assert client.recv(30)["state"] == GONE
    out, err = rank.communicate(timeout=30)
    assert (rank.returncode, out) == (0, "after 42\n"), err


def test_two_processes_of_one_rank_pause_at_once_and_each_is_reached(nodes, tmp_path):
    """P10: a rank and the worker it forked stop at breakpoint() together: both are listed by
    (rank, pid), -c reaches both, --rank alone asks which pid, each session is its own."""
    script = tmp_path / "train.py"
    script.write_text(
        "import os, sys\n"
        "worker = os.fork()\n"  # a DataLoader worker, say
        "x = 42 if worker else 7\n"
        "breakpoint()\n"
        "print('after', x, flush=True)\n"
        "if worker:\n"
        "    sys.exit(os.waitstatus_to_exitcode(os.waitpid(worker, 0)[1]))\n"
    )
    rank = nodes.rank(str(script))
    deadline = time.monotonic() + 30
    while len(listed := nodes.ask({"op": "list"})["paused"]) < 2:
        assert time.monotonic() < deadline, f"both processes never paused: {listed}"
    pids = sorted(item["pid"] for item in listed)
    assert rank.pid in pids and {item["rank"] for item in listed} == {1}
    worker = next(pid for pid in pids if pid != rank.pid)
    assert len(nodes.said) == 2, "the console is told of each process"
    client, serve = _service_pair(nodes)

    serve({"op": "debug", "action": "command", "ranks": [1], "line": "p x"}).join(30)
    answers = client.recv(30)["answers"]
    assert {k: v["output"] for k, v in answers.items()} == {
        f"1:{rank.pid}": "42\n",
        f"1:{worker}": "7\n",
    }
    serve({"op": "debug", "action": "attach", "rank": 1, "client": "test"}).join(30)
    which = client.recv(30)
    assert which["code"] == 2 and "--pid" in which["error"] and str(worker) in which["error"]
    serve({"op": "debug", "action": "attach", "rank": 1, "pid": worker, "client": "test"})
    assert client.recv(30)["attached"]["pid"] == worker
    client.send({"line": "p x"})
    assert client.recv(30) == {"output": "7\n", "state": PROMPT}
    client.send({"line": "c"})
    assert client.recv(30)["state"] == GONE
    client.send({"detach": True})
    assert [item["pid"] for item in nodes.ask({"op": "list"})["paused"]] == [rank.pid]
    serve({"op": "debug", "action": "command", "ranks": [1], "line": "c"}).join(30)
    assert list(client.recv(30)["answers"]) == [f"1:{rank.pid}"]  # the one still paused
    out, err = rank.communicate(timeout=30)
    assert rank.returncode == 0 and sorted(out.splitlines()) == ["after 42", "after 7"], err


# -- the socket's bounds ---------------------------------------------------------------------
def _connect(nodes: Nodes) -> tuple[socket.socket, Any]:
    """A process of the node's user on the desk's socket, greeted (a raw client, not the hook)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(nodes.desks[1].path or "")
    stream = sock.makefile("rb")
    assert read(stream) == {"welcome": True}
    return sock, stream


def _stopped(nodes: Nodes, pid: int) -> socket.socket:
    """A process stopped in pdb, as far as the desk can tell (it said so, and waits)."""
    sock, _ = _connect(nodes)
    where = {"file": "/w/loader.py", "line": 7, "function": "get", "reason": "breakpoint"}
    sock.sendall(encode({"hello": {"rank": 1, "pid": pid}}) + encode({"paused": where}))
    return sock


def _ended(stream: Any) -> bool:
    """Whether the desk closed its end: end-of-file, or a reset (a unix socket closed with bytes
    it never read resets its peer)."""
    try:
        return stream.read() == b""
    except ConnectionResetError:
        return True


def _listed(nodes: Nodes, count: int) -> list[int]:
    deadline = time.monotonic() + 30
    while len(pids := [item["pid"] for item in nodes.ask({"op": "list"})["paused"]]) != count:
        assert time.monotonic() < deadline, f"{count} paused processes never listed: {pids}"
    return pids


def test_a_process_beyond_the_desks_cap_is_told_why_and_runs_on(tmp_path):
    """One desk holds `max_links` connections; the next process to pause is told why in one line
    on its own stderr and runs on as without a debugger (plain pdb on /dev/null would end it in
    BdbQuit); once one of them leaves, the next one pauses again."""
    script = tmp_path / "train.py"
    script.write_text("x = 40 + 2\nbreakpoint()\nprint('after', x)\n")
    with two_nodes(max_links=2) as nodes:
        held = [_stopped(nodes, pid) for pid in (101, 102)]
        assert sorted(_listed(nodes, 2)) == [101, 102]
        rank = nodes.rank(str(script))
        out, err = rank.communicate(timeout=30)
        assert (rank.returncode, out) == (0, "after 42\n"), err
        [said] = [line for line in err.splitlines() if "[agent]" in line]
        assert "holds 2 processes paused in pdb already" in said, said
        assert "breakpoint() skipped" in said, said
        assert sorted(_listed(nodes, 2)) == [101, 102], "the refused process was never listed"

        held.pop().close()
        _listed(nodes, 1)
        rank = nodes.rank(str(script))
        assert rank.pid in _listed(nodes, 2)
        request = {"op": "send", "procs": [[1, rank.pid]], "line": "c", "wait": 10}
        assert _one(nodes.ask(request))["state"] == GONE
        out, err = rank.communicate(timeout=30)
        assert (rank.returncode, out) == (0, "after 42\n"), err
        for sock in held:
            sock.close()


def test_a_line_sent_between_the_stop_and_pdbs_first_prompt_reaches_pdb():
    """`debug --list` shows a rank as soon as it says where it stopped, before pdb asks for its
    first line; a `c` sent in that gap waits for the prompt (within its `wait`) and reaches pdb,
    rather than coming back "busy" and being lost."""
    with two_nodes() as nodes:
        sock, stream = _connect(nodes)
        where = {"file": "/w/loader.py", "line": 7, "function": "get", "reason": "breakpoint"}
        sock.sendall(encode({"hello": {"rank": 1, "pid": 4242}}) + encode({"paused": where}))
        assert _listed(nodes, 1) == [4242]
        answers: list[dict] = []
        request = {"op": "send", "procs": [[1, 4242]], "line": "c", "wait": 30}
        sender = threading.Thread(target=lambda: answers.append(nodes.ask(request)))
        sender.start()
        sender.join(0.5)  # a request that is dropped comes back at once
        assert sender.is_alive(), f"the line was not held for the prompt: {answers}"
        sock.sendall(encode({"out": "(Pdb) "}) + encode({"ready": "(Pdb) "}))
        assert read(stream) == {"line": "c"}, "pdb never got the line"
        sock.sendall(encode({"running": True, "done": True}))
        sender.join(30)
        assert _one(answers[0])["state"] == GONE
        sock.close()


@pytest.mark.parametrize(
    "says",
    [
        b"",  # nothing at all
        b'{"hello": {"rank": 1, "pid": 5}}\n',  # who it is, never where it stopped
        b'{"hello": {"ra',  # less than a line
        b"{" + b" " * (2 << 20),  # a line over a frame's 1 MiB: let go at once
    ],
    ids=["silent", "hello-only", "half-a-line", "oversized"],
)
def test_a_process_that_never_says_where_it_stopped_is_let_go(says):
    """A connecting process has `handshake` seconds to say who it is and where it stopped, in
    frames of 1 MiB at most; then the desk closes its end (its thread and descriptor are free)."""
    with two_nodes(handshake=0.5) as nodes:
        sock, stream = _connect(nodes)
        start = time.monotonic()
        with contextlib.suppress(OSError):  # the oversized line: the desk stops reading it
            sock.sendall(says)
        assert _ended(stream), "the desk closed its end"
        assert time.monotonic() - start < 10  # a hang catcher: the handshake is 0.5 s
        assert nodes.ask({"op": "list"})["paused"] == []
        sock.close()


def _links() -> int:
    return sum(thread.name == "pause-link" for thread in threading.enumerate())


def test_every_connection_goes_with_the_attempt_stopped_or_not():
    """The attempt's end closes every connection its desk took, not only the paused ones: a
    process that said hello and waits is let go, and its link's thread ends."""
    before = _links()
    with two_nodes(handshake=60) as nodes:
        sock, stream = _connect(nodes)
        sock.sendall(encode({"hello": {"rank": 1, "pid": 5}}))
        paused = _stopped(nodes, 6)
        _listed(nodes, 1)
    assert _ended(stream), "the desk closed its end"
    paused.settimeout(30)
    assert paused.recv(4096) == b"", "the desk closed the paused one's end too"
    deadline = time.monotonic() + 30
    while _links() > before:
        assert time.monotonic() < deadline, "a link's thread outlived its attempt"
        time.sleep(0.01)  # polling a thread count: nothing to wait on
    sock.close()
    paused.close()


_SHORT_OF_FDS = textwrap.dedent(
    """
    import json, os, resource, socket, sys, threading, time
    from agent.pause import acceptor

    resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    path = sys.argv[1]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    taken = threading.Event()
    acceptor.register(listener, lambda conn: taken.set())
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # made while descriptors remain
    hogs = []
    try:
        while True:
            hogs.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    client.connect(path)  # the kernel's backlog takes it: accept() now fails with EMFILE
    wall, cpu = time.monotonic(), time.process_time()
    time.sleep(2.0)  # the window measured, not a synchronisation
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    early = taken.is_set()
    for fd in hogs:
        os.close(fd)
    print(json.dumps({"wall": wall, "cpu": cpu, "early": early, "taken": taken.wait(30)}))
    """
)


def test_the_acceptor_waits_without_spinning_while_the_process_has_no_descriptor_left(tmp_path):
    """A rank that pauses while its agent has no descriptor left waits in the kernel's backlog;
    the agent's accept thread tries again every SHORT_OF_FDS seconds, not in a busy loop (the
    process's CPU time over 2 s stays far below a spinning thread's), and takes it once
    descriptors are free."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", _SHORT_OF_FDS, str(tmp_path / "s.sock")], env=env,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert not seen["early"] and seen["taken"], seen
    # A spinning accept thread holds a core (or what the machine's load leaves it, well above
    # a fifth of it); retrying ten times a second costs a few milliseconds.
    assert seen["cpu"] < 0.2 * seen["wall"], seen
