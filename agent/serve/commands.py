"""`python -m agent run|status|down`: the clients of the resident agents (torch-free)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from agent.plan.client_env import client_env
from agent.serve import client
from agent.serve.cli import parse_client
from agent.text import printable


def main(action: str, argv: Sequence[str], environ: Mapping[str, str]) -> int:
    command = parse_client(action, argv)  # --help and usage errors before any connection
    home = Path.home()
    target = client.locate(environ, home, command.serve_file)
    channel = client.open_channel(target, environ, home)
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
        return client.run(channel, request, sys.stdout.buffer, sys.stderr.buffer)
    finally:
        channel.close()
