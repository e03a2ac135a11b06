"""One rendezvous measurement process (scripts/bench/rdzv.py starts it; JSON lines on stdout).

    rdzv_worker.py PROTOCOL:DRIVER:N[:REPS][,...] REPS CAP [--no-dnsfix] [--swallow-dns]

PROTOCOL: ours  = agent.node.membership.Membership claim + join on agent.node.store.Store (add; set + add + wait + check, O(1))
          torch = DynamicRendezvousHandler.from_backend(C10dRendezvousBackend, min=max=N).next_rendezvous()
          storm = connect a TCPStore client, nothing else (the reverse-DNS check)
          null  = nothing: the driver's own cost of releasing N agents
DRIVER:   proc (os.fork() children of this process, which has imported torch) | thread
The store server runs in its own forked process. The clock starts when every agent is released at
once (one Event, or closing one pipe) and stops when the last agent finished; connect time is
included. An agent that is not done CAP seconds after the release counts as "did not finish".
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import torch
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousTimeout,
)

from agent.node.membership import Membership
from agent.node.store import Endpoint, Store
from agent.node.trust import JobKeys

_LONG = timedelta(seconds=600)
KEYS = JobKeys.derive(b"bench-secret", "bench", "0")  # derived once, as an agent does


class Counting:
    """Counts the store calls the agent's Store wrapper makes on its c10d client."""

    def __init__(self, inner: Any) -> None:
        self._inner, self.ops = inner, 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.ops += 1
            return attr(*args, **kwargs)

        return call


def counting_store(inner: TCPStore) -> Any:
    """A c10d Store subclass that counts calls (torch's handler needs a real Store)."""
    import torch.distributed as dist

    class CountingStore(dist.Store):
        def __init__(self) -> None:
            super().__init__()
            self.ops = 0

        def _count(self) -> None:
            self.ops += 1

        def set(self, key, value):
            self._count()
            return inner.set(key, value)

        def get(self, key):
            self._count()
            return inner.get(key)

        def add(self, key, value):
            self._count()
            return inner.add(key, value)

        def compare_set(self, key, expected, desired):
            self._count()
            return inner.compare_set(key, expected, desired)

        def check(self, keys):
            self._count()
            return inner.check(keys)

        def wait(self, keys, timeout=None):
            self._count()
            return inner.wait(keys) if timeout is None else inner.wait(keys, timeout)

        def delete_key(self, key):
            self._count()
            return inner.delete_key(key)

        def num_keys(self):
            return inner.num_keys()

        def multi_get(self, keys):
            self._count()
            return inner.multi_get(keys)

        def multi_set(self, keys, values):
            self._count()
            return inner.multi_set(keys, values)

        def set_timeout(self, timeout):
            return inner.set_timeout(timeout)

        @property
        def timeout(self):
            return inner.timeout

    return CountingStore()


# -- one agent ----------------------------------------------------------------------------
def agent_ours(port: int, n: int, index: int, run_id: str) -> dict[str, Any]:
    t = time.monotonic()
    client = Counting(TCPStore("127.0.0.1", port, is_master=False, timeout=_LONG))
    connected = time.monotonic() - t
    store = Store(client, Endpoint("127.0.0.1", port), f"la/{run_id}/0/")
    members = Membership(store, n, index, _Names(n), KEYS)
    members.claim(f"127.0.0.{index % 250 + 1}")
    members.join(600.0)
    return {"ops": client.ops, "connect": connected}


