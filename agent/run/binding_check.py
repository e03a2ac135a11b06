"""Each bound rank's real CPU affinity and memory policy, read back from /proc once it runs."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from agent.run.workers import Worker

log = logging.getLogger("agent")


class BindingCheck:
    """What /proc showed for each rank (`seen`), and a warning for any rank bound elsewhere."""

    def __init__(self) -> None:
        self.seen: dict[int, str] = {}

    def pending(self, workers: Sequence[Worker]) -> bool:
        return any(
            w.spec.placement.cpus is not None
            and w.spec.rank not in self.seen
            and w.returncode is None
            for w in workers
        )

    def verify(self, workers: Sequence[Worker]) -> list[str]:
        """Check every rank that has exec'd its own program since the last call; warnings."""
        from agent.plan.rank_set import format_ranges
        from agent.warm.numa_apply import read_binding

        warnings = []
        for worker in workers:
            placement, rank = worker.spec.placement, worker.spec.rank
            if placement.cpus is None or rank in self.seen or worker.returncode is not None:
                continue
            if not _exec_done(worker.proc.pid):
                continue
            try:
                cpus, policy = read_binding(worker.proc.pid)
            except OSError:
                continue
            seen = f"cpus {format_ranges(cpus)}, memory {policy}"
            self.seen[rank] = seen
            if cpus != frozenset(placement.cpus):
                msg = f"rank {rank} runs on {seen} but was planned on cpus {format_ranges(placement.cpus)}"
                warnings.append(msg)
                log.warning(msg)
            else:
                log.info("rank %d bound: %s", rank, seen)
        return warnings


def _exec_done(pid: int) -> bool:
    """The exec wrapper has handed over to the rank's own program (it binds before exec); a
    warm rank shows the zygote's command line until it is bound and set its own."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            line = f.read()
        return b"child.py" not in line and b"zygote_main.py" not in line
    except OSError:
        return False
