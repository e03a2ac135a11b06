"""Warm ranks: real zygotes fork real ranks, compared with fresh `python script.py` ranks.

One torch-preloaded zygote serves the module (imports take seconds here); the tests that kill
a zygote start their own, with nothing heavy to import.
"""

from __future__ import annotations

import gzip
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.warm.process import RankStart, WarmProcess, ZygoteGone
from agent.warm.zygote import Zygote

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parent / "fixtures"
PROBE = str(FIXTURES / "warm_probe.py")
EXIT = str(FIXTURES / "warm_exit.py")


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.pop("PYTHONUNBUFFERED", None)
    env.update(OMP_NUM_THREADS="1", RANK="0", RES_OPTIONS="timeout:1 attempts:1")
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def zygote():
    zygote = Zygote.start(["torch", "numpy.random"], base_env())  # numpy.random: seeded at import
    assert zygote.wait_ready(120), zygote.info
    yield zygote
    zygote.close()


class Rank:
    """A forked rank and its two pipes, read to the end."""

    def __init__(self, zygote: Zygote, args: list[str], env: dict, cwd: str, **kw) -> None:
        options = {"cpus": None, "mems": None, "strict": False, **kw}
        self.proc = zygote.fork([sys.executable, *args], env, cwd, **options)
        self.out, self.err = b"", b""
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.proc.stdout_fd, selectors.EVENT_READ, "out")
        self.selector.register(self.proc.stderr_fd, selectors.EVENT_READ, "err")

    def _pump(self, deadline: float, until: bytes | None = None) -> None:
        while self.selector.get_map() and not (until and until in self.out):
            events = self.selector.select(max(0.0, deadline - time.monotonic()))
            assert events or time.monotonic() < deadline, f"rank hung: {self.out!r} {self.err!r}"
            for key, _ in events:
                data = os.read(key.fd, 1 << 16)
                if key.data == "out":
                    self.out += data
                else:
                    self.err += data
                if not data:
                    self.selector.unregister(key.fd)
                    os.close(key.fd)

    def first_line(self, timeout: float = 60) -> str:
        self._pump(time.monotonic() + timeout, until=b"\n")
        return self.out.decode().splitlines()[0]

    def wait_for(self, text: str, timeout: float = 60) -> None:
        self._pump(time.monotonic() + timeout, until=text.encode())
        assert text.encode() in self.out, (self.out, self.err)

    def finish(self, timeout: float = 120) -> tuple[int, str, str]:
        self._pump(time.monotonic() + timeout)
        self.selector.close()
        return self.proc.wait(timeout), self.out.decode(), self.err.decode()


def warm(
    zygote: Zygote,
    args: list[str],
    env: dict | None = None,
    cwd: str | None = None,
    ahead: bool = False,
    **kw,
):
    """A warm rank's (code, out, err); `ahead`: forked before its request (Zygote.stand_by)."""
    if ahead:
        assert zygote.stand_by(1) == 1
        [waiting] = zygote.standby_pids()
    rank = Rank(zygote, args, env or base_env(), cwd or str(FIXTURES), **kw)
    if ahead:
        assert rank.proc.pid == waiting and not zygote.standby_pids()
    return rank.finish()


def fresh(args: list[str], env: dict | None = None, cwd: str | None = None):
    done = subprocess.run(
        [sys.executable, *args],
        env=env or base_env(),
        cwd=cwd or str(FIXTURES),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        timeout=120,
    )
    return done.returncode, done.stdout, done.stderr


