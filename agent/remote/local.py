"""CMD on this node: run it under agent.run.child, bounded by --timeout, its output captured."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence

from agent.errors import ExitCode
from agent.remote.collate import NodeOutput
from agent.run.workers import wrapper_argv

OUTPUT_CAP = 1 << 20  # bytes of output per node kept and sent to node 0
KILL_GRACE = 2.0  # SIGTERM → SIGKILL, for a command past --timeout


def exit_status(result: NodeOutput) -> int:
    """This node's own exit code, shell-style: 124 timed out, 128+N killed by signal N."""
    if result.code is None:
        return int(ExitCode.RANK_FAILED)
    if result.timed_out:
        return 124
    return 128 - result.code if result.code < 0 else min(result.code, 255)


class LocalRun:
    """CMD on this node. Output goes to an unnamed temp file: nothing blocks on a full pipe, and a
    daemonised grandchild holding the output open cannot keep us waiting."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], timeout: float | None) -> None:
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._out = tempfile.TemporaryFile()  # noqa: SIM115 (closed by __exit__)
        self._timed_out = False
        # agent.run.child sets PDEATHSIG, so CMD dies with us even if we are SIGKILLed.
        self._proc = subprocess.Popen(
            wrapper_argv(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
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
                return self._proc.wait(KILL_GRACE)
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
