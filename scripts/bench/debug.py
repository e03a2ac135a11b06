"""14. `agent debug` on a paused job (2 loopback nodes × 1 rank; rank 1 paused at breakpoint()).

What a user waits for: one pdb line in an attached session (node 0's endpoint → the job store →
rank 1's agent → its unix socket → pdb, and back), and whole commands with the interpreter's
start included: `agent debug -c 'p x' --rank 1`, `agent debug --list`, and, as the peer on the
same job, `agent stacks LOG_DIR` (the same path to node 0, py-spy instead of pdb) and
`python -m agent --help` (the interpreter's floor for a command of ours).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from bench import common as c
from bench.stats import Table, Target, median, secs, spread

LINE_TARGET = 0.1  # seconds for one pdb line in a session: typing must not feel remote
LINES = 50  # lines timed in the session


def _agents(work: Path, log_dir: Path) -> c.Started:
    job = c.unique_job()
    commands = []
    for node in range(2):
        env = c.base_env(**c.slurm_env(job, 2, node))
        argv = [c.PY, "-m", "agent", "--log-dir", str(log_dir), c.program("pause_rank")]
        commands.append((argv, env, work / f"debug-agent-{job}-{node}.log"))
    return c.start(commands, work)


def _command(args: list[str], work: Path) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.monotonic()
    proc = subprocess.run(
        [c.PY, "-m", "agent", *args], env=c.base_env(), cwd=work, capture_output=True,
        text=True, stdin=subprocess.DEVNULL, timeout=60,
    )  # fmt: skip
    return time.monotonic() - t0, proc


def _session_lines(log_dir: Path, lines: int) -> list[float]:
    """Round trips of `p x` in one attached session (the client's own code, no terminal)."""
    from agent.serve import client

    env = c.base_env()
    target = client.locate(env, Path.home(), str(log_dir / "control.json"))
    channel = client.open_channel(target, env, Path.home())
    took = []
    try:
        request = {"op": "debug", "action": "attach", "rank": 1, "client": "bench"}
        channel.send(request)
        first = channel.recv(30)
        if not first or "attached" not in first:
            raise RuntimeError(f"attach refused: {first}")
        for _ in range(lines):
            t0 = time.monotonic()
            channel.send({"line": "p x"})
            reply = channel.recv(30)
            took.append(time.monotonic() - t0)
            if not reply or reply.get("output") != "42\n":
                raise RuntimeError(f"unexpected answer: {reply}")
    finally:
        channel.close()
    return took


def run(reps: int, work: Path, log) -> dict[str, Any]:
    log_dir = work / f"debug-{c.unique_job()}"
    job = _agents(work, log_dir)
    data: dict[str, Any] = {"commands": {}, "ok": False}
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if (log_dir / "control.json").exists():
                _, listed = _command(["debug", str(log_dir)], work)
                if "rank 1 (" in listed.stdout:
                    break
            time.sleep(0.1)
        else:
            raise RuntimeError("rank 1 never paused")
        data["session"] = _session_lines(log_dir, LINES)
        log(f"debug: session line median {median(data['session']) * 1000:.1f} ms")
        commands = {
            "agent debug -c 'p x' --rank 1": ["debug", str(log_dir), "--rank", "1", "-c", "p x"],
            "agent debug --list": ["debug", str(log_dir), "--list"],
            "agent stacks LOG_DIR (peer, same job)": ["stacks", str(log_dir)],
            "python -m agent --help (floor)": ["--help"],
        }
        for name, args in commands.items():
            times = []
            for _ in range(reps):
                took, proc = _command(args, work)
                if proc.returncode != 0:
                    raise RuntimeError(f"{name}: exit {proc.returncode}: {proc.stderr}")
                times.append(took)
            data["commands"][name] = times
            log(f"debug: {name}: {median(times):.3f} s")
        _, went_on = _command(["debug", str(log_dir), "--rank", "1", "-c", "c"], work)
        data["ok"] = job.wait(60) and job.codes == [0, 0] and went_on.returncode == 0
        data["after"] = "after 42" in (log_dir / "rank-00001.out").read_text(errors="replace")
    finally:
        job.kill()
    return data


def summarize(data: dict[str, Any]) -> tuple[Table, list[Target], dict[str, Any]]:
    table = Table(
        "14. `agent debug` on a paused 2 × 1 job (rank 1 at breakpoint(); wall times)",
        ["what", "median", "spread", "n"],
    )
    session = data.get("session", [])
    low, high = (min(session), max(session)) if session else (0.0, 0.0)
    table.add(
        "one pdb line (`p x`) in an attached session",
        secs(median(session), 4),
        f"{low * 1000:.1f}–{high * 1000:.1f} ms",
        len(session),
    )

    for name, times in data["commands"].items():
        table.add(name, secs(median(times), 3), spread(times), len(times))
    table.notes.append(
        "a session line: client → node 0's endpoint (AES-GCM) → the job store → rank 1's "
        "agent → its unix socket → pdb, and back; commands include the interpreter's start, "
        f"the secret check and node 0's answer; job exited 0 after `-c c`: "
        f"{'yes' if data.get('ok') and data.get('after') else 'NO'}"
    )
    line = median(session)
    ok = line is not None and line <= LINE_TARGET and bool(data.get("ok"))
    target = Target(
        "agent debug: one pdb line in a session", f"≤ {LINE_TARGET} s", secs(line, 4), ok
    )
    return table, [target], {"session_median_s": line}