def gone(pid: int, timeout: float = 10) -> bool:
    """Bounded wait for a process to be gone (or a zombie nobody reaps yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rpartition(")")[2].split()[0] in ("Z", "X"):
                    return True
        except (FileNotFoundError, ProcessLookupError):  # reaped between open and read: ESRCH
            return True
        time.sleep(0.02)
    return False


# --- what the rank looks like --------------------------------------------------------------


# What a script can see of its interpreter at its first line, one row per key of
# fixtures/warm_probe.py's output. SAME: a warm rank sees what `python script.py` started the same
# way sees. OWN: a fresh interpreter draws it from the OS at start, so every rank of every run has
# its own (a forked rank must not inherit the zygote's). PRELOADED: torch is imported already.
# PRELOAD_ONLY: a warm rank starts with the fresh one's modules plus only what the fresh one gets
# by importing the preload list (and what the probe imports), none of the zygote's own.
SAME, OWN, PRELOADED, PRELOAD_ONLY = "same", "own", "preloaded", "preload only"
# Known, meant: the stack fallback for ranks py-spy cannot attach to (agent/hang/fallback.py)
# registers faulthandler in warm ranks; a builtin module, so it stays imported.
AGENT_ADDS = {"faulthandler"}
ROWS = {
    "torch_at_start": PRELOADED,
    # __main__ and how the script was started
    "name": SAME,
    "file": SAME,
    "main_keys": SAME,
    "loader": SAME,
    "package": SAME,
    "spec": SAME,
    "cached": SAME,
    "argv": SAME,
    "orig_argv": SAME,
    "path": SAME,
    # the process
    "cwd": SAME,
    "env": SAME,
    "stdio": SAME,
    "dunder_stdio": SAME,
    "signals": SAME,
    "sigmask": SAME,
    "umask": SAME,
    "rlimits": SAME,
    "threads": SAME,
    "own_session": SAME,
    "fds": SAME,
    "agent_modules": SAME,
    "modules_at_start": PRELOAD_ONLY,
    "modules_after_imports": PRELOAD_ONLY,
    "tempdir": SAME,
    "mp_original_dir": SAME,
    # libraries' import-time state
    "torch_threads": SAME,
    "interop_threads": SAME,
    "openblas_threads": SAME,
    "affinity": SAME,
    "cuda_initialised": SAME,
    "matmul": SAME,
    # random number generators
    "draw": OWN,  # numpy's legacy global RandomState
    "random_draw": OWN,  # the random module
    "torch_seed": OWN,  # torch.initial_seed(): the CPU default generator
    "torch_draw": OWN,
}


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
def test_rank_is_what_a_fresh_interpreter_would_be(zygote, tmp_path, unbuffered):
    """Two runs of two warm ranks each (the second's forked ahead of their requests, as a
    resident agent does between runs) against two fresh `python script.py` ranks started the
    same way, row by row (ROWS); torch is already imported at a warm rank's first line."""
    env = base_env(TMPDIR=str(tmp_path), WARM_ONLY_HERE="1")
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    envs = [dict(env, RANK=str(rank)) for rank in range(2)]
    args, cwd = ["fixtures/warm_probe.py", "--flag", "a b"], str(FIXTURES.parent)
    warm_ranks = []  # (rank, state) for 2 runs x 2 ranks
    for run in range(2):
        if run == 1:
            assert zygote.stand_by(2) == 2
            ahead = set(zygote.standby_pids())
        started = [Rank(zygote, args, envs[rank], cwd) for rank in range(2)]
        if run == 1:
            assert {r.proc.pid for r in started} == ahead
        for rank, proc in enumerate(started):
            code, out, err = proc.finish()
            assert code == 0, err
            warm_ranks.append((rank, json.loads(out)))
    fresh_ranks = []
    for rank in range(2):
        code, out, err = fresh(args, envs[rank], cwd)
        assert code == 0, err
        fresh_ranks.append(json.loads(out))
    for _rank, state in warm_ranks:
        assert set(state) == set(ROWS), "a key of warm_probe.py without a row in ROWS"
    for key, kind in ROWS.items():
        if kind == PRELOADED:
            assert all(s[key] for _, s in warm_ranks), key
            assert not any(s[key] for s in fresh_ranks), key
        elif kind == SAME:
            for rank, state in warm_ranks:
                assert state[key] == fresh_ranks[rank][key], key
        elif kind == PRELOAD_ONLY:
            for rank, state in warm_ranks:
                theirs = fresh_ranks[rank]
                assert not set(theirs[key]) - set(state[key]), (key, "missing")
                extra = set(state[key]) - set(theirs["modules_after_imports"]) - AGENT_ADDS
                assert not extra, (key, sorted(extra))
        else:
            values = [json.dumps(s[key]) for _, s in warm_ranks]
            assert len(set(values)) == len(values), (key, values)
            theirs = {json.dumps(s[key]) for s in fresh_ranks}
            assert len(theirs) == 2 and not theirs & set(values), key
    mine = warm_ranks[0][1]
    assert mine["env"] == envs[0]
    assert mine["argv"] == args and mine["path"][0] == str(FIXTURES)
    assert mine["file"] == os.path.join(cwd, args[0])
    assert mine["stdio"]["stdout"]["write_through"] is unbuffered
    assert mine["agent_modules"] == [] and mine["fds"] == [0, 1, 2]


