"""`python -m agent run|status|down`: the clients of the resident agents (torch-free)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from agent.errors import AgentError, ExitCode
from agent.launch.cli import misplaced_warning
from agent.plan.client_env import client_env
from agent.plan.log_dir import LogDir, stacks_attempt
from agent.serve import client
from agent.serve.cli import parse_client
from agent.text import printable


def main(action: str, argv: Sequence[str], environ: Mapping[str, str]) -> int:
    command = parse_client(action, argv)  # --help and usage errors before any connection
    warning = misplaced_warning(command.run) if command.run is not None else None
    if warning is not None:  # here, once: node 0 parses the run again, silently
        print(f"agent: warning: {printable(warning, one_line=True)}", file=sys.stderr, flush=True)
    home = Path.home()
    log_dir = command.log_dir if command.serve_file == _control(command.log_dir) else None
    if log_dir is not None:  # LOG_DIR, or the id of its job (agent history's)
        from agent.history import log_dir_of  # sqlite3 and the summary's reader: not for `run`

        log_dir = log_dir_of(log_dir, environ)
        command = replace(command, serve_file=_control(log_dir), log_dir=log_dir)
    if log_dir is not None and (not os.path.isfile(LogDir(log_dir).control) or killed(log_dir)):
        raise not_live(log_dir)
    try:
        target = client.locate(environ, home, command.serve_file)
    except AgentError as exc:
        if command.serve_file is not None or action not in LOG_DIR_ACTIONS:
            raise
        raise with_log_dir_hint(exc, action) from None
    try:
        channel = client.open_channel(target, environ, home)
    except AgentError as exc:
        unreachable = exc.code == ExitCode.RENDEZVOUS
        if log_dir is not None and unreachable and (has_verdict(log_dir) or killed(log_dir)):
            raise not_live(log_dir) from None
        raise
    if action == "top":
        from agent.serve.top_view import follow

        opener = lambda: client.open_channel(target, environ, home)  # noqa: E731
        ended = None
        if log_dir is not None:
            ended = lambda: has_verdict(log_dir) or killed(log_dir)  # noqa: E731
        return follow(channel, opener, target.run, "--once" in command.argv, ended, sys.stdout)
    try:
        if action == "status":
            return client.status(channel, sys.stdout)
        if action == "down":
            return client.down(channel, sys.stdout)
        if action == "stacks":
            native = "--native" in command.argv
            ranks = command.argv[-1]
            request = {"op": "stacks", "native": native, "ranks": ranks}
            if target.run is not None:  # LOG_DIR's run: never a later run's ranks
                request["run"] = target.run
            channel.send(request)
            reply = client.answer(channel, "stacks", 60.0, sys.stdout)
            text = reply.get("text", "") if isinstance(reply, dict) else ""
            text = printable(text)
            sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
            return 0
        exported, _ = client_env(environ)  # the secret and the shell's own SLURM_* stay here
        request = {"op": "run", "argv": list(command.argv), "cwd": os.getcwd(), "env": exported}
        attach = None
        if command.attach:
            attach = lambda rank, run: _attach(target, environ, home, rank, run)  # noqa: E731
        return client.run(channel, request, sys.stdout.buffer, sys.stderr.buffer, attach)
    finally:
        channel.close()


def _attach(
    target: client.Target, environ: Mapping[str, str], home: Path, rank: int, run: int | None
) -> None:
    """`agent run --attach`: a pdb session with `rank` of `run`, over a connection of its own."""
    try:
        channel = client.open_channel(target, environ, home)
    except AgentError as exc:
        print(f"agent: error: {printable(exc.message)}", file=sys.stderr)
        return
    from agent.serve import pdb_terminal

    try:
        request = {"op": "debug", "action": "attach", "rank": rank, "run": run}
        pdb_terminal.session(channel, request)
    except AgentError as exc:
        print(f"agent: error: {printable(exc.message)}", file=sys.stderr)
    finally:
        channel.close()


def not_live(log_dir: str) -> AgentError:
    """`agent stacks LOG_DIR` when no node 0 answers for LOG_DIR: what its files say instead
    (3: no job to ask; 2: LOG_DIR is not a directory)."""
    from agent.history.liveness import KILLED, unfinished

    summary = LogDir(log_dir).summary
    judged = unfinished(log_dir)
    if judged is not None and judged[0] == KILLED:  # the record of its start, never completed
        return AgentError(
            f"{judged[1]}: there is nothing to ask; what its ranks wrote: python -m agent logs "
            f"{log_dir}",
            ExitCode.RENDEZVOUS,
        )
    if os.path.isfile(summary) and judged is None:
        stacks = sorted(LogDir(log_dir).stacks(n) for n in _stacks_attempts(log_dir))
        saved = f"its stacks at the hang: {', '.join(stacks)}; " if stacks else ""
        return AgentError(
            f"the job of {log_dir} has finished: {saved}its summary: {summary}",
            ExitCode.RENDEZVOUS,
        )
    if not os.path.isdir(log_dir):
        return AgentError(
            f"{log_dir} is not a directory, nor the id of a job this user ran: pass the job's "
            "log dir (--log-dir) or its id (agent history lists them)"
        )
    return AgentError(
        f"{log_dir} has no control.json (node 0 writes it while the job runs) and no "
        "summary.json: the job has not started yet, or this is not a job's log dir",
        ExitCode.RENDEZVOUS,
    )


LOG_DIR_ACTIONS = ("stacks", "top", "debug")  # the clients that also reach a one-shot job
MAX_LISTED = 100_000  # entries of logs/ looked at for the newest job


def with_log_dir_hint(exc: AgentError, action: str) -> AgentError:
    """No LOG_DIR and no resident agents found: `exc`, and the one-shot job the user may have
    meant (the newest under ./logs/, where a job's log dir goes by default)."""
    if exc.code != ExitCode.RENDEZVOUS:
        return exc
    newest = newest_job_dir("logs")
    job = (
        f"the newest job's log dir here is {newest}: python -m agent {action} {newest}"
        if newest is not None
        else f"name a one-shot job by its log dir: python -m agent {action} LOG_DIR"
    )
    return AgentError(f"no LOG_DIR given; {job} (and {exc.message})", exc.code)


def newest_job_dir(base: str) -> str | None:
    """The directory under `base` whose job wrote last (its control.json or summary.json:
    node 0 writes them when the job starts and ends), as `base/NAME`; None when there is none."""
    best: tuple[float, str] | None = None
    try:
        with os.scandir(base) as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_LISTED:
                    break
                files = LogDir(entry.path)
                for path in (files.control, files.summary):
                    try:
                        when = os.stat(path).st_mtime
                    except OSError:
                        continue
                    if best is None or (when, entry.name) > best:
                        best = (when, entry.name)
    except OSError:
        return None
    return None if best is None else os.path.join(base, best[1])


def killed(log_dir: str) -> bool:
    """Whether LOG_DIR's job ended without its summary: its agents were killed."""
    from agent.history.liveness import KILLED, unfinished

    judged = unfinished(log_dir)
    return judged is not None and judged[0] == KILLED


def has_verdict(log_dir: str) -> bool:
    from agent.history.liveness import unfinished

    return os.path.isfile(LogDir(log_dir).summary) and unfinished(log_dir) is None


def _control(log_dir: str | None) -> str | None:
    return None if log_dir is None else LogDir(log_dir).control


def _stacks_attempts(log_dir: str) -> list[int]:
    """The attempts whose stacks node 0's hang judge saved in LOG_DIR."""
    try:
        names = os.listdir(log_dir)
    except OSError:
        return []
    return sorted(n for n in map(stacks_attempt, names) if n is not None)
