"""Exec wrapper run as each rank: die with the agent, bind to CPUs/memory, then exec the command.

Usage: python -S -E agent/child.py PARENT_PID CPUS MEM_NODES POLICY PATHS -- CMD...
(CPUS and MEM_NODES are comma lists or "-", POLICY is "preferred" or "strict", PATHS the
os.pathsep-joined directories holding the agent and py-libnuma packages). A wrapper rather
than preexec_fn, because the agent has threads and fork+preexec_fn is unsafe with threads.
Imports stay minimal and site is skipped (-S halves the wrapper's start, ~26 ms instead of
~57 ms here); the agent hands over where its own package and py-libnuma live instead.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
_PR_SET_PTRACER = 0x59616D61  # "Yama"


def _die_with_parent(parent: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # The agent may have died between fork and prctl: then nobody would ever signal us.
    if os.getppid() != parent:
        os._exit(1)
    # Yama ptrace_scope=1 lets only ancestors trace: the agent's py-spy (its child, not ours)
    # dumps hung ranks. Without Yama this fails with EINVAL, which changes nothing.
    libc.prctl(_PR_SET_PTRACER, parent, 0, 0, 0)


def _ints(text: str) -> list[int]:
    return [] if text == "-" else [int(x) for x in text.split(",")]


def main(argv: list[str]) -> int:
    parent, cpus, mems, policy, paths, sep, *command = argv
    if sep != "--" or not command:
        print("agent.child: usage: PARENT CPUS MEMS POLICY PATHS -- CMD...", file=sys.stderr)
        return 2
    _die_with_parent(int(parent))
    if cpus != "-" or mems != "-":
        sys.path[:0] = paths.split(os.pathsep)
        from agent.errors import AgentError
        from agent.warm.numa_apply import apply_binding

        try:
            for warning in apply_binding(_ints(cpus), _ints(mems), policy == "strict"):
                print(f"[agent] {warning}", file=sys.stderr)
        except AgentError as exc:
            print(f"[agent] cannot bind rank: {exc}", file=sys.stderr)
            return 2
    # The flight-recorder probe (agent/hang/probe) starts in this pid only, not in its children.
    os.environ["AGENT_PROBE_PID"] = str(os.getpid())
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"[agent] cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
