"""The store is a trust boundary: what an outsider can read or write there steers nothing; agents
with different secrets stop at once; the secret never reaches ranks, logs or the summary."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from cluster import FIXTURE, base_env, wait_for

from agent.node.store_client import StoreClient
from agent.node.trust import JobKeys
from agent.world import derive_port

pytestmark = pytest.mark.e2e

# What an outsider can name: our source's key layout under the job id and step they can see.
SUFFIXES = [
    *(
        f"m/{k}"
        for k in ("claim/0", "claim/1", "in/0", "in/1", "arrived", "done", "abort", "fail-seq")
    ),
    *(f"hb/{i}" for i in (0, 1)),
    *(f"m/gone/{i}" for i in (0, 1)),
    *(f"r0/{k}" for k in ("plan", "abort", "done", "arrived", "fail-seq", "fail/0", "fail/1")),
    *(
        f"r0/a0/{k}"
        for k in (
            "abort",
            "fail-seq",
            "fail/0",
            "fail/1",
            "port",
            "verdict",
            "result/0",
            "result/1",
        )
    ),
    "payload",
    "a0/abort",
    "a0/abort-count",
    "a0/verdict",
    "a0/worker-port",
]


def _client(cluster) -> StoreClient:
    port = derive_port(cluster.job, cluster.step)
    return wait_for(lambda: _try(port), 60, "node 0's store")


def _try(port: int):
    try:
        return StoreClient.connect("127.0.0.1", port, 1.0)
    except Exception:
        return None


def _insider_keys(cluster) -> JobKeys:
    secret = base_env(cluster.tmp)["AGENT_SECRET"].encode()
    return JobKeys.derive(secret, cluster.job, cluster.step)


def test_an_outsider_cannot_read_or_steer_a_running_job(cluster_factory, tmp_path):
    go = tmp_path / "go"
    args = [FIXTURE, "--ready-to", str(tmp_path), "--until-file", str(go)]
    cluster = cluster_factory(2).start(["--nproc-per-node", "1", "--heartbeat-timeout", "3", *args])
    wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == 2, 60, "both ranks to start")
    outsider = _client(cluster)
    with pytest.raises(ConnectionRefusedError):  # bound to node 0's address, not every interface
        socket.create_connection(("127.0.0.2", derive_port(cluster.job, cluster.step)), timeout=5)
    names = [f"la/{cluster.job}/{cluster.step}/{s}" for s in SUFFIXES]
    assert not any(outsider.check([name]) for name in names), "a derivable key holds our data"
    forged = json.dumps({"kind": "rank", "rank": 0, "how": "forged", "code": 0, "restart": True})
    counters = ("arrived", "fail-seq", "abort-count", "claim/0", "claim/1", "hb/0", "hb/1")
    for name in names:  # counters are bumped, everything else overwritten with a forged record
        if name.endswith(counters):
            outsider.add(name, 1)
        else:
            outsider.set(name, forged)
    outsider.set(
        f"la/{cluster.job}/{cluster.step}/mismatch", json.dumps({"index": 1, "check": "x"})
    )
    go.touch()
    assert cluster.wait(60) == [0, 0], cluster.dump()
    summary = cluster.summary()
    assert summary["status"] == "succeeded" and summary["root_cause"] is None
    assert len(summary["attempts"]) == 1


@pytest.mark.parametrize("forgery", ["unsealed", "another secret", "one byte changed", "moved"])
def test_a_forged_plan_is_refused_and_the_genuine_one_runs(cluster_factory, tmp_path, forgery):
    """Even written where the plan lives, a forgery is refused: node 1 waits past it, node 0's
    barrier finds its plan altered and writes it again (with a secret-named copy node 1 blocks
    on), and the job runs the genuine plan. Before, the forgery decided the outcome: node 1
    waited out the rendezvous timeout and the job ended as suspected tampering (exit 4)."""
    ready = tmp_path / "ready"
    ready.mkdir()
    args = [FIXTURE, "--ready-to", str(ready)]
    cluster = cluster_factory(2).start(["--nproc-per-node", "1", *args], nodes=[0])
    store, keys = _client(cluster), _insider_keys(cluster)
    key = keys.namespace + "r0/plan"
    wait_for(lambda: store.check([key]), 60, "node 0 to publish the plan")
    genuine = store.get(key)
    if forgery == "unsealed":
        forged = json.dumps({"plan": {"script": "evil.py"}}).encode()
    elif forgery == "another secret":
        forged = JobKeys.derive(b"not the job's", cluster.job, cluster.step).seal({"plan": {}}, key)
    elif forgery == "one byte changed":
        forged = genuine[:-1] + bytes([genuine[-1] ^ 1])
    else:
        forged = keys.seal({"plan": {}}, keys.namespace + "r1/plan")  # genuine, but for run 1
    store.set(key, forged)
    cluster.start(["--nproc-per-node", "1", "--rdzv-timeout", "30", *args], nodes=[1])
    codes = cluster.wait(90)
    assert codes == [0, 0], cluster.dump()
    assert "the plan record written here is gone or altered" in cluster.agents[0].stderr()
    assert len(list(ready.iterdir())) == 2  # both ranks ran the genuine plan's script
    assert "store tampering suspected" not in cluster.agents[1].stderr()


def test_agents_with_different_secrets_both_exit_4_naming_the_mismatch(cluster_factory):
    cluster = cluster_factory(2)
    cluster.start([FIXTURE], nodes=[0]).start([FIXTURE], nodes=[1], env={"AGENT_SECRET": "other"})
    start = time.monotonic()
    codes = cluster.wait(30)
    assert time.monotonic() - start < 10, cluster.dump()
    assert codes == [4, 4], cluster.dump()
    for agent in cluster.agents:
        assert "secret mismatch" in agent.stderr(), agent.stderr()
    assert "node 1 (127.0.0.2)" in cluster.agents[0].stderr()
    summary = cluster.summary()  # node 0 still says why, though no attempt ran
    assert summary["exit_code"] == 4 and "secret mismatch" in summary["root_cause"]["how"]


def test_the_secret_reaches_no_rank_log_summary_or_dry_run(cluster_factory, tmp_path):
    config = tmp_path / "secrets.yml"
    config.write_text("wandb_api_key: sk-live-0123456789\n")
    envs = tmp_path / "envs"
    envs.mkdir()
    cluster = cluster_factory(2).start(
        ["--nproc-per-node", "1", FIXTURE, "--env-out", str(envs), str(config)]
    )
    assert cluster.wait(60) == [0, 0], cluster.dump()
    secret = base_env(tmp_path)["AGENT_SECRET"]
    for rank in (0, 1):
        env = json.loads((envs / f"env-{rank}.json").read_text())["env"]
        assert "AGENT_SECRET" not in env and secret not in json.dumps(env)
    files = [
        *cluster.log_dir.iterdir(),
        *(a.out for a in cluster.agents),
        *(a.err for a in cluster.agents),
    ]
    assert len(files) > 6
    for path in files:
        assert secret not in path.read_text(errors="replace"), path
    env = base_env(tmp_path)
    dry = subprocess.run(
        [sys.executable, "-m", "agent", "--dry-run", "--nproc-per-node", "2", FIXTURE, str(config)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dry.returncode == 0, dry.stderr
    assert "RANK=1" in dry.stdout and secret not in dry.stdout + dry.stderr


def test_the_plan_in_the_store_holds_no_config_value_in_readable_form(cluster_factory, tmp_path):
    config = tmp_path / "secrets.yml"
    config.write_text("wandb_api_key: sk-live-0123456789\n")
    cluster = cluster_factory(2).start(["--nproc-per-node", "1", FIXTURE, str(config)], nodes=[0])
    store, keys = _client(cluster), _insider_keys(cluster)
    key = keys.namespace + "r0/plan"
    wait_for(lambda: store.check([key]), 60, "node 0 to publish the plan")
    raw = store.get(key)
    assert b"sk-live" not in raw and b"wandb" not in raw and b"secrets.yml" not in raw
    assert (
        keys.unseal(raw, key, "plan")["plan"]["payload"]["config"]["wandb_api_key"]
        == "sk-live-0123456789"
    )
    os.killpg(cluster.agents[0].proc.pid, 9)