def test_module_run_as_with_dash_m(zygote, tmp_path):
    """`python -m mod`: __main__ is the module, sys.argv[0] its path, sys.path[0] the cwd."""
    env = base_env()
    command = ["-m", "warm_mod", "x", "--y"]
    code, out, err = warm(zygote, command, env, str(FIXTURES))
    assert code == 0, err
    assert json.loads(out) == json.loads(fresh(command, env, str(FIXTURES))[1])
    assert json.loads(out)["argv"] == [str(FIXTURES / "warm_mod.py"), "x", "--y"]


def test_user_code_is_never_preloaded(zygote, tmp_path):
    """The script is read at each fork, and the user's own `agent` package is theirs, not ours."""
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "__init__.py").write_text("WHOSE = 'user'\n")
    script = tmp_path / "main.py"
    for version in ("one", "two"):
        script.write_text(f"import agent\nprint({version!r}, agent.WHOSE)\n")
        assert warm(zygote, [str(script)], cwd=str(tmp_path)) == (0, f"{version} user\n", "")


def test_directory_script_and_relative_pythonpath(tmp_path):
    """`python DIR` runs DIR/__main__.py with DIR on sys.path; a relative PYTHONPATH entry is
    made absolute against the rank's cwd, not the zygote's."""
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text(
        "import sys\nprint(sys.argv, __file__, __name__, sys.path)\n"
    )
    env = base_env(PYTHONPATH="lib")
    with Zygote.start([], env) as zygote:
        assert zygote.wait_ready(60), zygote.info
        result = warm(zygote, ["app", "x"], env, str(tmp_path))
    assert result[0] == 0 and str(tmp_path / "lib") in result[1]
    assert result == fresh(["app", "x"], env, str(tmp_path))


# --- how it ends ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["code", "0"], 0),
        (["code", "3"], 3),
        (["message", "bad config"], 1),
        (["raise"], 1),
        (["kill"], -9),
        (["text", "hello"], 0),
        (["late"], 4),
        (["finalizer"], 0),
    ],
)
@pytest.mark.parametrize("ahead", [False, True], ids=["forked", "forked-ahead"])
def test_exits_like_cpython(zygote, args, code, ahead):
    """Exit status, stdout and stderr (tracebacks start at the user's frame) as CPython's,
    forked on request or ahead of it."""
    warm_result = warm(zygote, [EXIT, *args], ahead=ahead)
    assert warm_result[0] == code
    assert warm_result == fresh([EXIT, *args])


@pytest.fixture(scope="module")
def full_zygote():
    """Ranks that end through CPython's whole shutdown (the default skips module teardown)."""
    with Zygote.start([], base_env(), fast_exit=False) as zygote:
        assert zygote.wait_ready(60), zygote.info
        yield zygote


@pytest.mark.parametrize(
    "args", [["code", "3"], ["message", "m"], ["raise"], ["text", "hi"], ["late"], ["kill"]]
)
def test_a_full_shutdown_keeps_what_scripts_rely_on_too(full_zygote, args):
    """The default (tested above: test_exits_like_cpython) skips module teardown; the whole
    shutdown gives the same exit codes, messages, thread joins and atexit."""
    assert warm(full_zygote, [EXIT, *args]) == fresh([EXIT, *args])


def test_a_full_shutdown_dies_by_sigint(full_zygote):
    rank = Rank(full_zygote, [EXIT, "wait"], base_env(), str(FIXTURES))
    rank.wait_for("waiting\n")
    os.kill(rank.proc.pid, signal.SIGINT)
    code, _, err = rank.finish()
    assert code == -2 and err.rstrip().endswith("KeyboardInterrupt")


def test_keyboard_interrupt_dies_by_sigint(zygote):
    """SIGINT raises KeyboardInterrupt in the script; uncaught, the rank dies by SIGINT (-2)."""
    rank = Rank(zygote, [EXIT, "wait"], base_env(), str(FIXTURES))
    assert rank.first_line() == "waiting"
    os.kill(rank.proc.pid, signal.SIGINT)
    code, _, err = rank.finish()
    assert code == -2
    assert err.startswith("Traceback") and err.rstrip().endswith("KeyboardInterrupt")
    assert "agent/warm" not in err


