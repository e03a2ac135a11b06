"""Resident agents on loopback for tests: N `python -m agent serve` with a fake SLURM env each,
and clients (`run`, `status`, `down`) started as real processes from a shell-like env."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from cluster import Agent, base_env, slurm_env, wait_for


@dataclass
class Serving:
    tmp: Path
    nnodes: int
    serve_args: tuple[str, ...] = ()
    job: str = field(default_factory=lambda: str(uuid.uuid4().int % 10**9))
    agents: list[Agent] = field(default_factory=list)

    @property
    def state(self) -> Path:
        return self.tmp / "state"

    @property
    def connection_file(self) -> Path:
        return self.state / f"serve-{self.job}.json"

    def start(self, nodes: list[int] | None = None) -> Serving:
        for node in range(self.nnodes) if nodes is None else nodes:
            env = self.shell_env()
            env.update(slurm_env(self.job, self.nnodes, node, "0"))
            env["LAUNCH_AGENT_JOB"] = f"{self.job}.0"  # marks every process of the job
            out = self.tmp / f"serve-{node}.out"
            err = self.tmp / f"serve-{node}.err"
            argv = [sys.executable, "-m", "agent", "serve", *self.serve_args]
            with open(out, "wb") as o, open(err, "wb") as e:
                proc = subprocess.Popen(
                    argv, env=env, stdout=o, stderr=e, stdin=subprocess.DEVNULL,
                    cwd=self.tmp, start_new_session=True,
                )  # fmt: skip
            self.agents.append(Agent(node, proc, out, err))
        return self

    def shell_env(self) -> dict[str, str]:
        """The allocation's shell: same secret and state dir, SLURM_JOB_ID, no step variables."""
        env = base_env(self.tmp)
        env["AGENT_STATE_DIR"] = str(self.state)
        env["SLURM_JOB_ID"] = self.job
        return env

    def ready(self, timeout: float = 120.0) -> Serving:
        wait_for(self.connection_file.exists, timeout, "node 0 to write its connection file")
        wait_for(
            lambda: (
                self.status().stdout.count(" ready ") + self.status().stdout.count(" running ")
                == self.nnodes
            ),
            timeout,
            "every agent to be ready",
            interval=0.2,
        )
        return self

    def client(
        self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, **kw
    ) -> subprocess.Popen:
        full = self.shell_env()
        full.update(env or {})
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        return subprocess.Popen(
            [sys.executable, "-m", "agent", *args], env=full, cwd=cwd or self.tmp,
            stdin=subprocess.DEVNULL, **kw,
        )  # fmt: skip

    def call(self, *args: str, timeout: float = 120.0, **kw) -> subprocess.CompletedProcess:
        proc = self.client(*args, **kw)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            hung = f"`agent {' '.join(args)}` hung:\n{err.decode()}\n{self.dump()}"
            raise AssertionError(hung) from None
        return subprocess.CompletedProcess(
            proc.args, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
        )

    def status(self) -> subprocess.CompletedProcess:
        return self.call("status", timeout=30)

    def alive(self) -> list[int]:
        return [a.node for a in self.agents if a.proc.poll() is None]

    def wait(self, timeout: float = 60.0) -> list[int]:
        wait_for(lambda: not self.alive(), timeout, "every resident agent to exit")
        return [a.proc.returncode for a in self.agents]

    def kill(self) -> None:
        for agent in self.agents:
            if agent.proc.poll() is None:
                os.killpg(agent.proc.pid, signal.SIGKILL)
                agent.proc.wait()

    def dump(self) -> str:
        return "\n".join(f"--- serve {a.node} stderr:\n{a.stderr()}" for a in self.agents)
