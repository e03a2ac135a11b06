"""An outsider who reaches the job store's port (torch's own client: it lists every key, writes
any) changes no outcome: a value that does not open never decides and never ends a wait."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import time
from datetime import timedelta

import pytest
from cluster import FIXTURE, wait_for
from serving import Serving

from agent.world import derive_port

pytestmark = pytest.mark.e2e

NAMESPACE = re.compile(r"^(la/[0-9a-f]{32}/)")


def outsider(cluster):
    """torch's TCPStore client, as anyone on the network can open one."""
    from torch.distributed import TCPStore

    port = derive_port(cluster.job, cluster.step)
    return TCPStore(
        "127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=30)
    )


def job_namespace(store) -> str:
    """The secret-derived namespace, read off the key list as an outsider sees it."""

    def found():
        for key in store.list_keys():
            match = NAMESPACE.match(key)
            if match and key.endswith("/hb/0"):
                return match.group(1)
        return None

    return wait_for(found, 60, "the job's keys in list_keys()")


def test_a_forged_abort_record_leaves_fail_fast_on(cluster_factory, tmp_path):
    go = tmp_path / "go"
    args = [
        "--nproc-per-node",
        "1",
        "--heartbeat-timeout",
        "30",
        FIXTURE,
        "--on",
        "1",
        "--exit",
        "3",
        "--stderr",
        "the-root-cause-line",
        "--others-wait",
        "--ready-to",
        str(tmp_path),
        "--fail-file",
        str(go),
    ]
    cluster = cluster_factory(2).start(args)
    wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == 2, 60, "both ranks to start")
    store = outsider(cluster)
    ns = job_namespace(store)
    store.set(ns + "r0/a0/abort", b"garbage")
    for agent in cluster.agents:  # each watcher has read the forgery (and waits past it)
        wait_for(lambda a=agent: "refusing abort record" in a.stderr(), 30, "the forgery read")
    go.touch()
    start = time.monotonic()
    codes = cluster.wait(60)
    assert time.monotonic() - start <= 10, cluster.dump()
    assert codes == [1, 1], cluster.dump()
    cause = cluster.summary()["root_cause"]
    assert cause["rank"] == 1 and "the-root-cause-line" in str(cause.get("stderr_tail")), cause


def test_a_forged_verdict_leaves_a_restartable_job_restarting(cluster_factory, tmp_path):
    go = tmp_path / "go"
    args = [
        "--nproc-per-node",
        "1",
        "--max-restarts",
        "1",
        "--grace",
        "3",
        FIXTURE,
        "--on",
        "1",
        "--exit",
        "3",
        "--fail-attempts",
        "1",
        "--linger-attempts",
        "1",
        "--ignore-term",  # node 0's rank takes the 3 s grace: node 1 reads the verdict key first
        "--ready-to",
        str(tmp_path),
        "--fail-file",
        str(go),
    ]
    cluster = cluster_factory(2).start(args)
    wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == 2, 60, "both ranks to start")
    store = outsider(cluster)
    ns = job_namespace(store)
    store.set(ns + "r0/a0/verdict", b"garbage")
    go.touch()
    assert cluster.wait(90) == [0, 0], cluster.dump()
    summary = cluster.summary()
    assert summary["status"] == "succeeded" and len(summary["attempts"]) == 2, summary
    assert "refusing verdict" in cluster.agents[1].stderr(), cluster.dump()