@pytest.mark.parametrize("fast", [False, True])
def test_files_left_open_are_flushed_at_exit(zygote, full_zygote, tmp_path, fast):
    """As the interpreter's own shutdown does: a file the script never closed gets its data, a
    gzip file its trailer (a fast exit closes them, wrappers first)."""
    target, packed = tmp_path / "left-open.txt", tmp_path / "left-open.gz"
    z = zygote if fast else full_zygote
    assert warm(z, [EXIT, "unflushed", str(target)]) == (0, "", "")
    assert target.read_text() == "written at exit\n"
    assert warm(z, [EXIT, "gzip", str(packed)]) == (0, "", "")
    assert gzip.decompress(packed.read_bytes()) == b"compressed at exit\n"


@pytest.mark.parametrize("fast", [False, True])
def test_a_file_a_preloaded_module_left_open_is_flushed_at_exit(tmp_path, fast):
    """The zygote's own objects are out of gc's sight in a rank (frozen before the forks): a
    file the preload opened, written by the rank and never flushed, still gets its data."""
    target = tmp_path / "opened-at-import.txt"
    env = base_env(PYTHONPATH=str(FIXTURES), WARM_OPEN_AT_IMPORT=str(target))
    with Zygote.start(["warm_open_at_import"], env, fast_exit=fast) as zygote:
        assert zygote.wait_ready(60), zygote.info
        assert warm(zygote, [EXIT, "preloaded"], env) == (0, "", "")
    assert target.read_text() == "written by the rank\n"


def test_a_collection_in_a_rank_leaves_the_zygotes_memory_shared(zygote):
    """gc in a rank never writes to the objects it shares with the zygote: with torch preloaded
    a full collection used to copy ~33 MB of the zygote's pages into each rank."""
    code, out, err = warm(zygote, [str(FIXTURES / "warm_dirty.py")])
    assert code == 0, err
    assert int(out) < 4 << 10  # kB


