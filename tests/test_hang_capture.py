"""Per-node stack capture against real processes: py-spy (plain and --native), the
faulthandler fallback, ranks that are gone or too slow, warm ranks, an unprivileged user; and
the parsers, on real py-spy and faulthandler output and on hostile variants of it."""

from __future__ import annotations

import faulthandler
import json
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.hang.capture import FALLBACK_SIGNAL, RankStack, ThreadStack, capture, fallback_path
from agent.hang.fallback import parse_faulthandler, registered
from agent.hang.pyspy import error_line, find_pyspy, parse_dump
from agent.hang.stacks import MAX_FRAMES, MAX_THREADS
from agent.run.workers import CHILD_WRAPPER, wrapper_argv
from agent.warm.zygote import Zygote

ROOT = Path(__file__).resolve().parents[1]
TARGET = str(ROOT / "tests" / "fixtures" / "hang_target.py")
TIMEOUT = 10.0  # generous: these CPUs are shared; the measured capture takes ~0.1 s
PYSPY = find_pyspy()
needs_pyspy = pytest.mark.skipif(PYSPY is None, reason="py-spy is not installed")
NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]


def wait_ready(proc: subprocess.Popen, timeout: float = 60) -> None:
    """Bounded wait for the target's "ready" line: its stack is in place from then on."""
    assert proc.stdout is not None
    seen = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while b"ready" not in seen and time.monotonic() < deadline:
            if selector.select(deadline - time.monotonic()):
                chunk = os.read(proc.stdout.fileno(), 4096)
                assert chunk, f"target ended: {proc.wait()} {proc.stderr.read()!r}"
                seen += chunk
    assert b"ready" in seen, "target never got ready"


@pytest.fixture
def start() -> Iterator:
    started: list[subprocess.Popen] = []

    def run(
        mode: str,
        fallback_dir: str | None = None,
        prefix: tuple[str, ...] = (),
        python: str = sys.executable,
        target: str = TARGET,
    ) -> int:
        command = [*prefix, python, target, mode, *([fallback_dir] if fallback_dir else [])]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        started.append(proc)
        wait_ready(proc)
        return proc.pid

    yield run
    for proc in started:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def main_thread(stack: RankStack) -> ThreadStack:
    assert stack.error is None, stack.error
    assert stack.threads[0].name == "MainThread", stack.threads
    return stack.threads[0]


def functions(thread: ThreadStack) -> list[str]:
    return [frame.function for frame in thread.frames]


def state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()[0]


# --- py-spy ----------------------------------------------------------------------------------


@needs_pyspy
def test_pyspy_names_the_function_each_rank_is_in(start):
    """A rank blocked in a pipe read and one spinning in pure Python: each one's main thread
    ends (innermost last) in its own function; the helpers waiting on an event are idle."""
    pids = [start("read"), start("spin")]
    began = time.monotonic()
    stacks = capture(list(enumerate(pids)), "n1", timeout=TIMEOUT)
    assert time.monotonic() - began < TIMEOUT
    assert [(s.rank, s.pid, s.host, s.method) for s in stacks] == [
        (0, pids[0], "n1", "py-spy"),
        (1, pids[1], "n1", "py-spy"),
    ]
    read, spin = (main_thread(s) for s in stacks)
    assert functions(read)[-3:] == ["<module>", "main", "stuck_in_read_pipe"]
    assert functions(spin)[-3:] == ["<module>", "main", "spinning_without_output"]
    assert read.frames[-1].file == TARGET and read.frames[-1].line > 0
    for stack in stacks:
        helpers = {t.name: t.idle for t in stack.threads[1:]}
        assert helpers == {"helper-0": True, "helper-1": True}


@needs_pyspy
def test_a_rank_that_exited_is_an_error_the_others_are_not(start):
    """A pid that is gone, and pids that are no rank's (0, -1: kill() would signal a group),
    are recorded as errors; the live rank beside them is dumped as usual."""
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    pid = start("read")
    stacks = capture([(0, gone.pid), (1, pid), (2, 0), (3, -1)], "n1", timeout=TIMEOUT)
    assert [(s.method, s.error) for s in stacks] == [
        ("none", "process exited"),
        ("py-spy", None),
        ("none", "not a rank pid: 0"),
        ("none", "not a rank pid: -1"),
    ]
    assert functions(main_thread(stacks[1]))[-1] == "stuck_in_read_pipe"
    assert stacks[0].threads == ()


