"""`python -m agent`: parse → plan → act. AgentError is caught here, once, as one line."""

from __future__ import annotations

import os
import sys

from agent.errors import AgentError, ExitCode

# Commands other than the launch itself; `python -m agent --help` names each one.
SUBCOMMANDS = (
    "logs",
    "exec",
    "doctor",
    "serve",
    "run",
    "status",
    "down",
    "stacks",
    "top",
    "debug",
    "history",
)


# The resident agents' clients: they print what they have to say and never log, so they start
# without the logging machinery (a client's start is part of every `agent run`).
CLIENTS = ("run", "status", "down", "stacks", "top")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not (argv and argv[0] in CLIENTS):
        _log_to_stderr()
    from agent.text import printable

    if not argv:  # the usage, as argparse would answer (exit 2), naming no internals of ours
        from agent.launch.cli import usage_text

        print(usage_text(SUBCOMMANDS), end="", file=sys.stderr)
        return int(ExitCode.USAGE)
    try:
        if argv and argv[0] in SUBCOMMANDS:
            return _subcommand(argv[0], argv[1:])
        from agent.launch.cli import parse

        command = parse(argv)
        from agent.launch.oneshot import (
            launch,  # after parsing: `--help` never imports the heavy parts
        )

        return launch(command, os.environ)
    except AgentError as exc:
        print(f"agent: error: {printable(exc.message)}", file=sys.stderr)
        return int(exc.code)
    except KeyboardInterrupt:
        return 128 + 2


def _log_to_stderr() -> None:
    import logging

    from agent.log_format import PrintableFormatter

    logging.raiseExceptions = False  # a full log disk must not print tracebacks from logging
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(PrintableFormatter("[agent %(process)d] %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


def _subcommand(name: str, argv: list[str]) -> int:
    if name == "serve":
        from agent.serve.cli import parse_serve

        command = parse_serve(argv)
        from agent.serve.resident import serve  # after parsing: `--help` stays light

        return serve(command, os.environ)
    if name in CLIENTS:
        from agent.serve.commands import main as client_main

        return client_main(name, argv, os.environ)
    if name == "doctor":
        from agent import doctor

        return doctor.main(argv, os.environ)
    if name == "debug":
        from agent import debug

        return debug.main(argv, os.environ)
    if name == "history":
        from agent import history

        return history.main(argv, os.environ)
    if name == "logs":
        from agent import logs as tail

        return tail.main(argv)
    from agent import remote

    return remote.main(argv, os.environ)


if __name__ == "__main__":
    code = main()
    fallback = sys.modules.get("agent.hang.fallback")  # never imported only for this
    if fallback is not None:
        fallback.remove_fresh_dirs()  # os._exit below runs no atexit hook
    logging = sys.modules.get("logging")  # a client never imports it
    if logging is not None:
        logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: c10d's store threads must not be destroyed under our feet, and
    # everything worth keeping (rank files, summary.json, the console) is already flushed.
    os._exit(code if 0 <= code < 256 else int(ExitCode.RANK_FAILED))
