"""In the child the zygote just forked: become what `python SCRIPT ARGS` / `python -m MOD ARGS`
would be (session, fds, cwd, environment, binding, stdio, sys.path, __main__), run it, and exit
the way CPython exits. Never returns: the zygote's own code must not run on in a rank."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agent.hang import fallback
from agent.hang.probe import sitecustomize as probe
from agent.warm import libs, proctitle, script
from agent.warm.go_pipe import GO, REQUEST, REQUEST_LIMIT

_PR_SET_PDEATHSIG = 1
_PR_SET_PTRACER = 0x59616D61  # "Yama"


class Origin:
    """What the zygote knew before it forked: the state a fresh interpreter would start in."""

    def __init__(
        self,
        modules: frozenset[str],
        fds: frozenset[int],
        path: list[str],
        paths: str,
        output: tuple[bytes, bytes],
        close: Callable[[], None],
    ) -> None:
        self.modules = modules  # the interpreter's start plus the preload list
        self.fds = fds  # what preloaded libraries opened and still own
        self.path = path  # the interpreter's base path (the zygote's own directory removed)
        self.signals = {s: signal.getsignal(s) for s in signal.valid_signals()}
        self.env = dict(os.environ)
        self.cpus = os.sched_getaffinity(0)
        self.cwd = os.getcwd()
        out = sys.__stdout__  # stdin and stdout share CPython's stdio encoding and errors
        self.encoding = out.encoding if out else "utf-8"
        self.errors = out.errors if out else "strict"
        self.paths = paths  # where the agent package (and py-libnuma) live, for the binding
        self.import_out, self.import_err = output  # what the preload printed on stdout, stderr
        self.pid = os.getpid()
        self.agent = os.getppid()  # zygote_main checked that its parent is the agent
        self.close = close  # closes the zygote's control socket, selector and wakeup pipe
        self.openblas = libs.openblas_setters() if "numpy" in sys.modules else ()


def become_rank(
    request: Mapping[str, Any], pipes: Sequence[int], origin: Origin, adopted: bool
) -> tuple[int, bool]:
    """Runs in the child, given its stdout, stderr and go pipes, adopted by the agent or the
    zygote's own child. Returns only after the user's
    code ran, with (exit code, uncaught KeyboardInterrupt) for the interpreter's own shutdown; a
    failure before that ends the child here with a message on its stderr, as nothing may return
    into the zygote's loop."""
    code = 70  # EX_SOFTWARE: the rank could not be started
    out_fd, err_fd, go_fd = pipes
    try:
        if request.get("standby"):  # ps shows what it is while it waits, not another zygote
            proctitle.retitle(
                ["agent-standby-rank", f"zygote={origin.pid}", f"agent={origin.agent}"]
            )
        request = _detach(origin, go_fd, adopted) or request
        _take_fds(out_fd, err_fd, origin)
        code = _prepare(request, origin)
        if code == 0:
            code, interrupted = script.run(request, origin.modules)
            if request.get("fast_exit"):
                script.fast_exit(code, interrupted)
            return code, interrupted
    except KeyboardInterrupt:  # SIGINT before the script ran: die by it, as python would
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException as exc:  # anything: nothing may return into the zygote's loop
        os.write(2, f"[agent] warm rank failed to start: {exc!r}\n".encode(errors="replace"))
    for stream in (sys.stdout, sys.stderr):  # e.g. "[agent] cannot bind rank: ..."
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(code)


def _detach(origin: Origin, go_fd: int, adopted: bool) -> Mapping[str, Any] | None:
    """Own session (the agent kills ranks with killpg), default signals, die with the parent:
    the agent once adopted, else the zygote. Nothing runs until the agent knows our pid. A rank
    forked ahead of its run (a standby: the zygote had no request for it) gets its request
    then, on the go pipe, and returns it."""
    signal.set_wakeup_fd(-1)
    for signum, handler in origin.signals.items():
        if handler is not None and signal.getsignal(signum) != handler:
            signal.signal(signum, handler)  # the zygote's SIGCHLD handler, mainly
    os.setsid()
    origin.close()  # the control socket first: its EOF is how the agent learns the zygote died
    libc = ctypes.CDLL(None, use_errno=True)
    if not adopted:
        _die_with(libc, origin.pid)
    # One byte once the agent has our pid (adopted: we are its child by then); EOF: it never
    # will (the zygote or the agent died first), and a rank it does not know must not run.
    try:
        request = _released(go_fd)
    except (OSError, ValueError):
        request = None
    os.close(go_fd)
    if request is None:
        os._exit(1)  # a standby the agent let go (its next run needed fewer ranks), or EOF
    if adopted:
        _die_with(libc, origin.agent)
    # Yama ptrace_scope=1: let the agent's py-spy (not our ancestor) dump us; EINVAL without Yama
    libc.prctl(_PR_SET_PTRACER, origin.agent, 0, 0, 0)
    return request or None


def _released(go_fd: int) -> Mapping[str, Any] | None:
    """What the go pipe says: GO ({}: run the request the fork came with), or REQUEST, its
    length (8 bytes) and the request as JSON (a standby's); None for anything else."""
    first = os.read(go_fd, 1)
    if first == GO:
        return {}
    if first != REQUEST:
        return None
    size = int.from_bytes(_read_exactly(go_fd, 8), "big")
    if size > REQUEST_LIMIT:
        return None
    import json

    request = json.loads(_read_exactly(go_fd, size))
    return request if isinstance(request, dict) else None