@needs_pyspy
@pytest.mark.parametrize("timeout", [0.0, 0.01, 0.05])
def test_timeout_is_an_error_and_leaves_the_rank_running(start, timeout):
    """py-spy killed at the deadline (maybe while attached) leaves the rank neither traced
    nor stopped, and a later capture works."""
    pid = start("spin")
    stacks = capture([(0, pid)], "n1", timeout=timeout)
    if stacks[0].error is not None:  # 50 ms may be enough on an idle machine
        assert stacks[0].method == "none"
        assert stacks[0].error == f"py-spy gave no stack within {timeout:g}s"
    deadline = time.monotonic() + 5
    while state(pid) in "tT" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state(pid) not in "tT"
    with open(f"/proc/{pid}/status") as status:
        assert "TracerPid:\t0\n" in status.read()
    assert capture([(0, pid)], "n1", timeout=TIMEOUT)[0].method == "py-spy"


@needs_pyspy
def test_native_mode_returns_frames(start):
    """--native: the Python frames are there, C frames (libc's read, say) may be too."""
    (stack,) = capture([(0, start("read"))], "n1", native=True, timeout=TIMEOUT)
    assert stack.method == "py-spy --native"
    assert "stuck_in_read_pipe" in functions(main_thread(stack))


@needs_pyspy
def test_warm_rank_is_dumped_with_the_zygote_frames_outside(start):
    """A rank forked by a zygote: its stack starts in zygote_main.py, ends in the user's code."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    with Zygote.start([], env) as zygote:
        assert zygote.wait_ready(60), zygote.info
        rank = zygote.fork([sys.executable, TARGET, "read"], env, str(ROOT), None, None, False)
        with os.fdopen(rank.stdout_fd, "rb") as out:
            assert out.readline() == b"ready\n"  # the rank's own pipe: ends if it dies
            (stack,) = capture([(0, rank.pid)], "n1", timeout=TIMEOUT)
            os.kill(rank.pid, signal.SIGKILL)
        os.close(rank.stderr_fd)
    thread = main_thread(stack)
    assert thread.frames[0].file.endswith("zygote_main.py")
    assert functions(thread)[-2:] == ["main", "stuck_in_read_pipe"]


YAMA = Path("/proc/sys/kernel/yama/ptrace_scope")
SCOPE = int(YAMA.read_text()) if YAMA.exists() else None
as_nobody = pytest.mark.skipif(
    PYSPY is None or shutil.which("setpriv") is None or os.geteuid() != 0,
    reason="needs py-spy, setpriv and root (to switch to uid 65534)",
)


@pytest.fixture
def nobody_dir() -> Iterator[str]:
    """A directory uid 65534 can use, holding py-spy, the target, the exec wrapper and the agent
    package: the checkout may sit where other users cannot read (a 0700 home, a `mktemp -d`),
    and root's home is closed to uid 65534 here. Skipped, with the reason, where uid 65534
    cannot read it or run this interpreter (a TMPDIR of root's own, a venv in root's home)."""
    bin_dir = tempfile.mkdtemp(prefix="hang-bin-")
    try:
        os.chmod(bin_dir, 0o755)
        shutil.copy(str(PYSPY), bin_dir)
        shutil.copy(TARGET, bin_dir)
        shutil.copy(CHILD_WRAPPER, bin_dir)
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(ROOT / "agent", Path(bin_dir) / "agent", ignore=ignore)
        for path in Path(bin_dir).rglob("*"):  # readable whatever this process's umask
            path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
        probe = "import sys; open(sys.argv[1]).close()"
        target = os.path.join(bin_dir, "hang_target.py")
        done = subprocess.run(
            [*NOBODY, sys.executable, "-c", probe, target],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["no message"])[-1]
            pytest.skip(f"uid 65534 cannot read {bin_dir} or run {sys.executable}: {why}")
        yield bin_dir
    finally:
        shutil.rmtree(bin_dir)


@as_nobody
def test_unprivileged_user_dumps_its_own_ranks(start, nobody_dir):
    """Rank and capture both as uid 65534 with no capabilities: same-uid ptrace suffices where
    Yama allows it (no Yama, ptrace_scope=0; at 1 ranks must name the agent, see below)."""
    pid = start("read", prefix=tuple(NOBODY), target=os.path.join(nobody_dir, "hang_target.py"))
    code = "import json, sys; from agent.hang.capture import capture; "
    code += f"print(json.dumps(capture([(0, {pid})], 'n1', timeout={TIMEOUT})[0].to_json()))"
    done = subprocess.run(
        [*NOBODY, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=nobody_dir,  # its copy of the agent package: the checkout may be closed to it
        env={**os.environ, "PYTHONPATH": nobody_dir, "PATH": f"{nobody_dir}{os.pathsep}/usr/bin"},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    stack = RankStack.from_json(json.loads(done.stdout))
    if SCOPE is not None and SCOPE >= 1:  # the rank is no descendant of the capture
        assert stack.method == "none" and "ermission" in (stack.error or ""), stack
    else:
        assert functions(main_thread(stack))[-1] == "stuck_in_read_pipe"


@as_nobody
@pytest.mark.skipif(SCOPE != 1, reason=f"needs Yama ptrace_scope=1 (here: {SCOPE})")
def test_cold_rank_names_the_agent_as_its_tracer(start, nobody_dir):
    """Yama ptrace_scope=1 lets only ancestors trace. A rank started through the exec wrapper
    (agent/run/child.py) names its parent, the agent (here this test), with PR_SET_PTRACER:
    py-spy, the agent's child and the rank's sibling, may attach; to a rank started without
    the wrapper it may not. All as uid 65534, without CAP_SYS_PTRACE."""
    python = next((p for p in ("/usr/bin/python3", "/bin/python3") if os.path.exists(p)), None)
    if python is None:  # the wrapper's exec is uid 65534's own: root's home is closed to it
        pytest.skip("no system python3 for uid 65534 to exec")
    wrapper = os.path.join(nobody_dir, "child.py")  # the checkout may be closed to uid 65534
    argv = [wrapper if arg == CHILD_WRAPPER else arg for arg in wrapper_argv([], strict=True)]
    target = os.path.join(nobody_dir, "hang_target.py")
    wrapped = start("read", prefix=(*NOBODY, *argv), python=python, target=target)
    bare = start("read", prefix=tuple(NOBODY), target=target)
    pyspy = os.path.join(nobody_dir, "py-spy")
    for pid, works in ((wrapped, True), (bare, False)):
        done = subprocess.run(
            [*NOBODY, pyspy, "dump", "--pid", str(pid), "--json"], capture_output=True, timeout=60
        )
        assert (done.returncode == 0) is works, done.stderr
        if works:
            assert parse_dump(done.stdout, pid)[0].frames[-1].function == "stuck_in_read_pipe"


def test_exec_wrapper_still_execs_and_can_be_dumped(start):
    """The wrapper's PR_SET_PTRACER (EINVAL without Yama) neither stops it nor the exec."""
    pid = start("read", prefix=tuple(wrapper_argv([], strict=True)))
    if PYSPY is not None:
        (stack,) = capture([(0, pid)], "n1", timeout=TIMEOUT)
        assert functions(main_thread(stack))[-1] == "stuck_in_read_pipe"


