"""One node's agent in action: store, rendezvous, attempts, teardown, verdict, summary."""

from __future__ import annotations

import json
import logging
import os
import queue
import sys
import threading
import time
from typing import Any

from agent import setup, signing
from agent.cli import Command
from agent.errors import AgentError, ExitCode
from agent.job import Job, rank_specs
from agent.options import Options, resolve
from agent.payload import Payload
from agent.plan import RankSpec, parse_rank_set
from agent.summary import RankExit, build_summary, node_failure, render_report
from agent.world import World, derive_port

log = logging.getLogger("agent")


class NodeAgent:
    """The act part: store, attempts, teardown, verdict. Node 0 also collects and summarises."""

    def __init__(
        self,
        command: Command,
        world: World,
        options: Options,
        given,
        environ,
        topology,
        secret: bytes,
    ) -> None:
        self.command, self.world, self.options, self.given = command, world, options, given
        self.environ, self.topology = environ, topology
        self.leader = world.agent_index == 0
        self.events: queue.Queue = queue.Queue()
        self.seal = lambda obj: signing.seal(obj, secret)
        self.unseal = lambda data, what: signing.unseal(data, secret, what)
        self.attempt = 0
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    # -- whole job ------------------------------------------------------------------------
    def run(self, job: Job | None) -> int:
        from agent import workers
        from agent.rendezvous import Rendezvous
        from agent.store import Endpoint, Store, namespace

        workers.install_signal_forwarding(self.events)
        w = self.world
        # One agent alone may take any free port; several must agree without talking: derive it.
        port = (
            self.options.master_port
            or w.master_port
            or (derive_port(w.job_id, w.step_id) if w.agents > 1 else 0)
        )
        ns = namespace(w.job_id, w.step_id)
        if self.leader:
            store = Store.host(Endpoint(w.master_addr, port), ns, f"{w.host} (node 0)", alone=w.agents == 1)
        else:
            who = "node 0's agent" + (f" ({w.hosts[0]})" if w.hosts else "")
            store = Store.connect(Endpoint(w.master_addr, port), ns, self.options.rdzv_timeout, who)
        self.rdzv = Rendezvous(
            store, w.agents, w.agent_index, self._names(), self.seal, self.unseal
        )
        try:
            job = self._join(job)
        except AgentError as exc:
            self._fail_setup(exc)
            raise
        except RuntimeError as exc:  # torch's DistNetworkError & co: node 0 went away
            raise AgentError(
                f"lost the job store while joining: {_first_line(exc)}", ExitCode.RENDEZVOUS
            ) from None
        self.threads.append(
            self.rdzv.heartbeat(
                self.stop,
                1.0,
                self.options.heartbeat_timeout,
                on_lost=lambda why: self.events.put(_store_lost(why)),
                on_peer_lost=self._peer_lost if self.leader else None,
            )
        )
        try:
            return self._attempts(job)
        finally:
            self.stop.set()
            for thread in self.threads:
                thread.join(2.0)

    def _names(self) -> list[str]:
        w = self.world
        if w.task is not None:
            return [f"task {i}" for i in range(w.agents)]
        return [
            f"node {i} ({w.hosts[i]})" if i < len(w.hosts) else f"node {i}" for i in range(w.agents)
        ]

    def _join(self, job: Job | None) -> Job:
        """Node 0 publishes, everyone fetches what node 0 decided, then one barrier."""
        if self.leader:
            assert job is not None
            setup.prepare_log_dir(job.log_dir)
            self.rdzv.publish_payload(
                {
                    "launcher": dict(job.launcher),
                    "payload": job.payload.to_json(),
                    "log_dir": job.log_dir,
                    "world_size": job.world_size,
                    "nproc_per_node": job.nproc_per_node,
                }
            )
            self.rdzv.publish_worker_port(0, self.rdzv.store.serve_workers())
        else:
            key = self.rdzv.store.key("payload")
            if not self.rdzv.store.wait([key], self.options.rdzv_timeout):
                raise AgentError(
                    f"rendezvous timed out after {self.options.rdzv_timeout:g}s: node 0 never published the job's configs",
                    ExitCode.RENDEZVOUS,
                )
            data = self.rdzv.fetch_payload()
            job = Job(
                data["launcher"],
                Payload.from_json(data["payload"]),
                data["log_dir"],
                int(data["world_size"]),
                int(data["nproc_per_node"]),
            )
            self.options = resolve(self.given, job.launcher, "node 0's configs")
            setup.prepare_log_dir(job.log_dir)
        self.job = job
        self._log_to_file(job.log_dir)
        self.config_file = setup.write_config(
            job.log_dir, self.world.agent_index, job.payload.config
        )
        self._specs_for(0)  # fail before the barrier if this node cannot run its ranks
        self.rdzv.arrive(0, self.options.rdzv_timeout, self.world.host)
        if self.leader:
            self._write_ranks(job)
        return job

    def _write_ranks(self, job: Job) -> None:
        """ranks.json: which host runs which rank, for `agent logs` and for people."""
        hosts = self.rdzv.hosts(0)
        if self.world.task is not None:
            ranks = [{"rank": i, "host": host} for i, host in enumerate(hosts)]
        else:
            n = job.nproc_per_node
            ranks = [
                {"rank": node * n + local, "host": host, "node": node, "local_rank": local}
                for node, host in enumerate(hosts)
                for local in range(n)
            ]
        path = os.path.join(job.log_dir, "ranks.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"ranks": ranks}, f, indent=1)
        os.replace(path + ".tmp", path)

    def _specs_for(self, attempt: int, port: int = 0) -> tuple[RankSpec, ...]:
        return rank_specs(
            self.command,
            self.world,
            self.options,
            self.job,
            self.environ,
            self.topology,
            attempt,
            port,
            self.config_file,
        )

    def _fail_setup(self, exc: AgentError) -> None:
        """Wake everyone waiting at the barrier with a failure instead of a 300 s timeout."""
        try:
            record = node_failure(
                "setup", self.world.node_rank, self.world.host, exc.message, time.time()
            )
            record["agent"] = self.world.agent_index
            if self.rdzv.report_failure(0, record):
                self.rdzv.store.set_json(self.rdzv.store.key("a0", "all-arrived"), 0)
            if self.leader:
                self.rdzv.linger(0)
        except Exception:
            pass

    def _log_to_file(self, log_dir: str) -> None:
        handler = logging.FileHandler(
            os.path.join(log_dir, f"agent-{self.world.agent_index:05d}.log")
        )
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)

    # -- attempts -------------------------------------------------------------------------
    def _attempts(self, job: Job) -> int:
        from agent.supervisor import Supervisor

        history: list[dict[str, Any]] = []
        while True:
            attempt = self.attempt
            early = self.rdzv.read_failure(attempt)  # someone failed while we were arriving
            port = self.rdzv.worker_port(attempt)
            specs = self._specs_for(attempt, port)
            log.info("attempt %d: starting ranks %s on %s", attempt, _ranks(specs), self.world.host)
            sup = Supervisor(
                specs,
                attempt,
                self.events,
                self._report,
                self.options.grace,
                self.options.hang_warning,
            )
            self.threads.append(
                self.rdzv.watch_failure(
                    attempt,
                    self.stop,
                    lambda r, a=attempt: self.events.put(_abort(a, r)),
                    lambda why: self.events.put(_store_lost(why)),
                )
            )
            if early is not None:
                self.events.put(_abort(attempt, early))
            outcome = sup.run(lambda specs=specs: self._start(specs))
            self.router.close()
            if self.live is not None:
                self.live.stop()
            result = {
                "exits": [e.to_json() for e in outcome.exits],
                "signal": outcome.signum,
                "store_lost": outcome.store_lost,
                "refused": outcome.refused,
                "warnings": outcome.warnings,
            }
            if outcome.store_lost:
                log.error("%s", outcome.store_lost)
                return self._signal_code(outcome) or int(ExitCode.RENDEZVOUS)
            try:
                self.rdzv.publish_result(attempt, result)
                if self.leader:
                    verdict = self._judge(attempt, history)
                    self.rdzv.publish_verdict(attempt, verdict)
                else:
                    verdict = self.rdzv.wait_verdict(attempt)
            except AgentError:
                raise
            except Exception as exc:
                log.error("lost the job store while finishing attempt %d: %s", attempt, exc)
                return self._signal_code(outcome) or int(ExitCode.RENDEZVOUS)
            if verdict.get("restart") and outcome.signum is None:
                self.attempt = attempt + 1
                self.rdzv.arrive(self.attempt, self.options.rdzv_timeout, self.world.host)
                continue
            if self.leader:
                self.rdzv.wait_acks(attempt, verdict.get("acks", 0), 10.0)
            self.rdzv.leaving()
            return self._signal_code(outcome) or int(verdict["code"])

    def _start(self, specs):
        from agent import workers
        from agent.logs import LogRouter

        colour = sys.stdout.isatty()
        self.live = None
        if colour and self.options.live:
            from rich.console import Console

            from agent.live import LiveView

            self.live = LiveView(Console(), self.options.hang_warning)
            self.router = LogRouter(self.live.stream(), self.live.stream())
        else:
            self.router = LogRouter(sys.stdout.buffer, sys.stderr.buffer)
        shown = parse_rank_set(self.options.console_ranks, "--console-ranks")
        started = workers.spawn(
            specs,
            self.environ,
            self.router,
            prefix_for=lambda s: _prefix(s, colour),
            console=lambda s: shown is None or s.rank in shown,
            events=self.events,
        )
        if self.live is not None:
            self.live.start(started)
        return started

    def _report(self, record: dict[str, Any]) -> None:
        try:
            if self.rdzv.report_failure(self.attempt, record):
                log.error("first failure of the job: %s", record.get("how"))
        except Exception as exc:
            log.error("could not publish the failure (store lost?): %s", exc)

    def _peer_lost(self, index: int) -> None:
        """Heartbeat thread, node 0: a node went silent; fail the attempt in its name."""
        name = self._names()[index]
        log.error("%s stopped sending heartbeats: declaring it lost", name)
        host = self.world.hosts[index] if index < len(self.world.hosts) else name
        record = node_failure(
            "lost", index, host, f"{name} lost: its agent stopped answering", time.time()
        )
        try:
            self.rdzv.report_failure(self.attempt, record)
            self.rdzv.mark_lost(
                self.attempt, index, {"lost": True, "node": index, "host": host, "exits": []}
            )
        except Exception as exc:
            log.error("could not record the lost node: %s", exc)

    def _judge(self, attempt: int, history: list[dict[str, Any]]) -> dict[str, Any]:
        results = self.rdzv.collect_results(attempt)
        cause = self.rdzv.read_failure(attempt)
        ranks = [e for r in results for e in r.get("exits", [])]
        lost = [r for r in results if r.get("lost")]
        for r in lost:
            ranks += [
                RankExit(
                    -1, -1, r["node"], r["host"], None, None, "lost", 0.0, None, attempt
                ).to_json()
            ]
        history.append(
            {
                "attempt": attempt,
                "root_cause": cause,
                "ranks": sorted(ranks, key=lambda e: e["rank"]),
                "lost_nodes": [r["node"] for r in lost],
            }
        )
        code = _code(cause, ranks, lost, results)
        restart = (
            code != 0
            and attempt < self.options.max_restarts
            and not any(r.get("signal") for r in results)
        )
        if restart:
            self.rdzv.publish_worker_port(attempt + 1, self.rdzv.store.serve_workers())
            log.warning(
                "attempt %d failed (%s); restarting the whole world (%d of %d)",
                attempt,
                (cause or {}).get("how"),
                attempt + 1,
                self.options.max_restarts,
            )
        else:
            self._write_summary(history, code)
        return {"restart": restart, "code": code, "acks": self.world.agents - 1 - len(lost)}

    def _write_summary(self, history: list[dict[str, Any]], code: int) -> None:
        w = self.world
        job = {
            "id": w.job_id,
            "step": w.step_id,
            "source": w.source,
            "nnodes": w.nnodes,
            "world_size": self.job.world_size,
            "nproc_per_node": self.job.nproc_per_node,
            "hosts": list(w.hosts),
            "log_dir": os.path.abspath(self.job.log_dir),
        }
        summary = build_summary(job, history, code)
        path = os.path.join(self.job.log_dir, "summary.json")
        with open(path + ".tmp", "w") as f:
            json.dump(summary, f, indent=1)
        os.replace(path + ".tmp", path)
        report = render_report(summary)
        (log.info if code == 0 else log.error)("%s\nsummary: %s", report, path)

    def _signal_code(self, outcome) -> int | None:
        return 128 + outcome.signum if outcome.signum else None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _code(cause, ranks, lost, results) -> int:
    if any(r.get("refused") for r in results):
        return int(ExitCode.REFUSED)
    if lost or (cause and cause.get("kind") == "lost"):
        return int(ExitCode.RENDEZVOUS)
    if any(e["state"] == "failed" for e in ranks) or (cause is not None):
        return int(ExitCode.RANK_FAILED)
    return int(ExitCode.OK)


def _ranks(specs) -> str:
    ranks = [s.rank for s in specs]
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0]) if ranks else "none"


def _prefix(spec: RankSpec, colour: bool) -> bytes:
    from agent.logs import PALETTE

    text = f"{spec.host}:{spec.rank}: "
    if colour:
        return f"\x1b[{PALETTE[spec.rank % len(PALETTE)]}m{text}\x1b[0m".encode()
    return text.encode()


def _abort(attempt: int, record: dict[str, Any]):
    from agent.supervisor import AbortSeen

    return AbortSeen(attempt, record)


def _store_lost(why: str):
    from agent.supervisor import StoreLost

    return StoreLost(why)