def _read_exactly(fd: int, size: int) -> bytes:
    parts, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise ValueError("the go pipe closed within a request")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _die_with(libc: ctypes.CDLL, parent: int) -> None:
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before prctl: nobody would kill us
        os._exit(1)


def _take_fds(out_fd: int, err_fd: int, origin: Origin) -> None:
    """The rank's pipes on 1 and 2, /dev/null on 0; every fd the zygote held closes (the control
    socket above all), except those preloaded libraries opened at import and still own."""
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    for fd in {out_fd, err_fd, null} - {0, 1, 2}:
        os.close(fd)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in origin.fds:
            try:
                os.close(fd)
            except OSError:  # the descriptor listdir itself used
                pass


def _prepare(request: Mapping[str, Any], origin: Origin) -> int:
    """cwd, environment, stdio, binding, library state; a non-zero code ends the rank early."""
    env = request["env"]
    try:
        os.chdir(request["cwd"])
    except OSError as exc:
        os.write(2, f"[agent] cannot enter {request['cwd']!r}: {exc.strerror}\n".encode())
        return 2
    os.environ.clear()  # clear() and update() go through unsetenv/putenv: C code sees them too
    os.environ.update(env)
    _stdio(origin, buffered=not env.get("PYTHONUNBUFFERED"))
    cpus, mems = request.get("cpus"), request.get("mems")
    if cpus or mems:
        code = _bind(cpus or [], mems or [], bool(request.get("strict")), origin)
        if code:
            return code
    libs.reapply(env, origin.env, origin.cpus, origin.openblas)
    sys.path[:] = _base_path(origin, env, request["cwd"])
    # What the preloaded imports printed, a fresh rank prints when its script imports them.
    for fd, text in ((1, origin.import_out), (2, origin.import_err)):
        if text:
            os.write(fd, text)
    if request.get("fallback_dir"):
        try:
            fallback.install_fallback(request["fallback_dir"])
        except OSError:
            pass  # py-spy remains; `agent stacks` says when neither works
    if env.get(probe.DIR_ENV):  # as a fresh rank's sitecustomize would (agent.hang.probe)
        os.environ[probe.PID_ENV] = str(os.getpid())
        probe.start(env[probe.DIR_ENV])
    proctitle.retitle(request["argv"])  # after the binding: the agent may take it as "bound"
    return 0


def _bind(cpus: list[int], mems: list[int], strict: bool, origin: Origin) -> int:
    """As agent/run/child.py does for a fresh rank: warnings on stderr, or exit 2."""
    sys.path[:0] = origin.paths.split(os.pathsep)
    from agent.errors import AgentError
    from agent.warm.numa_apply import apply_binding

    try:
        for warning in apply_binding(cpus, mems, strict):
            print(f"[agent] {warning}", file=sys.stderr)
    except AgentError as exc:
        print(f"[agent] cannot bind rank: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


def _base_path(origin: Origin, env: Mapping[str, str], cwd: str) -> list[str]:
    """The zygote's base path; site made relative PYTHONPATH entries absolute against the
    zygote's cwd, a fresh rank would have made them absolute against its own."""
    path = list(origin.path)
    if os.path.realpath(cwd) == os.path.realpath(origin.cwd):
        return path
    for entry in env.get("PYTHONPATH", "").split(os.pathsep):
        if not os.path.isabs(entry):
            theirs = os.path.abspath(os.path.join(origin.cwd, entry))
            path = [os.path.abspath(entry) if p == theirs else p for p in path]
    return path


def _stdio(origin: Origin, buffered: bool) -> None:
    """sys.stdin/stdout/stderr as CPython's create_stdio makes them at start (pylifecycle.c)."""
    # sys.__stdout__ and the others are Final to the type checker, not to the interpreter
    sys.stdin = sys.__stdin__ = _stream(0, "<stdin>", origin.encoding, origin.errors, buffered)  # type: ignore[misc]
    sys.stdout = sys.__stdout__ = _stream(1, "<stdout>", origin.encoding, origin.errors, buffered)  # type: ignore[misc]
    sys.stderr = sys.__stderr__ = _stream(  # type: ignore[misc]
        2, "<stderr>", origin.encoding, "backslashreplace", buffered
    )
    faulthandler = sys.modules.get("faulthandler")
    if faulthandler is not None and faulthandler.is_enabled():
        faulthandler.enable(sys.stderr)  # PYTHONFAULTHANDLER: it held the zygote's stderr


def _stream(fd: int, name: str, encoding: str | None, errors: str | None, buffered: bool) -> Any:
    import io

    write = fd != 0
    buffering = 0 if write and not buffered else -1  # stdin is always buffered
    # closefd=False: the stream lives as long as the process, and fds 0-2 must never close.
    buf: Any = io.open(fd, "wb" if write else "rb", buffering, closefd=False)  # noqa: SIM115, UP020
    raw = buf.raw if buffering else buf
    raw.name = name
    line_buffering = buffered and (raw.isatty() or fd == 2)
    stream: Any = io.TextIOWrapper(buf, encoding, errors, "\n", line_buffering, not buffered)
    stream.mode = "w" if write else "r"
    return stream