@needs_pyspy
def test_parse_dump_reads_real_output(start):
    """py-spy's own JSON (frames innermost first) read back innermost last, main thread first."""
    pid = start("read")
    done = subprocess.run(
        [PYSPY, "dump", "--pid", str(pid), "--json"], capture_output=True, timeout=60, check=True
    )
    raw = json.loads(done.stdout)
    main = next(t for t in raw if t["thread_name"] == "MainThread")
    assert main["frames"][0]["name"] == "stuck_in_read_pipe"
    threads = parse_dump(done.stdout, pid)
    assert [t.name for t in threads] == ["MainThread", "helper-1", "helper-0"] or [
        t.name for t in threads
    ] == ["MainThread", "helper-0", "helper-1"]
    assert [f.function for f in threads[0].frames] == [f["name"] for f in main["frames"]][::-1]


# --- the faulthandler fallback ---------------------------------------------------------------


@pytest.mark.parametrize("mode", ["read", "spin"])
def test_forced_fallback_dumps_through_faulthandler(start, tmp_path, mode):
    """The rank's own faulthandler answers FALLBACK_SIGNAL, even while it holds the GIL in a
    loop; each capture reads only what its signal added to the file."""
    pid = start(mode, str(tmp_path))
    expected = {"read": "stuck_in_read_pipe", "spin": "spinning_without_output"}[mode]
    assert registered(str(tmp_path), pid)
    for count in (1, 2):
        (stack,) = capture(
            [(5, pid)], "n2", timeout=TIMEOUT, fallback_dir=str(tmp_path), force_fallback=True
        )
        assert (stack.rank, stack.method, stack.error) == (5, "faulthandler", None)
        thread = main_thread(stack)
        assert functions(thread)[-3:] == ["<module>", "main", expected]
        assert len(stack.threads) == 3 and not any(t.idle for t in stack.threads)
        text = Path(fallback_path(str(tmp_path), pid)).read_text()
        assert text.count("Current thread") == count
    assert state(pid) in "RS"