@pytest.mark.solo  # a --heartbeat-timeout clock, and a loop that keeps a core busy against it
def test_a_hung_node_is_lost_in_time_while_an_outsider_keeps_its_beat_moving(
    cluster_factory, tmp_path
):
    """The heartbeat's path: a stopped agent keeps its lifeline open (a killed one is lost at
    once by it: tests/test_e2e_lifeline.py), so only sealed beats can tell. The tampering earns
    node 1 one more --heartbeat-timeout (a delay), never a life: lost after ~2 timeouts."""
    timeout = 3.0
    args = ["--nproc-per-node", "1", "--heartbeat-timeout", str(timeout)]
    cluster = cluster_factory(2).start(
        [*args, FIXTURE, "--others-wait", "--ready-to", str(tmp_path)]
    )
    wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == 2, 60, "both ranks to start")
    store = outsider(cluster)
    key = job_namespace(store) + "hb/1"
    recorded = bytes(store.get(key))  # a genuine beat of node 1, for replay
    os.kill(cluster.agents[1].proc.pid, signal.SIGSTOP)
    killed = time.monotonic()
    rounds = 0
    while "node 1 (127.0.0.2) lost" not in cluster.agents[0].stderr():
        store.set(key, b"7")  # a counter, bumped
        store.add(key, 1)
        store.set(key, b"garbage")
        store.set(key, recorded)  # an old genuine beat, written back
        rounds += 1
        took = time.monotonic() - killed
        # Kept alive by the outsider, node 1 would never be lost. Expected: two timeouts and a
        # tick, ~7 s; 5.9 s and 17.8 s seen in CI with this loop hammering node 0's store on the
        # same 2 cores as the other test worker (now kept off by `solo`). 60 s only catches a life.
        assert took < 20 * timeout, f"not lost after {took:.1f}s\n{cluster.dump()}"
    assert rounds > 1
    os.kill(cluster.agents[1].proc.pid, signal.SIGKILL)  # the hung agent is out: end it
    assert cluster.wait(60)[0] != 0
    assert "lost" in cluster.summary()["root_cause"]["how"]


def test_300_idle_connections_leave_agent_status_answering(tmp_path):
    serving = Serving(tmp_path, 2, ("--preload", "none")).start()
    try:
        serving.ready()
        record = json.loads(serving.connection_file.read_text())
        flood = [
            socket.create_connection((record["host"], record["port"]), timeout=10)
            for _ in range(300)
        ]
        start = time.monotonic()
        status = serving.status()
        took = time.monotonic() - start
        for sock in flood:
            sock.close()
        assert status.returncode == 0, status.stderr
        assert took <= 5, f"{took:.1f}s: {status.stderr}"
        assert serving.call("down", timeout=60).returncode == 0
    finally:
        serving.kill()


def test_a_verdict_overwritten_again_and_again_still_reaches_node_1(cluster_factory, tmp_path):
    """Node 0 writes the verdict once; an outsider writes garbage over it again and again. Node
    1, past the garbage, reads the copy node 0 wrote with it under a name derived from the
    secret (before: it never caught the verdict sealed and ended as tampering, exit 4): the job
    ends 0 on both nodes, the garbage named once. Node 1's rank ends first, so node 1 meets the
    garbage before node 0 can have written anything there (a race the test once lost)."""
    done, last = tmp_path / "done", tmp_path / "last"
    args = ["--nproc-per-node", "1", FIXTURE, "--until-file", str(done)]
    args += ["--rank0-until-file", str(last), "--ready-to", str(tmp_path)]
    cluster = cluster_factory(2).start(args)
    wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == 2, 60, "both ranks to start")
    store = outsider(cluster)
    key = job_namespace(store) + "r0/a0/verdict"
    store.set(key, b"garbage")  # in place before node 1 can look
    stop = threading.Event()

    def overwrite() -> None:
        while not stop.is_set():
            try:
                store.set(key, b"garbage")
            except RuntimeError:  # the job ended: node 0's store is gone
                return

    writer = threading.Thread(target=overwrite, daemon=True)
    writer.start()
    try:
        done.touch()  # node 1's rank ends; node 0's runs on, so no verdict exists yet
        refused = f"refusing verdict at {key}"
        wait_for(lambda: refused in cluster.agents[1].stderr(), 60, "node 1 to meet the garbage")
        last.touch()
        start = time.monotonic()
        codes = cluster.wait(60)
        took = time.monotonic() - start
    finally:
        stop.set()
        writer.join(10)
    assert codes == [0, 0], cluster.dump()
    err = cluster.agents[1].stderr()
    assert "store tampering suspected" not in err, cluster.dump()
    assert err.count(refused) == 1, cluster.dump()
    print(f"done -> every agent out: {took:.2f}s")
    assert took <= 30, f"{took:.1f}s\n{cluster.dump()}"
