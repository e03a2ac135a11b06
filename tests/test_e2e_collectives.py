"""Which collective, and who never came (2 loopback nodes x 2 ranks, gloo): every rank's flight
recorder, asked through the probe the agent places in it, collated above the stacks in `agent
stacks`, stacks-a<N>.txt and the hang's root cause."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cluster import REPO, base_env, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.solo]  # hang and pace clocks from the ranks' start

JOB = str(REPO / "tests" / "fixtures" / "deadlock_job.py")
LOAD_AT = next(  # where load_batch waits
    n for n, line in enumerate(Path(JOB).read_text().splitlines(), 1) if "sleep(0.05)" in line
)
BEHIND = (
    "ranks 0-2 entered all_reduce #4 on default_pg ([4] Float); rank 3 last entered #3 and "
    "waits in all_reduce #1 on group 1 (ranks 2,3)"
)


def _ready(cluster, ranks) -> bool:
    files = [cluster.rank_file(r) for r in ranks]
    return all(f.exists() and "ready" in f.read_text() for f in files)


def _stacks(cluster) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agent", "stacks", str(cluster.log_dir)],
        env=base_env(cluster.tmp), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize("cold", [False, True], ids=["warm-capable", "cold"])
def test_a_deadlock_by_order_is_named_by_the_recorders(cluster_factory, cold):
    # one hang: a hang is an infrastructure failure (agent.run.failure_class)
    args = ["--nproc-per-node", "2", "--hang-timeout", "8", "--max-infra-restarts", "0"]
    args += [*(["--cold"] if cold else []), JOB]
    cluster = cluster_factory(2).start(args)
    wait_for(lambda: _ready(cluster, range(4)), 120, "every rank in its last collective", 0.2)
    stacks = _stacks(cluster)
    assert stacks.returncode == 0, stacks.stderr + cluster.dump()
    head = stacks.stdout.split("\n\n", 1)[0]
    assert head.startswith("collectives (torch's flight recorder in every rank):"), stacks.stdout
    wait_for(lambda: BEHIND in _stacks(cluster).stdout, 30, "rank 3 in its pair's collective")
    (cluster.log_dir / "quiet").touch()
    assert cluster.wait(90) == [1, 1], cluster.dump()
    how = cluster.summary()["root_cause"]["how"]
    assert how.startswith("hang: no progress for 8 s from the 4 ranks still running; " + BEHIND)
    assert BEHIND in (cluster.log_dir / "stacks-a0.txt").read_text()


def test_an_uneven_loop_names_the_rank_behind_and_where_it_is(cluster_factory):
    args = ["--nproc-per-node", "2", "--hang-timeout", "5", "--max-infra-restarts", "0"]
    cluster = cluster_factory(2).start([*args, JOB, "--uneven"])
    wait_for(lambda: _ready(cluster, range(4)), 120, "ranks 0-2 in their last collective", 0.2)
    (cluster.log_dir / "quiet").touch()
    assert cluster.wait(90) == [1, 1], cluster.dump()
    how = cluster.summary()["root_cause"]["how"]
    assert (
        "ranks 0-2 entered all_reduce #4 on default_pg ([4] Float); rank 3 last entered #3 and "
        f"is in load_batch (deadlock_job.py:{LOAD_AT})"
    ) in how, how


def test_without_the_recorder_the_stacks_stand_alone(cluster_factory):
    cluster = cluster_factory(2).start(["--nproc-per-node", "2", "--no-flight-recorder", JOB])
    wait_for(lambda: _ready(cluster, range(4)), 120, "every rank in its last collective", 0.2)
    stacks = _stacks(cluster)
    assert stacks.returncode == 0 and "collectives (" not in stacks.stdout, stacks.stdout
    assert "all_reduce" in stacks.stdout


def test_nccls_own_dumps_at_a_collective_timeout_name_who_waits_for_whom(cluster_factory):
    """The ranks die as NCCL's watchdog ends them at its timeout (dump, then abort: simulated on
    gloo with torch's own serializer, see the fixture): no --hang-timeout, no probe answers.
    Node 0 reads the attempt's dumps at its verdict: the root cause (the first rank killed)
    says which collective the others waited in, summary.json has the whole view."""
    cluster = cluster_factory(2).start(["--nproc-per-node", "2", JOB, "--watchdog"])
    wait_for(lambda: _ready(cluster, range(4)), 120, "every rank in its last collective", 0.2)
    (cluster.log_dir / "quiet").touch()
    (cluster.log_dir / "timeout").touch()
    assert cluster.wait(90) == [1, 1], cluster.dump()
    summary = cluster.summary()
    how = summary["root_cause"]["how"]
    assert (
        "SIGABRT" in how
        and "; NCCL's dumps: ranks 0-2 entered all_reduce #4 on default_pg"
        " ([4] Float); rank 3 last entered #3 and waits in all_reduce #1 on group 1"
        in how
    ), how
    (attempt,) = summary["attempts"]
    assert attempt["collectives"][0].startswith("ranks 0-2 entered all_reduce #4"), attempt


def test_a_deadlock_ends_as_a_hang_before_its_groups_own_timeout(cluster_factory):
    """No --hang-timeout: the ranks' process groups time out after 20 s (set by the script);
    near it (10 s) the agent calls the hang, so the job ends with the collation and every
    stack instead of gloo's timeout error on some ranks."""
    cluster = cluster_factory(2).start(["--nproc-per-node", "2", "--max-infra-restarts", "0", JOB],
                                       env={"PG_TIMEOUT": "20"})  # fmt: skip
    wait_for(lambda: _ready(cluster, range(4)), 120, "every rank in its last collective", 0.2)
    (cluster.log_dir / "quiet").touch()
    assert cluster.wait(90) == [1, 1], cluster.dump()
    how = cluster.summary()["root_cause"]["how"]
    assert how.startswith("hang: ranks 0-2 waited "), how
    assert " s in all_reduce #4 on default_pg, near its 20 s timeout; " + BEHIND in how, how
    assert BEHIND in (cluster.log_dir / "stacks-a0.txt").read_text()


def test_ranks_silent_past_their_timeout_with_no_collective_pending_are_no_hang(cluster_factory):
    """Every rank sleeps 9 s in its own code, silent, past the point where a pending collective
    of its groups (12 s timeout) would be called (6 s), but with none pending (the shape of
    compiling, evaluating, saving): not a hang. (Under CI's load a rank ending with its gloo
    group alive once aborted in the interpreter's finalisation, "terminate called without an
    active exception", pytorch/pytorch#190489: the job destroys its groups before it exits.)"""
    cluster = cluster_factory(2).start(["--nproc-per-node", "2", JOB, "--sleep", "9"],
                                       env={"PG_TIMEOUT": "12"})  # fmt: skip
    wait_for(lambda: _ready(cluster, range(4)), 120, "every rank asleep", 0.2)
    (cluster.log_dir / "quiet").touch()
    assert cluster.wait(90) == [0, 0], cluster.dump()
    said = cluster.agents[0].stderr()
    assert "hang:" not in said and "near its timeout" not in said, cluster.dump()