SYSTEM_PYTHON = next(
    (
        p
        for p in ("/usr/bin/python3", "/bin/python3")
        if os.path.exists(p) and not os.path.exists(os.path.join(os.path.dirname(p), "py-spy"))
    ),
    None,
)
FAKE_PYSPY = {
    "fails": 'echo "Error: Operation not permitted (os error 1)" >&2; exit 1',
    "hangs": "exec sleep 60",
}


@pytest.mark.skipif(SYSTEM_PYTHON is None, reason="needs an interpreter with no py-spy beside it")
@pytest.mark.parametrize("behaviour", sorted(FAKE_PYSPY))
def test_fallback_follows_a_pyspy_that_fails_or_hangs(start, tmp_path, behaviour):
    """A py-spy that cannot attach (as under Yama ptrace_scope=3) or never answers: the rank's
    faulthandler answers within the same timeout. The stand-in py-spy is a real program found
    on PATH by an interpreter with none beside it; capture runs in that interpreter."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "py-spy").write_text(f"#!/bin/sh\n{FAKE_PYSPY[behaviour]}\n")
    (bin_dir / "py-spy").chmod(0o755)
    pids = [start("read", str(tmp_path)), start("read")]  # the second registered nothing
    code = "import json; from agent.hang.capture import capture; "
    code += (
        f"r = capture({list(enumerate(pids))}, 'n1', timeout=4, fallback_dir={str(tmp_path)!r}); "
    )
    code += "print(json.dumps([s.to_json() for s in r]))"
    began = time.monotonic()
    done = subprocess.run(
        [str(SYSTEM_PYTHON), "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin"},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - began < 30
    helped, alone = (RankStack.from_json(data) for data in json.loads(done.stdout))
    assert helped.method == "faulthandler"
    assert functions(main_thread(helped))[-1] == "stuck_in_read_pipe"
    why = {"fails": "py-spy: Operation not permitted (os error 1)"}
    why["hangs"] = "py-spy gave no stack within 4s"  # no fallback for it: all the time
    assert (alone.method, alone.error) == ("none", f"{why[behaviour]}; no faulthandler fallback")
    assert state(pids[0]) in "RS" and state(pids[1]) in "RS"


@needs_pyspy
def test_fallback_never_signals_a_rank_that_did_not_register(start, tmp_path):
    """A stale file with the rank's pid is not enough: the default action of FALLBACK_SIGNAL
    would kill the rank, so /proc must say it catches the signal."""
    pid = start("read")
    Path(fallback_path(str(tmp_path), pid)).write_text("")
    assert not registered(str(tmp_path), pid)
    (stack,) = capture(
        [(0, pid)], "n1", timeout=TIMEOUT, fallback_dir=str(tmp_path), force_fallback=True
    )
    assert stack.method == "none"
    assert stack.error == "fallback forced; no faulthandler fallback"
    assert capture([(0, pid)], "n1", timeout=TIMEOUT)[0].method == "py-spy"  # still alive


def test_fallback_signal_is_not_one_users_take():
    assert FALLBACK_SIGNAL not in (signal.SIGUSR1, signal.SIGUSR2)
    assert signal.SIGRTMIN < FALLBACK_SIGNAL <= signal.SIGRTMAX


def _real_faulthandler_text() -> str:
    """This interpreter's own all-threads dump, with a helper thread waiting in a function."""
    event = threading.Event()

    def helper_waiting() -> None:
        event.wait()

    helper = threading.Thread(target=helper_waiting)
    helper.start()
    try:
        with tempfile.TemporaryFile("w+") as file:
            faulthandler.dump_traceback(file, all_threads=True)
            file.seek(0)
            return file.read()
    finally:
        event.set()
        helper.join()


