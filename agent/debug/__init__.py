"""`python -m agent debug [LOG_DIR] [--rank R [--pid P] | --all] [--list] [-c CMD]`: the ranks
paused in pdb (`breakpoint()`, or `--pdb` at an uncaught exception), and a pdb session with one
of them (a rank with several paused processes, a forked worker's among them: by its pid).

Found like `agent stacks`: LOG_DIR/control.json for a one-shot job, else the resident agents'
connection file; everything goes through node 0's authenticated endpoint
(agent.control.debug_service). Torch-free: the client starts at once.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agent.control.wire import Channel
from agent.errors import AgentError, ExitCode
from agent.history import log_dir_of
from agent.pause.paused import (
    Paused,
    label,
    parse_answer_key,
    render_answers,
    render_list,
    several,
)
from agent.plan.log_dir import LogDir
from agent.serve import client, pdb_terminal
from agent.serve.commands import has_verdict, killed, not_live, with_log_dir_hint
from agent.text import printable
from agent.usage import Parser

_HELP_SERVE = "the resident agents' connection file (default: found from SLURM_JOB_ID)"


def parser() -> Parser:
    p = Parser(
        prog="python -m agent debug",
        subcommand="debug",
        description="Ranks paused in pdb (breakpoint() in any rank; --pdb: at an uncaught "
        "exception): list them, open a pdb session with one (Ctrl-D or Ctrl-] detaches and "
        "leaves it paused), or run one pdb command on several, answers collated. Finds the job "
        "from LOG_DIR (control.json) or, inside an allocation, the resident agents.",
        allow_abbrev=False,
    )
    p.add_argument(
        "log_dir", nargs="?", metavar="LOG_DIR", help="the job's log dir, or its id (8.0, 8.0.r3)"
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int, metavar="R", help="this paused rank")
    which.add_argument("--all", action="store_true", help="every paused rank (with -c)")
    p.add_argument(
        "--pid",
        type=int,
        metavar="PID",
        help="with --rank: this process of the rank (when several are paused: a forked worker)",
    )
    p.add_argument("--list", action="store_true", help="the paused ranks (the default)")
    p.add_argument("-c", dest="command", metavar="CMD", help="one pdb command, e.g. 'p loss'")
    p.add_argument("--serve", metavar="FILE", help=_HELP_SERVE)
    return p


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    ns = parser().parse_args(list(argv))
    if ns.all and ns.command is None:
        raise AgentError("agent debug: --all needs -c CMD (one command on every paused rank)")
    if ns.pid is not None and (ns.rank is None or ns.command is not None):
        raise AgentError("agent debug: --pid goes with --rank R (a session with that process)")
    channel, run = _connect(ns.log_dir, ns.serve, environ)
    try:
        base: dict[str, Any] = {"op": "debug"} if run is None else {"op": "debug", "run": run}
        if ns.command is not None and (ns.all or ns.rank is not None):
            ranks: Any = "all" if ns.all else [ns.rank]
            return _command(
                channel, {**base, "action": "command", "ranks": ranks, "line": ns.command}
            )
        if ns.rank is not None and not ns.list:
            attach = {**base, "action": "attach", "rank": ns.rank}
            return pdb_terminal.session(
                channel, attach if ns.pid is None else {**attach, "pid": ns.pid}
            )
        channel.send({**base, "action": "list"})
        reply = _answer(channel, "paused")
        paused = [Paused.from_json(item) for item in reply if isinstance(item, dict)]
        sys.stdout.write(printable(render_list(paused)))
        return 0
    finally:
        channel.close()


def _connect(
    log_dir: str | None, serve: str | None, environ: Mapping[str, str]
) -> tuple[Channel, int | None]:
    home = Path.home()
    if log_dir is not None:  # LOG_DIR, or the id of its job (agent history's)
        log_dir = log_dir_of(log_dir, environ)
    control = LogDir(log_dir).control if log_dir is not None else None
    live = control is None or (os.path.isfile(control) and not killed(log_dir or ""))
    if log_dir is not None and serve is None and not live:
        raise not_live(log_dir)
    try:
        target = client.locate(environ, home, serve or control)
    except AgentError as exc:
        if serve is not None or control is not None:
            raise
        raise with_log_dir_hint(exc, "debug") from None
    try:
        return client.open_channel(target, environ, home), target.run
    except AgentError as exc:
        finished = log_dir is not None and exc.code == ExitCode.RENDEZVOUS
        if finished and (has_verdict(log_dir or "") or killed(log_dir or "")):
            raise not_live(log_dir or "") from None
        raise


def _answer(channel: Channel, key: str) -> Any:
    reply = pdb_terminal.reply(channel)
    if key not in reply:
        raise AgentError(
            f"node 0's agent sent no {key!r} (a different version?)", ExitCode.RENDEZVOUS
        )
    return reply[key]


def _command(channel: Channel, request: dict[str, Any]) -> int:
    channel.send(request)
    reply = pdb_terminal.reply(channel)
    found = reply.get("answers")
    answers: dict[str, Any] = found if isinstance(found, dict) else {}
    texts = {}
    for key, answer in answers.items():
        process = parse_answer_key(key)
        if not isinstance(answer, dict) or process is None:
            continue
        parts = (str(answer.get("output", "")).rstrip("\n"), _state_note(answer.get("state")))
        texts[process] = "\n".join(part for part in parts if part) + "\n"
    if texts:
        sys.stdout.write(printable(render_answers(texts)))
    held = reply.get("held")
    owners = {
        process: owner
        for key, owner in (held if isinstance(held, dict) else {}).items()
        if (process := parse_answer_key(key)) is not None
    }
    named = several([*texts, *owners])
    for process, owner in sorted(owners.items()):
        who = label([process], named)
        print(f"agent debug: {who} is being debugged by {printable(str(owner))}", file=sys.stderr)
    return 0


def _state_note(state: object) -> str:
    return {
        "gone": "(the rank left pdb)",  # what it does next, the rank says (pause.hook)
        "running": "(the rank runs on; it will pause again at a breakpoint)",
        "busy": "(still running that command; ask again for its output)",
    }.get(str(state), "")