def test_a_warm_exit_skips_only_torchs_operator_deregistration():
    """torch's operator libraries are not unregistered at a fast exit (nothing outside the
    ending process could tell); every other exit finaliser still runs (test_exits_like_cpython:
    finalizer)."""
    code = (
        "import weakref, torch\n"
        "from agent.warm import script\n"
        "class Held: pass\n"
        "held = Held()\n"
        "mine = weakref.finalize(held, print, 'x')\n"
        "theirs = [f for f, i in weakref.finalize._registry.items() if i.func.__module__ == "
        "'torch.library']\n"
        "script._forgo_torch_deregistration()\n"
        "print(len(theirs) > 0, all(not f.atexit for f in theirs), mine.atexit)\n"
        "mine.detach()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=base_env(), capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout) == (0, "True True True\n"), done.stderr


def test_a_rank_reads_the_source_as_it_is_now_not_as_the_zygote_cached_it(tmp_path):
    """A warning at import made the zygote cache the module's lines; the file changed since:
    a rank's tracebacks and linecache show the lines on disk, as a fresh interpreter would."""
    module = tmp_path / "warns_at_import.py"
    module.write_text("import warnings\nwarnings.warn('old line two')\n")
    env = base_env(PYTHONPATH=str(tmp_path))
    with Zygote.start(["warns_at_import"], env) as zygote:
        assert zygote.wait_ready(60), zygote.info
        module.write_text("import warnings\nwarnings.warn('new line two')\n")
        reader = tmp_path / "read_line.py"
        reader.write_text(f"import linecache\nprint(linecache.getline({str(module)!r}, 2))\n")
        code, out, err = warm(zygote, [str(reader)], env, str(tmp_path))
    assert (code, out) == (0, "warnings.warn('new line two')\n\n"), err


def test_ranks_forked_together_hold_only_their_own_pipes(light_zygote):
    """One request forks both ranks: the first one's output ends (EOF) when it exits, though
    the second, forked after it from the same request, still runs."""
    zygote, env = light_zygote
    starts = [
        RankStart((sys.executable, EXIT, "text", "first"), env, str(FIXTURES)),
        RankStart((sys.executable, EXIT, "wait"), env, str(FIXTURES)),
    ]
    first, second = zygote.fork_all(starts)
    assert isinstance(first, WarmProcess) and isinstance(second, WarmProcess)
    out = b""
    while chunk := os.read(first.stdout_fd, 4096):  # EOF only once every copy is closed
        out += chunk
    assert out == b"noisy: imported\nfirst\n" and first.wait(30) == 0
    assert second.poll() is None
    os.killpg(second.pid, signal.SIGKILL)
    assert second.wait(30) == -signal.SIGKILL
    for fd in (first.stderr_fd, second.stdout_fd, second.stderr_fd):
        os.close(fd)


def test_killpg_reaches_the_rank_children(zygote):
    """The rank leads its own process group: the agent's killpg(pid) ends its children too."""
    rank = Rank(zygote, [EXIT, "grandchild"], base_env(), str(FIXTURES))
    grandchild = int(rank.first_line())
    assert os.getpgid(grandchild) == rank.proc.pid
    os.killpg(rank.proc.pid, signal.SIGTERM)
    assert rank.finish()[0] == -signal.SIGTERM
    assert gone(grandchild)


# --- libraries' import-time state ----------------------------------------------------------


@pytest.mark.parametrize("threads", ["1", "2"])
def test_thread_counts_follow_the_rank_env(zygote, threads):
    """libgomp and OpenBLAS read OMP_NUM_THREADS when the zygote imported them: re-applied."""
    code, out, err = warm(zygote, [PROBE], base_env(OMP_NUM_THREADS=threads))
    assert code == 0, err
    state = json.loads(out)
    assert state["torch_threads"] == int(threads)
    assert state["openblas_threads"] == min(int(threads), len(os.sched_getaffinity(0)))


def test_cpu_binding(zygote):
    """cpus=[c]: the rank may use exactly c; without OMP_NUM_THREADS torch uses one thread, and
    as many interop threads as a fresh interpreter started on that one CPU would."""
    cpu = max(os.sched_getaffinity(0))
    env = base_env()
    del env["OMP_NUM_THREADS"]
    code, out, err = warm(zygote, [PROBE], env, cpus=[cpu], mems=None)
    assert code == 0, err
    state = json.loads(out)
    assert state["affinity"] == [cpu]
    assert (state["torch_threads"], state["openblas_threads"]) == (1, 1)
    started_there = subprocess.run(  # torch's interop default moved between releases: ask it
        [sys.executable, PROBE],
        env=env,
        cwd=str(FIXTURES),
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
    )
    assert started_there.returncode == 0, started_there.stderr
    assert state["interop_threads"] == json.loads(started_there.stdout)["interop_threads"]


def test_cpu_binding_out_of_reach_stops_the_rank(zygote):
    code, out, err = warm(zygote, [PROBE], cpus=[100000])
    assert code == 2 and out == ""
    assert err.startswith("[agent] cannot bind rank: cannot bind to CPUs [100000]")


def test_spawn_and_forkserver_children(zygote):
    """Children that re-import __main__ (spawn DataLoader workers, a forkserver pool) work."""
    code, out, err = warm(zygote, [str(FIXTURES / "warm_loader.py")])
    assert (code, out) == (0, "squares 140 cubes 36\n"), err


def test_two_gloo_ranks_all_reduce(zygote):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    ranks = [
        Rank(
            zygote,
            [str(FIXTURES / "warm_dist.py")],
            base_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(r), WORLD_SIZE="2"),
            str(FIXTURES),
        )
        for r in range(2)
    ]
    for rank in ranks:
        code, out, err = rank.finish()
        assert code == 0 and out.startswith("sum 3 "), err


# --- the zygote itself ---------------------------------------------------------------------


def test_info_and_fingerprint(zygote):
    info = zygote.info
    assert info["loaded"] == ["torch", "numpy.random"] and info["failed"] == {}
    assert info["cuda_initialised"] is False and info["pid"] == zygote.pid
    env = base_env()
    assert zygote.fits(env)
    assert zygote.fits(dict(env, OMP_NUM_THREADS="7", RANK="3", NCCL_DEBUG="INFO"))
    assert not zygote.fits(dict(env, LD_PRELOAD="/lib/x.so"))
    assert not zygote.fits(dict(env, TORCH_CPP_LOG_LEVEL="INFO"))
    with pytest.raises(ValueError):
        zygote.fork([sys.executable, PROBE], dict(env, LD_PRELOAD="x"), "/", None, None, False)
    with pytest.raises(ValueError):
        zygote.fork([sys.executable, "-u", PROBE], env, "/", None, None, False)


@pytest.fixture
def light_zygote():
    """A zygote that imports a chatty module and one that does not exist, not torch."""
    env = base_env(PYTHONPATH=str(FIXTURES))
    with Zygote.start(["no_such_module_here", "warm_noisy"], env) as zygote:
        assert zygote.wait_ready(60), zygote.info
        yield zygote, env