class _Names:
    """names[i] for error messages only; avoids building N strings per agent."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __getitem__(self, i: int) -> str:
        return f"agent {i}"

    def __len__(self) -> int:
        return self.n


def agent_torch(port: int, n: int, index: int, run_id: str) -> dict[str, Any]:
    t = time.monotonic()
    raw = TCPStore("127.0.0.1", port, is_master=False, timeout=_LONG)
    connected = time.monotonic() - t
    store = counting_store(raw)
    backend = C10dRendezvousBackend(store, run_id)
    handler = DynamicRendezvousHandler.from_backend(
        run_id,
        store,
        backend,
        min_nodes=n,
        max_nodes=n,
        local_addr="127.0.0.1",
        timeout=RendezvousTimeout(join=timedelta(seconds=600)),
    )
    handler.next_rendezvous()
    return {"ops": store.ops, "connect": connected}


def agent_storm(port: int, n: int, index: int, run_id: str) -> dict[str, Any]:
    t = time.monotonic()
    TCPStore("127.0.0.1", port, is_master=False, timeout=_LONG)
    connected = time.monotonic() - t
    return {"ops": 0, "connect": connected}


def agent_null(port: int, n: int, index: int, run_id: str) -> dict[str, Any]:
    """No store at all: what releasing N agents costs the driver by itself."""
    return {"ops": 0, "connect": 0.0}


AGENTS = {"ours": agent_ours, "torch": agent_torch, "storm": agent_storm, "null": agent_null}


# -- the store server ---------------------------------------------------------------------
def start_server() -> tuple[int, int, int]:
    """Fork a process hosting the TCPStore; returns (port, pid, fd to close to stop it)."""
    port_r, port_w = os.pipe()
    stop_r, stop_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(port_r)
        os.close(stop_w)
        server = TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False, timeout=_LONG)
        os.write(port_w, str(server.port).encode())
        os.read(stop_r, 1)
        os._exit(0)
    os.close(port_w)
    os.close(stop_r)
    port = int(os.read(port_r, 32))
    os.close(port_r)
    return port, pid, stop_w


def stop_server(pid: int, stop_w: int) -> None:
    os.close(stop_w)
    _reap([pid], 5.0)


def _reap(pids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    left = set(pids)
    while left and time.monotonic() < deadline:
        for pid in list(left):
            if os.waitpid(pid, os.WNOHANG)[0]:
                left.discard(pid)
        time.sleep(0.01)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


# -- drivers ------------------------------------------------------------------------------
def drive_threads(fn, port: int, n: int, run_id: str, cap: float) -> dict[str, Any]:
    go = threading.Event()
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def body(i: int) -> None:
        go.wait()
        try:
            out = fn(port, n, i, run_id)
        except Exception as exc:  # a failed agent is reported, not hidden
            out = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        out["end"] = time.monotonic()
        with lock:
            results.append(out)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    start = time.monotonic()
    go.set()
    for t in threads:
        t.join(max(0.0, start + cap - time.monotonic()))
    with lock:
        return _outcome(list(results), n, start)


def drive_procs(fn, port: int, n: int, run_id: str, cap: float) -> dict[str, Any]:
    go_r, go_w = os.pipe()
    ready_r, ready_w = os.pipe()
    res_r, res_w = os.pipe()
    pids = []
    for i in range(n):
        pid = os.fork()
        if pid == 0:
            _child(fn, port, n, i, run_id, go_r, go_w, ready_w, res_w)
        pids.append(pid)
    os.close(go_r)
    os.close(ready_w)
    os.close(res_w)
    _read_exactly(ready_r, n, time.monotonic() + 120.0)
    start = time.monotonic()
    os.close(go_w)  # every child's read() returns at once
    results = _collect(res_r, n, start + cap)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _reap(pids, 10.0)
    os.close(ready_r)
    os.close(res_r)
    return _outcome(results, n, start)


def _child(fn, port, n, i, run_id, go_r, go_w, ready_w, res_w) -> None:
    try:
        os.close(go_w)
        os.write(ready_w, b"r")
        os.read(go_r, 1)
        try:
            out = fn(port, n, i, run_id)
        except Exception as exc:
            out = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        out["end"] = time.monotonic()
        os.write(res_w, (json.dumps(out) + "\n").encode())  # < PIPE_BUF: one atomic write
    finally:
        os._exit(0)


def _read_exactly(fd: int, count: int, deadline: float) -> None:
    got = 0
    while got < count and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if ready:
            chunk = os.read(fd, count - got)
            if not chunk:
                return
            got += len(chunk)


def _collect(fd: int, n: int, deadline: float) -> list[dict[str, Any]]:
    buf, results = b"", []
    while len(results) < n and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        results += [json.loads(line) for line in lines if line]
    return results


def _outcome(results: list[dict[str, Any]], n: int, start: float) -> dict[str, Any]:
    good = [r for r in results if "error" not in r]
    errors = [r["error"] for r in results if "error" in r]
    finished = len(good) == n
    ops = [r["ops"] for r in good]
    connects = sorted(r["connect"] for r in good)
    return {
        "finished": finished,
        "done": len(good),
        "errors": errors[:3],
        "total_s": max(r["end"] for r in good) - start if finished else None,
        "ops_mean": sum(ops) / len(ops) if ops else None,
        "ops_max": max(ops) if ops else None,
        "connect_median_s": connects[len(connects) // 2] if connects else None,
    }


def swallow_dns() -> None:
    """Inside a private network namespace whose resolv.conf names 127.0.0.1: receive every DNS
    query and never answer, like a resolver that drops packets, without a packet leaving loopback."""
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 53))

    def loop() -> None:
        while True:
            sink.recvfrom(4096)

    threading.Thread(target=loop, daemon=True).start()


def main(argv: list[str]) -> int:
    specs, reps, cap = argv[0].split(","), int(argv[1]), float(argv[2])
    dnsfix = "--no-dnsfix" not in argv
    if "--swallow-dns" in argv:
        swallow_dns()
    if dnsfix:  # before any fork: the server and every agent inherit the flag
        from agent.node.dnsfix import disable_reverse_dns

        if not disable_reverse_dns(os.path.join(os.path.dirname(torch.__file__), "lib")):
            print(json.dumps({"warning": "agent.dnsfix could not set the flag"}), flush=True)
    for spec in specs:
        protocol, driver, n_text, *own_reps = spec.split(":")
        n = int(n_text)
        for rep in range(int(own_reps[0]) if own_reps else reps):
            port, server, stop = start_server()
            run_id = f"b{os.getpid()}x{rep}"
            drive = drive_procs if driver == "proc" else drive_threads
            out = drive(AGENTS[protocol], port, n, run_id, cap)
            out.update(
                {"protocol": protocol, "driver": driver, "n": n, "rep": rep, "dnsfix": dnsfix}
            )
            print(json.dumps(out), flush=True)
            if not out["finished"]:
                os._exit(0)  # stuck threads cannot be joined; the next spec gets a fresh process
            stop_server(server, stop)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
