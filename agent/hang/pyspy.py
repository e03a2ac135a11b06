"""One `py-spy dump --json` per rank: find the binary, run it without blocking, parse its JSON.

py-spy 0.4 prints a list of threads, each {"thread_id", "thread_name", "os_thread_id",
"active", "owns_gil", "frames": [{"name", "filename", "short_filename", "line", "module",
"locals", ...}]}, frames innermost FIRST; --native adds C frames (a library as filename, line 0).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence

from agent.hang.stacks import MAIN_THREAD, MAX_THREADS, Frame, ThreadStack, one_line, thread_stack

MAX_OUTPUT = 32 << 20  # bytes of JSON read from one dump; more is an error, not a stall


def find_pyspy() -> str | None:
    """py-spy next to this interpreter (a virtual environment's bin/), else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    return shutil.which("py-spy")


def parse_dump(text: str | bytes, pid: int) -> tuple[ThreadStack, ...]:
    """py-spy's JSON as threads, the main thread first, frames innermost last. ValueError when
    the text is not such a list; odd entries inside it are skipped."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"py-spy printed no JSON: {exc}") from None
    if not isinstance(data, list):
        raise ValueError("py-spy's JSON is not a list of threads")
    threads = [_thread(item, pid) for item in data if isinstance(item, dict)]
    threads.sort(key=lambda t: t.name != MAIN_THREAD)  # stable: py-spy's order otherwise
    return tuple(threads[:MAX_THREADS])


def error_line(stderr: bytes, code: int | None) -> str:
    """py-spy's "Error: ..." line, with its first "Caused by" reason (permission, gone)."""
    lines = [line.strip() for line in stderr.decode(errors="replace").splitlines()]
    found = next((i for i, line in enumerate(lines) if line.startswith("Error:")), None)
    if found is None:
        message = next((line for line in lines if line), "") or f"py-spy exited with {code}"
        return one_line(message)
    message = lines[found].removeprefix("Error:").strip()
    rest = lines[found + 1 :]
    if "Caused by:" in rest:
        cause = next((line for line in rest[rest.index("Caused by:") + 1 :] if line), "")
        message = f"{message} ({cause.partition(': ')[2] or cause})" if cause else message
    return one_line(f"py-spy: {message}")


class Spy:
    """A running `py-spy dump` and what it printed so far."""

    def __init__(self, binary: str, pid: int, native: bool) -> None:
        command = [binary, "dump", "--pid", str(pid), "--json", *(["--native"] if native else [])]
        env = {**os.environ, "RUST_BACKTRACE": "0", "RUST_LIB_BACKTRACE": "0"}
        self.pid = pid
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.out = self.proc.stdout.fileno()
        self.err = self.proc.stderr.fileno()
        self.chunks: dict[int, list[bytes]] = {self.out: [], self.err: []}
        self.size = 0
        self.open = {self.out, self.err}

    def feed(self, fd: int) -> None:
        """Read what fd has; at its end (or past MAX_OUTPUT) the fd is closed."""
        data = os.read(fd, 1 << 16)
        self.chunks[fd].append(data)
        self.size += len(data)
        if self.size > MAX_OUTPUT:
            self.open.clear()  # result() kills it: py-spy may be blocked writing the rest
        elif not data:
            self.open.discard(fd)

    def result(self) -> tuple[ThreadStack, ...]:
        """The threads, once both pipes ended; ValueError with py-spy's reason when it failed."""
        if self.size > MAX_OUTPUT:
            self.stop()
            raise ValueError(f"py-spy printed over {MAX_OUTPUT >> 20} MiB")
        code = self.proc.wait()
        self.close()
        if code != 0:
            raise ValueError(error_line(b"".join(self.chunks[self.err]), code))
        threads = parse_dump(b"".join(self.chunks[self.out]), self.pid)
        if not threads:
            raise ValueError("py-spy found no Python thread")
        return threads

    def stop(self) -> None:
        """Kill py-spy; SIGCONT the rank, which a py-spy killed while attaching leaves stopped."""
        self.proc.kill()
        self.proc.wait()
        self.close()
        try:
            os.kill(self.pid, signal.SIGCONT)
        except OSError:
            pass

    def close(self) -> None:
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def _thread(item: dict, pid: int) -> ThreadStack:
    name = item.get("thread_name")
    if not isinstance(name, str) or not name:
        ident = item.get("os_thread_id")
        main = ident == pid and isinstance(ident, int)
        name = MAIN_THREAD if main else f"thread {item.get('thread_id', '?')}"
    idle = item.get("idle")
    if not isinstance(idle, bool):
        idle = item.get("active") is False
    frames = item.get("frames")
    found = frames if isinstance(frames, list) else []
    return thread_stack(name, idle, reversed(_frames(found)))


def _frames(items: Sequence[object]) -> list[Frame]:
    frames = []
    for item in items:
        if not isinstance(item, dict):
            continue
        name, file, line = item.get("name"), item.get("filename"), item.get("line")
        file = file if isinstance(file, str) else item.get("short_filename")
        frames.append(
            Frame(
                name if isinstance(name, str) else "?",
                file if isinstance(file, str) else "?",
                line if isinstance(line, int) and not isinstance(line, bool) and line > 0 else 0,
            )
        )
    return frames
