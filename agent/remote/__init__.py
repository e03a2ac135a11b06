"""`python -m agent exec -- CMD`: CMD on every node; node 0 prints the outputs collated (pdsh + dshbak -c).

Every node's agent joins a store hosted by the node-0 agent (keys under the job's secret
namespace + `exec/`), seals its join, runs CMD with stdout and stderr captured together, and
publishes {host, code, output}, sealed; then it stays until node 0 has read every result,
writing its own again if an outsider deleted or garbled it. Node 0 reads only sealed records
and waits past a value that does not open within the phase's bound (--rdzv-timeout for the
joins, --timeout for the results): a forgery never counts as a join or a result.
Node 0 prints the groups of identical output under compressed hostlists and exits 0 when every
command succeeded, 1 when one failed, 3 when a node never reported, 4 when a result that does
not open was still there at the end, naming the nodes; the other
nodes print nothing but their own errors and exit with their command's status.

The store's port: --master-port, else the agent's port (MASTER_PORT, or derived from job and step
id) moved by half the derived range, so an exec never collides with an agent of the same step.

Here: the command line (cli), CMD on this node (local), every node through node 0's store
(fanout), identical outputs grouped (collate).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from agent.errors import AgentError
from agent.remote.cli import parse
from agent.remote.fanout import Interrupted, exec_port, run, verdict
from agent.remote.local import exit_status
from agent.text import printable

__all__ = ["exec_port", "exit_status", "main", "parse", "verdict"]  # for tests and callers


def main(argv: Sequence[str], env: Mapping[str, str]) -> int:
    try:
        return run(parse(argv), env)
    except AgentError as exc:
        print(f"agent: error: {printable(exc.message)}", file=sys.stderr)
        return int(exc.code)
    except Interrupted as exc:
        return 128 + exc.signum
