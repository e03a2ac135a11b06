"""The warm interpreter a node forks its ranks from: kept between runs by a resident agent,
started during attempt 0 by a one-shot agent that may restart (agent.warm does the forking)."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from collections.abc import Callable, Mapping
from typing import Any

from agent.plan.options import preload_list
from agent.run.summary import describe

log = logging.getLogger("agent")


def preload_modules(text: str) -> tuple[str, ...]:
    """--preload → the modules to import: 'auto' is torch when it can be imported."""
    names = preload_list(text)
    if names == ("none",):
        return ()
    if names == ("auto",):
        return ("torch",) if importlib.util.find_spec("torch") is not None else ()
    return names


class WarmSource:
    def __init__(
        self, preload: tuple[str, ...], resident: bool, start: Callable[..., Any] | None = None
    ) -> None:
        self.preload = preload
        self.resident = resident  # kept for every run; else prepared only for restarts
        self._start = start  # Zygote.start; tests pass a fake
        self.zygote: Any = None
        self.ahead = 0  # resident: this node's ranks in its last run, forked ahead for the next

    @property
    def enabled(self) -> bool:
        return bool(self.preload)

    def ensure(self, env: Mapping[str, str]) -> None:
        """A zygote for ranks with this environment is on its way (started now if needed)."""
        if not self.enabled:
            return
        z = self.zygote
        if z is not None and z.fits(env) and (z.ready or _preparing(z)):
            return
        self.close()
        start = self._start
        if start is None:
            from agent.warm.zygote import Zygote

            start = Zygote.start
        try:
            self.zygote = start(self.preload, dict(env))
        except OSError as exc:
            log.warning("cannot start the warm interpreter (%s): ranks start fresh", exc)

    def usable(self, env: Mapping[str, str], wait: float = 0.0) -> Any:
        """The zygote when it was prepared for this environment and is ready (waiting up to
        `wait` seconds for one still importing: its import is what fresh ranks would each do).
        One that died since (killed, say: the ranks it forked run on, adopted by the agent) is
        replaced by a fresh one first."""
        z = self.zygote
        if z is None or not z.fits(env):
            return None
        if "exit_status" in z.info:
            log.warning(
                "the warm interpreter (pid %d) is gone (%s): preparing a new one",
                z.pid,
                describe(z.info["exit_status"]),
            )
            self.ensure(env)
            z = self.zygote
            if z is None:
                return None
        if not z.ready and wait > 0 and _preparing(z):
            log.info(
                "waiting for the warm interpreter to finish importing %s", ",".join(self.preload)
            )
            z.wait_ready(wait)
        return z if z.ready else None

    def status(self) -> dict[str, Any]:
        z = self.zygote
        ready = z is not None and z.ready
        return {"warm": ready, "preload": list(self.preload), **({"pid": z.pid} if ready else {})}

    def stand_by(self) -> None:
        """Resident, between runs: the next run's ranks forked ahead of it (as many as this
        node started last), so that its start needs no fork (Zygote.stand_by)."""
        z = self.zygote
        if not (self.resident and self.ahead and z is not None and z.ready):
            return
        try:
            z.stand_by(self.ahead)
        except OSError as exc:  # out of descriptors or processes: the next run forks them
            log.warning("cannot fork ranks ahead of the next run (%s)", exc)

    def pids(self) -> tuple[int, ...]:
        """The zygote and the ranks forked ahead: the agent's own, never a job's leftovers."""
        z = self.zygote
        return () if z is None else (z.pid, *z.standby_pids())

    def close(self) -> None:
        z, self.zygote = self.zygote, None
        if z is not None:
            with contextlib.suppress(Exception):
                z.close()


def _preparing(zygote: Any) -> bool:
    """Still importing: it has neither answered (with what it loaded) nor gone away. One that
    answered but is not ready (its imports initialised CUDA) is never waited for."""
    info = zygote.info
    return "loaded" not in info and "exit_status" not in info
