"""A client of the agent in a pseudo-terminal, as a user in the salloc shell runs it, and the
debug session most tests hold with a paused rank."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

from cluster import base_env


class Terminal:
    """A client in a pseudo-terminal, as a user in the salloc shell runs it."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
        master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent", *argv], env=env, cwd=cwd,
            stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
        )  # fmt: skip
        os.close(slave)
        self.master, self.seen = master, b""

    @classmethod
    def debug(cls, cluster, *args: str) -> Terminal:
        return cls(["debug", str(cluster.log_dir), *args], base_env(cluster.tmp))

    def expect(self, text: str, timeout: float = 60) -> str:
        """Everything up to and including `text`."""
        deadline = time.monotonic() + timeout
        while text.encode() not in self.seen:
            ready, _, _ = select.select([self.master], [], [], max(0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError(f"no {text!r} in {self.seen.decode(errors='replace')!r}")
            try:
                self.seen += os.read(self.master, 4096)
            except OSError:  # the client exited
                raise AssertionError(
                    f"no {text!r}: {self.seen.decode(errors='replace')!r}"
                ) from None
        cut = self.seen.index(text.encode()) + len(text)
        before, self.seen = self.seen[:cut], self.seen[cut:]
        return before.decode(errors="replace")

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> int:
        code = self.proc.wait(30)
        os.close(self.master)
        return code


def print_x_and_continue(terminal) -> None:
    """In rank 1's pdb session: `p x` answers 42, `c` lets the rank go on, the client ends 0."""
    terminal.expect("(Pdb) ")
    terminal.type("p x\n")
    assert "42" in terminal.expect("(Pdb) ").splitlines()[-2]
    terminal.type("c\n")
    terminal.expect("rank 1 left pdb")
    assert terminal.close() == 0
