"""The one user-facing error type and the agent's documented exit codes."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """What `python -m agent` returns; README "Exit codes" documents the same table."""

    OK = 0
    RANK_FAILED = 1  # a rank on some node exited non-zero or died by a signal
    USAGE = 2  # bad option, config, scheduler env, script, log dir: nothing was started
    RENDEZVOUS = 3  # a node never arrived, or the store / a peer agent was lost
    REFUSED = 4  # the agents hold different secrets, or store data that does not open with the key
    NO_PROGRESS = 5  # a restart called off: the same failure twice, or no progress twice
    # 128 + N: an agent received signal N (SIGINT 130, SIGTERM 143); the job stopped with it


class AgentError(Exception):
    """A failure the user can fix: rendered as one line, never as a traceback."""

    # The agent found the job store tampered with (agent.node.sealed.Tampered): the failure
    # record it tells the others says so (agent.node.failure.Failure.tampering).
    tampering = False

    # code: an ExitCode, or 128 + N for a signal a client was told of
    def __init__(self, message: str, code: int = ExitCode.USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    def __str__(self) -> str:
        return self.message


class PeerFailed(AgentError):
    """Another node's failure ended this agent: reported there already, not to be told again."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message, ExitCode.REFUSED if refused else ExitCode.RENDEZVOUS)