def test_ranks_forked_ahead_wait_unrun_and_go_when_let_go(light_zygote):
    """Forked ahead, a rank runs nothing while it waits (titled as what it is); fewer wanted
    lets the extra ones go (they exit unrun), and so does closing the zygote."""
    zygote, _ = light_zygote
    assert zygote.stand_by(3) == 3
    waiting = zygote.standby_pids()
    for pid in waiting:
        assert _titled(pid, b"agent-standby-rank"), pid
    assert zygote.stand_by(1) == 1 and zygote.standby_pids() == waiting[:1]
    assert all(gone(pid) for pid in waiting[1:])
    assert _live(waiting[0])
    zygote.close()
    assert gone(waiting[0])


def _titled(pid: int, title: bytes, timeout: float = 10) -> bool:
    """Bounded wait for a process to show `title` as its command (it retitles itself)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            if cmdline.read().split(b"\0")[0] == title:
                return True
        time.sleep(0.02)
    return False


def _live(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_preload_failures_and_output(light_zygote):
    """A module that fails to import is reported, not fatal; what the imports printed reaches
    every rank, as a fresh rank importing them would print it; ps shows the rank's command."""
    zygote, env = light_zygote
    assert zygote.info["loaded"] == ["warm_noisy"]
    assert zygote.info["failed"] == {
        "no_such_module_here": "ModuleNotFoundError: No module named 'no_such_module_here'"
    }
    rank = Rank(zygote, [EXIT, "wait"], env, str(FIXTURES))
    rank.wait_for("waiting\n")
    with open(f"/proc/{rank.proc.pid}/cmdline", "rb") as cmdline:
        shown = cmdline.read().rstrip(b"\0").split(b"\0")
    assert shown == [os.fsencode(a) for a in (sys.executable, EXIT, "wait")]
    os.killpg(rank.proc.pid, signal.SIGKILL)
    code, out, err = rank.finish()
    assert (code, out) == (-9, "noisy: imported\nwaiting\n")
    assert "UserWarning: noisy: deprecated" in err


def test_killed_zygote_takes_its_ranks_along_when_the_agent_is_no_subreaper(light_zygote):
    """This test process is no subreaper, so its ranks are the zygote's children: SIGKILL the
    zygote and they die (PDEATHSIG), named so; waits resolve, fork raises ZygoteGone."""
    zygote, env = light_zygote
    rank = Rank(zygote, [EXIT, "wait"], env, str(FIXTURES))
    assert not rank.proc.adopted
    rank.wait_for("waiting\n")
    os.kill(zygote.pid, signal.SIGKILL)
    assert rank.proc.wait(30) == -signal.SIGKILL
    assert gone(rank.proc.pid)
    why = f"with its zygote: the warm interpreter it was forked from (pid {zygote.pid})"
    assert rank.proc.lost_with == f"{why} died first (killed by SIGKILL)"
    assert not zygote.ready
    with pytest.raises(ZygoteGone):
        zygote.fork([sys.executable, EXIT, "code", "0"], env, "/", None, None, False)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR2, signal.SIGINT])
def test_a_signal_to_the_whole_step_ends_the_ranks_not_the_zygote(light_zygote, signum):
    """Slurm's proctrack/linuxproc signals every process of a step, the zygote too: the zygote
    lives on (else its ranks would die at once by PDEATHSIG), and each rank gets the signal with
    the action a fresh `python script.py` has for it."""
    zygote, env = light_zygote
    rank = Rank(zygote, [EXIT, "wait"], env, str(FIXTURES))
    rank.wait_for("waiting\n")
    os.kill(zygote.pid, signum)
    os.kill(rank.proc.pid, signum)
    assert rank.finish()[0] == -signum
    assert zygote.ready
    assert warm(zygote, [EXIT, "code", "3"], env)[0] == 3