def test_parse_faulthandler_reads_real_output():
    text = _real_faulthandler_text()
    threads = parse_faulthandler(text)
    main = threads[0]
    assert main.name == "MainThread"
    assert main.frames[-1].function == "_real_faulthandler_text"
    assert main.frames[-2].function == "test_parse_faulthandler_reads_real_output"
    helper = next(t for t in threads if "helper_waiting" in functions(t))
    assert helper.name.startswith("0x") and helper.frames[-1].function == "wait"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", (), id="empty"),
        pytest.param("garbage\n\x00\n", (), id="garbage"),
        pytest.param(
            'Stack (most recent call first):\n  File "a.py", line 3 in f\n'
            '  File "a.py", line ??? in <module>\n',
            (("MainThread", (("<module>", "a.py", 0), ("f", "a.py", 3))),),
            id="single thread, unknown line",
        ),
        pytest.param(
            "Thread 0x01 (most recent call first):\n  <no Python frame>\n\n"
            'Current thread 0x02 (most recent call first):\n  File "b.py", line 1 in g\n'
            "  ...\n",
            (("MainThread", (("g", "b.py", 1),)), ("0x01", ())),
            id="no frame, elided frames",
        ),
        pytest.param(
            'Thread 0x03 (most recent call first):\n  File "x"y.py", line 2 in h\n',
            (("MainThread", (("h", 'x"y.py', 2),)),),
            id="quote in file name",
        ),
    ],
)
def test_parse_faulthandler_tables(text, expected):
    threads = parse_faulthandler(text)
    got = tuple((t.name, tuple((f.function, f.file, f.line) for f in t.frames)) for t in threads)
    assert got == expected


# --- py-spy output, hostile ------------------------------------------------------------------


def _thread(name: object = "MainThread", frames: object = None, **kw: object) -> dict:
    frames = [{"name": "f", "filename": "/a.py", "line": 1}] if frames is None else frames
    return {"thread_name": name, "os_thread_id": 7, "active": True, "frames": frames, **kw}


@pytest.mark.parametrize(
    "text",
    ["", "not json", "{}", '"x"', "[" * 100_000],
    ids=["empty", "text", "obj", "str", "deep"],
)
def test_parse_dump_rejects_what_is_not_a_thread_list(text):
    with pytest.raises(ValueError):
        parse_dump(text, 7)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param([], [], id="no threads"),
        pytest.param([1, "x", None, _thread()], [("MainThread", False, [("f", "/a.py", 1)])]),
        pytest.param(
            [_thread(name=None, active=False), _thread(name="w", os_thread_id=8)],
            [("MainThread", True, [("f", "/a.py", 1)]), ("w", False, [("f", "/a.py", 1)])],
            id="unnamed main thread by os id",
        ),
        pytest.param(
            [_thread(name=None, os_thread_id=9, thread_id=255, idle=True, active=True)],
            [("thread 255", True, [("f", "/a.py", 1)])],
            id="idle key wins",
        ),
        pytest.param(
            [
                _thread(
                    frames=[
                        {"name": 3, "filename": None, "short_filename": "s.py", "line": "9"},
                        {"name": "g", "line": True},
                        "junk",
                    ]
                )
            ],
            [("MainThread", False, [("g", "?", 0), ("?", "s.py", 0)])],
            id="odd frames",
        ),
        pytest.param(
            [_thread(frames={"a": 1})], [("MainThread", False, [])], id="frames not a list"
        ),
    ],
)
def test_parse_dump_tables(data, expected):
    threads = parse_dump(json.dumps(data), 7)
    got = [(t.name, t.idle, [(f.function, f.file, f.line) for f in t.frames]) for t in threads]
    assert got == expected


