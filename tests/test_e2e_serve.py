"""Resident agents end to end: 4 simulated nodes on loopback serving, clients as real processes.

One warm 4-node set serves most tests in turn (as a user's salloc would); tests that break
agents (a lost node, `down`) get a small set of their own.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from cluster import FIXTURE, wait_for
from serving import Serving

pytestmark = pytest.mark.e2e

FIRST_LINE = "import sys; print('warm' if 'torch' in sys.modules else 'cold', flush=True)\n"


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    serving = Serving(tmp_path_factory.mktemp("serve4"), 4).start()
    try:
        yield serving.ready()
        result = serving.call("down", timeout=60)
        assert result.returncode == 0, result.stderr
        assert serving.wait(30) == [0, 0, 0, 0], serving.dump()
    finally:
        serving.kill()


def _envs(directory):
    return {
        int(p.stem.split("-")[1]): json.loads(p.read_text())["env"]
        for p in directory.glob("env-*.json")
    }


def test_two_runs_each_with_its_own_logs_and_right_env(four, tmp_path):
    log_dirs = []
    for attempt in range(2):
        out = tmp_path / f"env{attempt}"
        out.mkdir()
        result = four.call("run", "--nproc-per-node", "2", FIXTURE, "--env-out", str(out))
        assert result.returncode == 0, result.stderr + four.dump()
        envs = _envs(out)
        assert sorted(envs) == list(range(8))
        for rank, env in envs.items():
            assert env["WORLD_SIZE"] == "8" and env["LOCAL_RANK"] == str(rank % 2)
            assert env["GROUP_RANK"] == str(rank // 2) and env["MASTER_ADDR"] == "127.0.0.1"
            assert env["SLURM_PROCID"] == str(rank // 2), "the node's own step variables"
        log_dir = result.stderr.split("logs in ", 1)[1].split()[0]
        summary = json.loads((Path(log_dir) / "summary.json").read_text())
        assert summary["status"] == "succeeded" and summary["exit_code"] == 0
        log_dirs.append(log_dir)
    assert log_dirs[0] != log_dirs[1]


def test_ranks_are_warm_and_cold_on_request(four, tmp_path):
    script = tmp_path / "first.py"
    script.write_text(FIRST_LINE)
    warm = four.call("run", "--nproc-per-node", "2", str(script))
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout.count("warm") == 8, warm.stdout + warm.stderr
    cold = four.call("run", "--cold", "--nproc-per-node", "2", str(script))
    assert cold.returncode == 0, cold.stderr
    assert cold.stdout.count("cold") == 8, cold.stdout


def test_an_edited_script_runs_its_new_text(four, tmp_path):
    script = tmp_path / "train.py"
    for text in ("first version", "second version"):
        script.write_text(f"print({text!r})\n")
        result = four.call("run", "train.py", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.count(text) == 4, result.stdout


def test_client_env_reaches_ranks_but_not_its_step_variables(four, tmp_path):
    out = tmp_path / "env"
    out.mkdir()
    shell = {"MY_SETTING": "from the shell", "SLURM_PROCID": "99", "SLURM_STEP_ID": "42"}
    result = four.call("run", FIXTURE, "--env-out", str(out), env=shell)
    assert result.returncode == 0, result.stderr
    for rank, env in _envs(out).items():
        assert env["MY_SETTING"] == "from the shell"
        assert env["SLURM_PROCID"] == str(rank) and env["SLURM_STEP_ID"] == "0"
        assert "AGENT_SECRET" not in env


def test_bad_input_is_one_line_and_the_agents_stay(four, tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("model: [1, 2\n")
    result = four.call("run", FIXTURE, str(bad))
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("agent: error:")]
    assert len(errors) == 1 and "bad.yml" in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    missing = four.call("run", "no_such_script.py")
    assert missing.returncode == 2 and "no_such_script.py" in missing.stderr
    assert four.status().stdout.count(" ready ") == 4


def test_wrong_secret_is_refused_and_runs_nothing(four, tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "touch.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    result = four.call("run", str(script), env={"AGENT_SECRET": "not the job's"})
    assert result.returncode == 4, result.stderr
    assert "secret" in result.stderr and "Traceback" not in result.stderr
    assert not marker.exists()


def test_ctrl_c_stops_every_rank_and_a_concurrent_run_is_refused(four, tmp_path):
    ready = tmp_path / "ready"
    ready.mkdir()
    args = [FIXTURE, "--signals-to", str(ready), "--ready-to", str(ready), "--others-wait"]
    client = four.client("run", "--nproc-per-node", "2", *args, "--on")
    wait_for(lambda: len(list(ready.glob("ready-*"))) == 8, 60, "8 ranks to start")
    second = four.call("run", FIXTURE)
    assert second.returncode == 2 and "run " in second.stderr and "is active" in second.stderr
    assert FIXTURE in second.stderr, "names the active run"
    client.send_signal(signal.SIGINT)
    out, err = client.communicate(timeout=30)
    assert client.returncode == 130, err.decode()
    said = out.decode() + err.decode()  # the run's report, relayed: the same code
    assert "job failed (exit 130)" in said and "(exit 1)" not in said, said
    for rank in range(8):
        assert (ready / f"signals-{rank}").read_text().split() == ["SIGINT"]
    wait_for(lambda: four.status().stdout.count(" ready ") == 4, 30, "agents ready again")
    after = four.call("run", FIXTURE)
    assert after.returncode == 0, after.stderr


def test_a_killed_client_stops_its_run(four, tmp_path):
    ready = tmp_path / "ready"
    ready.mkdir()
    args = ["--env-out", str(ready), "--ready-to", str(ready), "--others-wait", "--on"]
    client = four.client("run", FIXTURE, *args)
    wait_for(lambda: len(list(ready.glob("ready-*"))) == 4, 60, "4 ranks to start")
    pids = _rank_pids(ready)
    client.kill()
    client.wait()
    start = time.monotonic()
    assert len(pids) == 4
    wait_for(lambda: not any(_live(p) for p in pids), 10, "ranks gone")
    assert time.monotonic() - start < 10
    assert four.call("run", FIXTURE).returncode == 0


def test_spawn_dataloader_workers_in_a_warm_rank(four, tmp_path):
    script = tmp_path / "loader.py"
    script.write_text(
        "import sys\n"
        "warm = 'torch' in sys.modules\n"
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "if __name__ == '__main__':\n"
        "    data = DataLoader(list(range(8)), batch_size=2, num_workers=2,\n"
        "                      multiprocessing_context='spawn')\n"
        "    print('warm' if warm else 'cold', sum(int(b.sum()) for b in data), flush=True)\n"
    )
    result = four.call("run", str(script))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("warm 28") == 4, result.stdout + result.stderr
    assert "left behind" not in result.stderr, "the resource_tracker exits by itself"


def _rank_pids(ready):
    return [json.loads(p.read_text())["pid"] for p in ready.glob("env-*.json")]


def _live(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# -- agents that break: their own small set ------------------------------------------------
@pytest.fixture
def two(tmp_path):
    serving = Serving(tmp_path, 2, ("--preload", "none", "--heartbeat-timeout", "2"))
    yield serving
    serving.kill()


def test_a_lost_node_is_named_when_a_run_is_refused(two):
    two.start().ready()
    os.killpg(two.agents[1].proc.pid, signal.SIGKILL)
    wait_for(lambda: " lost " in two.status().stdout, 30, "node 0 to notice", interval=0.3)
    result = two.call("run", FIXTURE)
    assert result.returncode == 3
    assert "node 1 (127.0.0.2) lost" in result.stderr, result.stderr


# A rank that says whether it was forked warm (json preloaded), waits for `release`, then ends.
RELEASED = (
    "import sys\n"
    "warm = 'json' in sys.modules\n"  # a fresh interpreter has not imported json yet
    "import json, os, time\n"
    "rank, where = os.environ['RANK'], sys.argv[1]\n"
    "with open(os.path.join(where, f'.started-{rank}'), 'w') as f:\n"
    "    json.dump({'pid': os.getpid(), 'warm': warm}, f)\n"
    # Renamed once written: the test reads it as soon as the name appears.
    "os.replace(os.path.join(where, f'.started-{rank}'), os.path.join(where, f'started-{rank}'))\n"
    "while not os.path.exists(os.path.join(where, 'release')):\n"
    "    time.sleep(0.01)\n"
    "print(f'rank {rank} finished', flush=True)\n"
    "print(f'rank {rank} last words', file=sys.stderr, flush=True)\n"
)


def _children_running(agent: psutil.Process, command: str) -> list[psutil.Process]:
    """The agent's children whose command line holds `command` (one that exits meanwhile is
    not one of them)."""
    found = []
    for child in agent.children():
        try:
            if command in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            pass
    return found


def _zygote_of(agent: psutil.Process) -> psutil.Process:
    """The agent's warm interpreter. A rank it has just forked ahead of a run shows the same
    command line until it retitles itself (`agent-standby-rank`), so this waits for one."""
    found = wait_for(
        lambda: len(z := _children_running(agent, "zygote_main.py")) == 1 and z,
        30,
        "one warm interpreter among the agent's children",
    )
    return found[0]


def test_warm_ranks_outlive_a_killed_zygote(tmp_path):
    """SIGKILL of the zygote mid-run: the warm ranks (the agent's own children) run on and
    finish, the run succeeds with their last lines on the console and in their log files, the
    agent reaps them, and the next run is warm again, from a fresh zygote."""
    script = tmp_path / "released.py"
    script.write_text(RELEASED)
    where = tmp_path / "marks"
    where.mkdir()
    one = Serving(tmp_path, 1, ("--preload", "json"))  # a light zygote, no torch
    try:
        one.start().ready()
        agent = psutil.Process(one.agents[0].proc.pid)
        client = one.client("run", "--nproc-per-node", "2", str(script), str(where))
        wait_for(lambda: len(list(where.glob("started-*"))) == 2, 60, "both ranks to start")
        started = [json.loads((where / f"started-{r}").read_text()) for r in range(2)]
        assert all(s["warm"] for s in started), started
        ranks = [psutil.Process(s["pid"]) for s in started]
        assert [r.ppid() for r in ranks] == [agent.pid] * 2, "adopted by the agent"
        zygote = _zygote_of(agent)
        zygote.kill()
        wait_for(lambda: not psutil.pid_exists(zygote.pid), 30, "the agent to reap the zygote")
        assert all(r.is_running() for r in ranks), "the ranks run on"
        (where / "release").touch()
        out, err = client.communicate(timeout=60)
        said = out.decode() + err.decode()
        assert client.returncode == 0, said
        assert "rank 0 finished" in said and "rank 1 last words" in said, said
        log_dir = Path(err.decode().split("logs in ", 1)[1].split()[0])
        for rank in range(2):
            assert (log_dir / f"rank-{rank:05d}.out").read_text() == f"rank {rank} finished\n"
            assert (log_dir / f"rank-{rank:05d}.err").read_text() == f"rank {rank} last words\n"
        assert not any(psutil.pid_exists(r.pid) for r in ranks), "reaped, no zombie"
        summary = json.loads((log_dir / "summary.json").read_text())
        assert summary["status"] == "succeeded" and summary["exit_code"] == 0
        for mark in where.iterdir():
            mark.unlink()
        (where / "release").touch()
        again = one.call("run", str(script), str(where))
        assert again.returncode == 0, again.stderr
        assert json.loads((where / "started-0").read_text())["warm"], again.stderr
        fresh = _zygote_of(agent)
        assert fresh.pid != zygote.pid
        gone = f"the warm interpreter (pid {zygote.pid}) is gone (killed by SIGKILL)"
        assert gone in again.stderr, again.stderr
    finally:
        one.kill()


def test_status_follows_the_warm_interpreter_between_runs(tmp_path):
    """`agent status` says a node is warm while its interpreter is, and cold once it died
    (the state is published again when it changes, not only at start)."""
    one = Serving(tmp_path, 1, ("--preload", "json"))  # a light zygote, no torch
    try:
        one.start().ready()

        def shown(state: str) -> bool:
            result = one.status()
            return result.returncode == 0 and f" {state}" in result.stdout

        wait_for(lambda: shown("warm"), 60, "status to say warm")
        agent = psutil.Process(one.agents[0].proc.pid)
        zygote = _zygote_of(agent)
        zygote.kill()
        wait_for(lambda: shown("cold"), 30, "status to say cold once the interpreter died")
    finally:
        one.kill()


def test_stacks_of_a_warm_rank_start_at_the_users_code(tmp_path):
    """`agent stacks` on a warm rank: the agent's warm-start frames are one line, then rank.py."""
    one = Serving(tmp_path, 1, ("--preload", "json"))  # a light zygote, no torch
    try:
        one.start().ready()
        client = one.client("run", FIXTURE, "--ready-to", str(tmp_path), "--others-wait")
        wait_for(lambda: (tmp_path / "ready-0").exists(), 60, "the rank to start")
        shown = one.call("stacks", timeout=60)
        client.send_signal(signal.SIGINT)
        client.communicate(timeout=30)
    finally:
        one.kill()
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    folded = [i for i, line in enumerate(lines) if "of the agent's warm start folded)" in line]
    assert len(folded) == 1, shown.stdout
    assert lines[folded[0] + 1].endswith(" in <module>") and "rank.py" in lines[folded[0] + 1]
    assert "/agent/warm/" not in shown.stdout, shown.stdout


def test_down_stops_every_agent_and_leaves_no_process(two, tmp_path):
    two.start().ready()
    assert two.call("run", FIXTURE).returncode == 0
    result = two.call("down")
    assert result.returncode == 0 and "stopped 2 resident agents" in result.stdout
    assert two.wait(30) == [0, 0], two.dump()
    assert not two.connection_file.exists()
    marker = f"{two.job}.0"
    left = [
        p for p in psutil.process_iter()
        if _live(p.pid) and _environ(p).get("LAUNCH_AGENT_JOB") == marker
    ]  # fmt: skip
    assert not left, left


def _environ(proc):
    try:
        return proc.environ()
    except psutil.Error:
        return {}


def test_sigterm_to_node_zero_between_runs_stops_every_agent(two):
    two.start().ready()
    os.kill(two.agents[0].proc.pid, signal.SIGTERM)
    codes = two.wait(15)
    assert codes[0] == 128 + signal.SIGTERM, two.dump()
    assert codes[1] == 0, "node 1 was told to stop, not left waiting"
    assert "node 0 stopped serving" in two.agents[1].stderr()
    assert not two.connection_file.exists()


def test_sigterm_to_another_agent_between_runs_is_named_by_the_next_run(two):
    two.start().ready()
    os.kill(two.agents[1].proc.pid, signal.SIGTERM)
    assert two.agents[1].proc.wait(15) == 128 + signal.SIGTERM, two.dump()
    wait_for(lambda: " lost " in two.status().stdout, 30, "node 0 to notice", interval=0.3)
    result = two.call("run", FIXTURE)
    assert result.returncode == 3
    assert "node 1 (127.0.0.2) left: agent received SIGTERM" in result.stderr, result.stderr


def _hosts(directory) -> list[str]:
    return [env["SLURMD_NODENAME"] for _, env in sorted(_envs(directory).items())]


def test_a_spare_takes_the_place_of_a_node_lost_between_runs(tmp_path):
    """Resident agents keep their roster: a node lost while idle is out of the next run, the
    spare runs its ranks there, and once no spare is left the run after is refused."""
    three = Serving(tmp_path, 3, ("--preload", "none", "--heartbeat-timeout", "2"))
    try:
        three.start().ready()
        first, second, third = (tmp_path / name for name in ("first", "second", "third"))
        for directory in (first, second, third):
            directory.mkdir()
        args = ["run", "--spares", "1", "--nproc-per-node", "1", FIXTURE, "--env-out"]
        assert three.call(*args, str(first)).returncode == 0
        assert _hosts(first) == ["127.0.0.1", "127.0.0.2"]

        os.killpg(three.agents[1].proc.pid, signal.SIGKILL)
        wait_for(lambda: " lost " in three.status().stdout, 30, "node 0 to notice", interval=0.3)
        result = three.call(*args, str(second))
        assert result.returncode == 0, result.stderr
        assert _hosts(second) == ["127.0.0.1", "127.0.0.3"]
        assert [_envs(second)[r]["RANK"] for r in range(2)] == ["0", "1"]
        summary = json.loads(next(tmp_path.glob("logs/*.0.r1/summary.json")).read_text())
        (excluded,) = summary["excluded"]
        assert excluded["host"] == "127.0.0.2" and "lost" in excluded["why"]
        assert "connection to node 0 closed" in excluded["why"]  # its lifeline, not a silence

        os.killpg(three.agents[2].proc.pid, signal.SIGKILL)
        wait_for(
            lambda: three.status().stdout.count(" lost ") == 2, 30, "the second loss", interval=0.3
        )
        refused = three.call(*args, str(third))
        assert refused.returncode == 3, refused.stderr
        assert "node 2 (127.0.0.3) lost" in refused.stderr
        assert "no spare left to take its place" in refused.stderr
        assert not list(third.iterdir()), "nothing may start"
    finally:
        three.kill()


FIRST_TO_ASK = (
    "import os, pathlib, sys, time, torch, torch.distributed as dist\n"
    "where, rank = pathlib.Path(sys.argv[1]), int(os.environ['RANK'])\n"
    "if rank == 0:\n"
    "    while not (where / 'asking').exists():\n"  # rank 1 asks first
    "        time.sleep(0.005)\n"
    "else:\n"
    "    (where / 'asking').touch()\n"
    "dist.init_process_group('gloo')\n"
    "total = torch.ones(1)\n"
    "dist.all_reduce(total)\n"
    "print(os.environ['TORCHELASTIC_USE_AGENT_STORE'], int(total.item()))\n"
    "dist.destroy_process_group()\n"
)


def test_a_one_node_resident_agent_hosts_its_ranks_store(tmp_path):
    """One resident node: once warm, its agent hosts the ranks' store, so a rank that reaches
    init_process_group before rank 0 joins a server that is already there instead of waiting
    out torch's connect back-off for rank 0's (0.4-0.7 s of a warm 1 x 2 run)."""
    script = tmp_path / "first_to_ask.py"
    script.write_text(FIRST_TO_ASK)
    one = Serving(tmp_path, 1)  # torch preloaded, as users serve
    try:
        one.start().ready()
        said = "the ranks of the next runs meet at this agent's store"
        wait_for(lambda: said in one.agents[0].err.read_text(), 120, "the agent to host it")
        result = one.call("run", "--nproc-per-node", "2", str(script), str(tmp_path))
        assert result.returncode == 0, result.stderr + one.dump()
        log_dir = Path(result.stderr.split("logs in ", 1)[1].split()[0])
        for rank in range(2):
            assert (log_dir / f"rank-{rank:05d}.out").read_text() == "True 2\n"
    finally:
        one.kill()


def _standbys(agent: psutil.Process) -> list[int]:
    return sorted(p.pid for p in _children_running(agent, "agent-standby-rank"))


def test_the_next_runs_ranks_are_forked_ahead_between_runs(tmp_path):
    """After a run, a resident agent forks as many ranks as it just ran, each waiting for its
    request: the next run's ranks are those processes (no fork at its start), warm, with their
    own output and exit; a run that needs fewer leaves the rest waiting, one that needs more
    forks the rest; `down` leaves none."""
    script = tmp_path / "released.py"
    script.write_text(RELEASED)
    where = tmp_path / "marks"
    where.mkdir()
    (where / "release").touch()  # no waiting: each rank ends once it wrote its mark
    one = Serving(tmp_path, 1, ("--preload", "json"))  # a light zygote, no torch
    try:
        one.start().ready()
        agent = psutil.Process(one.agents[0].proc.pid)
        assert _standbys(agent) == [], "none before the first run: its size is unknown"

        def run(nproc: int) -> list[dict]:
            for mark in where.glob("started-*"):
                mark.unlink()
            done = one.call("run", "--nproc-per-node", str(nproc), str(script), str(where))
            assert done.returncode == 0, done.stderr
            for rank in range(nproc):
                assert f"rank {rank} finished" in done.stdout + done.stderr
            said.append(done.stderr)
            return [json.loads((where / f"started-{r}").read_text()) for r in range(nproc)]

        said: list[str] = []
        first = run(2)
        wait_for(lambda: len(_standbys(agent)) == 2, 60, "two ranks forked ahead")
        ahead = _standbys(agent)
        assert not {s["pid"] for s in first} & set(ahead)
        second = run(2)
        assert sorted(s["pid"] for s in second) == ahead, (second, ahead)
        assert all(s["warm"] for s in second)
        assert "2 of 2 ranks forked warm (2 forked ahead of the run)" in said[-1], said[-1]
        assert "forked ahead" not in said[0]
        wait_for(lambda: len(_standbys(agent)) == 2, 60, "two more forked ahead")
        ahead = _standbys(agent)
        [third] = run(1)  # one of the two takes it; the other waits on for the next run
        assert third["warm"] and third["pid"] in ahead
        [waiting] = set(ahead) - {third["pid"]}
        assert _standbys(agent) == [waiting]
        fourth = run(3)  # the one waiting, and two forked at the start
        ahead = [waiting]
        assert ahead[0] in {s["pid"] for s in fourth} and all(s["warm"] for s in fourth)
        wait_for(lambda: len(_standbys(agent)) == 3, 60, "three forked ahead")
        ahead = _standbys(agent)
        assert one.call("down").returncode == 0
        assert one.wait(30) == [0]
        wait_for(lambda: not any(_live(pid) for pid in ahead), 30, "none left after down")
    finally:
        one.kill()
