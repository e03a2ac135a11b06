"""A pdb session with one paused rank in this terminal (`agent debug --rank R`, `agent run
--attach`): pdb's prompt and commands with line editing; Ctrl-D or Ctrl-] detaches and leaves
the rank paused. Lines go to node 0's endpoint (agent.control.debug_service), one at a time."""

from __future__ import annotations

import getpass
import os
import socket
import sys
from typing import Any, TextIO

from agent.control.wire import Channel
from agent.errors import AgentError, ExitCode
from agent.pause.paused import Paused
from agent.text import printable

DETACH = "\x1d"  # Ctrl-]
REPLY_TIMEOUT = 90.0  # node 0 answers within its own bounded waits; this only catches a lost one


def session(channel: Channel, request: dict[str, Any], out: TextIO | None = None) -> int:
    """Attach (`request`: {"op": "debug", "action": "attach", "rank", ...}) and talk until the
    rank leaves pdb or the user detaches; 0 either way."""
    out = out or sys.stdout
    channel.send({**request, "client": client_name()})
    answer = reply(channel)
    paused = Paused.from_json(answer.get("attached"))
    print(
        f"rank {paused.rank} on {paused.host}, paused at {paused.file}:{paused.line} in "
        f"{paused.function} ({paused.reason}); Ctrl-D or Ctrl-] detaches and leaves it paused",
        file=out,
    )
    _editing()
    output, state = str(answer.get("output", "")), "prompt"
    while True:
        _show(output, out)
        if state == "gone":
            print(f"[agent] rank {paused.rank} left pdb", file=out)
            return 0
        if state == "prompt":
            try:
                line = input("(Pdb) ")
            except EOFError:
                line = DETACH
                print(file=out)
            if DETACH in line:
                print(f"[agent] detached; rank {paused.rank} stays paused", file=out)
                return 0
            channel.send({"line": line})
        else:
            channel.send({"take": True})
        answer = reply(channel)
        output, state = str(answer.get("output", "")), str(answer.get("state", "busy"))
        if state == "running" and not output:
            output = "[agent] the rank runs on; waiting for it to pause again\n"


def reply(channel: Channel) -> dict[str, Any]:
    """Node 0's next answer; its error as AgentError."""
    answer = channel.recv(REPLY_TIMEOUT)
    if answer is None:
        raise AgentError(
            "node 0's agent closed the connection (the job may have ended)", ExitCode.RENDEZVOUS
        )
    if "error" in answer:
        code = answer.get("code")
        raise AgentError(str(answer["error"]), code if isinstance(code, int) else 2)
    return answer


def _show(text: str, out: TextIO) -> None:
    if text:
        out.write(printable(text))
        out.flush()


def _editing() -> None:
    """Line editing and history at the prompt; Ctrl-] ends the line as a detach (GNU readline)."""
    try:
        import readline
    except ImportError:
        return
    if "libedit" not in (readline.__doc__ or ""):
        readline.parse_and_bind(r'"\C-]": "\C-e\C-u\C-v\035\C-m"')  # \C-v: not this binding again


def client_name() -> str:
    """Who holds a rank, for the message that refuses a second client."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()} (pid {os.getpid()})"