AGENT = """
import os, sys, time
from agent.run.workers import become_subreaper
from agent.warm.zygote import Zygote
assert sys.argv[2] == "plain" or become_subreaper()
zygote = Zygote.start([], dict(os.environ))
assert zygote.wait_ready(60)
rank = zygote.fork([sys.executable, sys.argv[1], "wait"], dict(os.environ), "/", None, None, False)
assert rank.adopted == (sys.argv[2] == "subreaper")
print(zygote.pid, rank.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("agent_is", ["subreaper", "plain"])
def test_zygote_and_ranks_die_with_the_agent(agent_is):
    """The zygote follows its agent (PDEATHSIG), and so do the ranks: adopted by a subreaper
    agent, by their own PDEATHSIG; else the zygote's children, as the zygote's death's."""
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, EXIT, agent_is],
        stdout=subprocess.PIPE,
        env=dict(base_env(), PYTHONPATH=str(Path(__file__).resolve().parents[1])),
    )
    zygote_pid, rank_pid = map(int, agent.stdout.readline().split())
    agent.kill()
    agent.wait()
    agent.stdout.close()
    assert gone(zygote_pid) and gone(rank_pid)


SUBREAPER_AGENT = """
import json, os, sys
from agent.run.workers import become_subreaper
from agent.warm.zygote import Zygote
assert become_subreaper()
exit_script, release, code = sys.argv[1:]
zygote = Zygote.start([], dict(os.environ))
assert zygote.wait_ready(60)
argv = [sys.executable, exit_script, "release", release, code]
rank = zygote.fork(argv, dict(os.environ), "/", None, None, False)
out = err = b""
while b"waiting" not in out:
    out += os.read(rank.stdout_fd, 4096)
with open(f"/proc/{rank.pid}/stat") as stat:
    parent = int(stat.read().rpartition(")")[2].split()[1])
print(json.dumps({"zygote": zygote.pid, "rank": rank.pid, "parent": parent}), flush=True)
while chunk := os.read(rank.stdout_fd, 4096):
    out += chunk
while chunk := os.read(rank.stderr_fd, 4096):
    err += chunk
code = rank.wait(60)
print(json.dumps({
    "code": code, "out": out.decode(), "err": err.decode(), "reaped": not os.path.exists(
        f"/proc/{rank.pid}"), "zygote_ready": zygote.ready, "zygote_info": zygote.info}),
    flush=True)
"""


def test_an_adopted_rank_outlives_its_zygote(tmp_path):
    """A subreaper agent (every agent is one) adopts its warm ranks: SIGKILL of the zygote
    mid-run leaves the rank running; it finishes, its output all arrives, the agent reaps it
    itself and learns its true exit code."""
    release = tmp_path / "release"
    agent = subprocess.Popen(
        [sys.executable, "-c", SUBREAPER_AGENT, EXIT, str(release), "3"],
        stdout=subprocess.PIPE,
        env=dict(base_env(), PYTHONPATH=str(Path(__file__).resolve().parents[1])),
    )
    try:
        started = json.loads(agent.stdout.readline())
        assert started["parent"] == agent.pid, "the rank is the agent's own child"
        os.kill(started["zygote"], signal.SIGKILL)
        assert gone(started["zygote"])
        release.touch()
        ended = json.loads(agent.stdout.readline())
    finally:
        agent.kill()
        agent.wait()
        agent.stdout.close()
    assert ended["code"] == 3, ended
    assert ended["out"] == "waiting\ndone on stdout\n" and ended["err"] == "done on stderr\n"
    assert ended["reaped"], "no zombie left"
    assert not ended["zygote_ready"] and ended["zygote_info"]["exit_status"] == -signal.SIGKILL


def test_warm_process_times_out():
    proc = WarmProcess(os.getpid(), ["x"], -1, -1)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.01)
    proc.exited(5)
    assert (proc.wait(0), proc.poll()) == (5, 5)


def test_a_warm_rank_dumps_its_stack_by_faulthandler_when_asked(zygote, tmp_path):
    """The fallback where py-spy cannot attach: the rank registered faulthandler itself."""
    from agent.hang.capture import capture

    script = tmp_path / "stuck.py"
    script.write_text(
        "import time\ndef parked_in_a_sleep():\n    print('in', flush=True)\n    time.sleep(600)\n"
        "parked_in_a_sleep()\n"
    )
    rank = Rank(zygote, [str(script)], base_env(), str(tmp_path), fallback_dir=str(tmp_path))
    rank.wait_for("in")
    [stack] = capture([(0, rank.proc.pid)], "here", fallback_dir=str(tmp_path), force_fallback=True)
    assert stack.method == "faulthandler", stack
    assert "parked_in_a_sleep" in [f.function for t in stack.threads for f in t.frames]
    os.kill(rank.proc.pid, signal.SIGKILL)
    rank.finish()
