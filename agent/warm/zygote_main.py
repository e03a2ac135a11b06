"""The zygote process: import the preload list once, then fork ranks on the agent's request.

Usage: python zygote_main.py AGENT_PID CONTROL_FD PATHS PRELOAD PADDING
(PRELOAD a comma list of modules, PATHS the os.pathsep-joined directories holding the agent
package and py-libnuma, PADDING room for the ranks' command lines: see proctitle.py).
Started by path with no interpreter flags, so sys.flags, site and the base sys.path are those
of `python script.py`. Imports stay out of the module level: whatever this process imports
besides the preload list (and ctypes, for PDEATHSIG) is dropped from a rank's sys.modules.

Single-threaded on purpose (fork copies only the calling thread): one selector loop over the
control socket and the SIGCHLD wakeup pipe. Protocol, one JSON object per line: the agent sends
{"op": "fork", "id", "form", "target", "args", "argv", "env", "cwd", "cpus", "mems", "strict",
"adopt", ...} with the rank's stdout and stderr pipes and the read end of its go pipe attached
(SCM_RIGHTS); the zygote answers "ready" (once), "forked" {"id", "pid"} or {"id", "error"}, and,
for a rank not adopted, "exit" {"id", "pid", "code"} when it reaped one. An adopted rank is
forked through a middle process that exits at once; "forked" comes once the middle is reaped,
so the rank is the agent's child by then (the agent is a subreaper). The rank waits for one
byte on its go pipe (the agent knows its pid) before it runs anything.
"""

from __future__ import annotations

import os
import sys

_PR_SET_PDEATHSIG = 1


def _die_with_agent(agent: int) -> None:
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != agent:  # the agent died before prctl: nobody would ever signal us
        os._exit(1)


def _preload(names: list[str]) -> dict:
    """Import each module; a failure is reported, not fatal (the ranks import it themselves)."""
    import time

    start = time.monotonic()
    loaded, failed = [], {}
    for name in names:
        try:
            __import__(name)
            loaded.append(name)
        except (Exception, SystemExit) as exc:
            failed[name] = (f"{type(exc).__name__}: {exc}".splitlines() or [""])[0][:300]
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    return {
        "pid": os.getpid(),
        "preload": names,
        "loaded": loaded,
        "failed": failed,
        "seconds": round(time.monotonic() - start, 3),
        "cuda_initialised": bool(cuda is not None and cuda.is_initialized()),
        "threads": len(os.listdir("/proc/self/task")),  # OpenBLAS's pool: joined at each fork
        "python": sys.version.split()[0],
    }


def _captured(names: list[str]) -> tuple[dict, tuple[bytes, bytes]]:
    """_preload with fds 1 and 2 on memory files: what the imports print (a warning, say) is
    what every fresh rank would print, so each rank is handed a copy."""
    limit = 1 << 16
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    files = os.memfd_create("zygote-stdout"), os.memfd_create("zygote-stderr")
    os.dup2(files[0], 1)
    os.dup2(files[1], 2)
    try:
        info = _preload(names)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, old in zip((1, 2), saved, strict=True):
            os.dup2(old, fd)
            os.close(old)
    output = os.pread(files[0], limit, 0), os.pread(files[1], limit, 0)
    for fd in files:
        os.close(fd)
    info["output"] = b"".join(output).decode(errors="replace")[-4096:]
    return info, output


def main(argv: list[str]) -> tuple[int, bool]:
    """Serve until the agent goes away (then exit here); return only in a forked rank, with its
    (exit code, uncaught KeyboardInterrupt) for the interpreter's own shutdown."""
    agent, control, paths, names = int(argv[0]), int(argv[1]), argv[2], argv[3]
    del sys.path[0]  # this file's directory: not part of `python script.py`'s path
    base_path = list(sys.path)
    _die_with_agent(agent)
    info, output = _captured([n for n in names.split(",") if n])
    modules = frozenset(sys.modules)
    fds = frozenset(int(fd) for fd in os.listdir("/proc/self/fd")) - {control}
    sys.path[:0] = paths.split(os.pathsep)
    from agent.warm.serve import serve

    sys.path[:] = base_path
    return serve(control, info, modules, fds, base_path, paths, output)


def _already_printed(*_: object) -> None:
    """The rank printed its own traceback (from the user's frames, not the zygote's)."""


if __name__ == "__main__":
    code, interrupted = main(sys.argv[1:])
    if interrupted:
        # Raised from the main module, an uncaught KeyboardInterrupt makes CPython finalise and
        # then kill itself with SIGINT (exit status -2), as the user's script would have.
        sys.excepthook = _already_printed
        raise KeyboardInterrupt
    sys.exit(code)