def test_parse_dump_bounds():
    """Deep recursion keeps the innermost frames; a thread pool keeps MAX_THREADS threads."""
    deep = [{"name": f"f{i}", "filename": "/a.py", "line": i + 1} for i in range(1000)]
    (thread,) = parse_dump(json.dumps([_thread(frames=deep)]), 7)
    assert len(thread.frames) == MAX_FRAMES and thread.frames[-1].function == "f0"
    many = [_thread(name=f"t{i}", frames=[]) for i in range(200)]
    assert len(parse_dump(json.dumps(many), 7)) == MAX_THREADS


@pytest.mark.parametrize(
    ("stderr", "expected"),
    [
        pytest.param(
            b"Error: Failed to get process executable name. Check that the process is running."
            b"\n\nCaused by:\n    0: No such file or directory (os error 2)\n"
            b"    1: No such file or directory (os error 2)\n\nStack backtrace:\n   0: x\n",
            "py-spy: Failed to get process executable name. Check that the process is running. "
            "(No such file or directory (os error 2))",
            id="gone",
        ),
        pytest.param(
            b"Error: Failed to find python version from target process\n",
            "py-spy: Failed to find python version from target process",
            id="not python",
        ),
        pytest.param(
            b"Permission Denied: Try running again with elevated permissions by going 'sudo'\n",
            "Permission Denied: Try running again with elevated permissions by going 'sudo'",
            id="permission",
        ),
        pytest.param(b"", "py-spy exited with 1", id="silent"),
        pytest.param(b"Error: " + b"x" * 2000, "py-spy: " + "x" * 504, id="long"),
    ],
)
def test_error_line(stderr, expected):
    assert error_line(stderr, 1) == expected


# -- the private directory under $TMPDIR, when another user got there first -----------------
ASK_TWICE = (
    "import json; from agent.hang.fallback import private_dir; "
    "print(json.dumps([private_dir(), private_dir()]))"
)


def plant(tmp_path: Path, name: str, how: str) -> Path:
    """What another user (uid 65534) could leave at `name` in a shared TMPDIR."""
    where = tmp_path / name
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    os.chmod(theirs, 0o777)
    if how == "symlink":
        where.symlink_to(theirs)
        os.lchown(where, 65534, 65534)
    elif how == "file":
        where.write_text("")
        os.chown(where, 65534, 65534)
    else:
        where.mkdir()
        os.chown(where, 65534, 65534)
        os.chmod(where, int(how, 8))
    return where


def ask_private_dir(tmp_path: Path) -> tuple[list, str]:
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", ASK_TWICE], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


@pytest.mark.skipif(os.getuid() != 0, reason="planting another user's directory needs root")
@pytest.mark.parametrize("how", ["symlink", "0777", "0700", "file"])
def test_an_impostor_private_dir_is_refused_and_a_fresh_one_used(tmp_path, how):
    planted = plant(tmp_path, f"launch-agent-stacks-{os.getuid()}", how)
    (first, second), stderr = ask_private_dir(tmp_path)
    assert first == second and first is not None, stderr  # one fresh dir for the process
    assert Path(first).parent == tmp_path and first != str(planted)
    assert Path(first).name.startswith(f"launch-agent-stacks-{os.getuid()}-")
    lines = stderr.splitlines()
    assert len(lines) == 1 and str(planted) in lines[0] and first in lines[0], stderr
    assert not Path(first).exists()  # gone with the process that made it
    assert planted.is_symlink() == (how == "symlink")  # theirs, untouched
    assert os.lstat(planted).st_uid == 65534


def test_our_own_private_dir_is_used_and_made_private(tmp_path):
    ours = tmp_path / f"launch-agent-stacks-{os.getuid()}"
    ours.mkdir()
    os.chmod(ours, 0o755)
    (first, second), stderr = ask_private_dir(tmp_path)
    assert first == second == str(ours) and stderr == ""
    assert stat.S_IMODE(os.lstat(ours).st_mode) == 0o700
