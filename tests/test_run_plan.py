"""The one plan value: decided once on node 0, carried as JSON, the same on every node."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cluster import REPO, base_env

from agent.errors import AgentError
from agent.plan.ranks import buffer_variable, flight_recorder, torch_version, version_in
from agent.plan.run_plan import Request, RunPlan, decide, node_layout, rank_specs
from agent.plan.topology import read_topology
from agent.world import world_from_env


def _topology(root: str):
    return read_topology(Path(root))


def _decide(tmp_path: Path, script: str, configs=(), given=None) -> RunPlan:
    world = world_from_env({}, hostname="vm")
    request = Request(
        script,
        tuple(configs),
        ("--x", "1"),
        (),
        {"log_dir": str(tmp_path / "logs"), **(given or {})},
    )
    return decide(request, world, _topology)


def test_the_plan_round_trips_through_json(tmp_path):
    config = tmp_path / "c.yml"
    config.write_text("lr: 0.1\nlauncher: {max_restarts: 2, grace: 1.5}\n")
    script = tmp_path / "train.py"
    script.write_text("")
    plan = _decide(tmp_path, str(script), [str(config)], {"nproc_per_node": "3"})
    again = RunPlan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again == plan
    assert (plan.options.max_restarts, plan.options.grace, plan.options.nproc_per_node) == (
        2,
        1.5,
        "3",
    )
    assert (plan.world_size, plan.nnodes, plan.nproc_per_node) == (3, 1, 3)
    assert plan.payload.config["lr"] == 0.1 and "launcher" not in plan.payload.config


def test_the_command_line_wins_over_the_launcher_section(tmp_path):
    config = tmp_path / "c.yml"
    config.write_text("launcher: {max_restarts: 2}\n")
    (tmp_path / "t.py").write_text("")
    plan = _decide(tmp_path, str(tmp_path / "t.py"), [str(config)], {"max_restarts": 5})
    assert plan.options.max_restarts == 5


def test_launcher_module_key_makes_the_script_a_module(tmp_path):
    """`launcher: {module: true}` is honoured: no script file is needed, ranks run python -m."""
    config = tmp_path / "c.yml"
    config.write_text("launcher: {module: true}\n")
    plan = _decide(tmp_path, "my.package.train", [str(config)])
    world = world_from_env({}, hostname="vm")
    lay = node_layout(plan, world, _topology("/"))
    (spec,) = rank_specs(plan, world, lay, attempt=0, port=1, config_file="c.json", environ={})
    assert spec.argv[1:4] == ("-m", "my.package.train", "--x")


def test_without_the_module_key_a_missing_script_is_refused(tmp_path):
    with pytest.raises(AgentError, match="script 'my.package.train' not found"):
        _decide(tmp_path, "my.package.train")


def test_a_plan_of_another_shape_is_refused():
    with pytest.raises(AgentError, match="unexpected shape"):
        RunPlan.from_json({"script": "x"})


@pytest.mark.parametrize("how", ["config", "flag"])
def test_module_runs_like_python_m(tmp_path, how):
    """End to end, one node: the rank runs `python -m hello_mod` from the config key or -m."""
    (tmp_path / "hello_mod.py").write_text("import sys\nprint('module', __name__, sys.argv[1:])\n")
    (tmp_path / "c.yml").write_text("launcher: {module: true}\n" if how == "config" else "x: 1\n")
    flag = ["-m"] if how == "flag" else []
    argv = [
        sys.executable,
        "-m",
        "agent",
        "--nproc-per-node",
        "1",
        "--log-dir",
        "logs",
        *flag,
        "hello_mod",
        "c.yml",
        "--",
        "a",
    ]
    env = base_env(tmp_path)
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "logs" / "rank-00000.out").read_text() == "module __main__ ['a']\n"


def test_set_reaches_the_launcher_section_without_any_config(tmp_path):
    (tmp_path / "t.py").write_text("")
    world = world_from_env({}, hostname="vm")
    request = Request(str(tmp_path / "t.py"), (), (), ("launcher.nproc_per_node=2",), {})
    plan = decide(request, world, _topology)
    assert (plan.options.nproc_per_node, plan.world_size) == ("2", 2)


def test_max_config_bytes_bounds_every_config_read(tmp_path):
    config = tmp_path / "c.yml"
    config.write_text("".join(f"lr{i}: 0.1\n" for i in range(4)))
    (tmp_path / "t.py").write_text("")
    with pytest.raises(AgentError, match="over the 10-byte limit"):
        _decide(tmp_path, str(tmp_path / "t.py"), [str(config)], {"max_config_bytes": 10})
    assert _decide(tmp_path, str(tmp_path / "t.py"), [str(config)], {"max_config_bytes": 64})


@pytest.mark.parametrize(
    ("inherited", "expected"),
    [
        (
            {},
            {
                "TORCH_FR_BUFFER_SIZE": "200",
                "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/logs/nccl-trace.a2.rank-",
            },
        ),
        (
            {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"},
            {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/logs/nccl-trace.a2.rank-"},
        ),
        (
            {"TORCH_FR_BUFFER_SIZE": "9", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/x/"},
            {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"},
        ),
    ],
)
def test_nccl_flight_recorder_defaults_never_override_the_user(inherited, expected):
    """A collective timeout leaves a dump in the log dir (per attempt); the user's settings win."""
    assert flight_recorder("/logs", 2, inherited) == expected


def test_older_torch_gets_the_old_buffer_name_only():
    env = flight_recorder("/logs", 0, {}, "TORCH_NCCL_TRACE_BUFFER_SIZE")
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "200" and "TORCH_FR_BUFFER_SIZE" not in env


def test_this_torch_reads_the_new_name():
    assert buffer_variable() == "TORCH_FR_BUFFER_SIZE"  # torch >= 2.7 is installed here


def test_the_torch_version_is_the_installed_metadatas_read_without_importing_either():
    import importlib.metadata

    code = (
        "import sys; from agent.plan.ranks import torch_version; v = torch_version(); "
        "print(v, 'torch' in sys.modules, 'importlib.metadata' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    # version.py carries the build's local tag (2.14.1+cu130) where pip's metadata may not
    release = importlib.metadata.version("torch").split("+")[0]
    version, torch_imported, metadata_imported = out.stdout.split()
    assert (version.split("+")[0], torch_imported, metadata_imported) == (release, "False", "False")
    assert (torch_version() or "").split("+")[0] == release


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("from typing import Optional\n__version__ = '2.13.0+cpu'\ndebug = False\n", "2.13.0+cpu"),
        ('__version__: str = "2.5.1"\n', "2.5.1"),
        ("git_version = 'abc'\n", None),
        ("x = 1  # __version__ = '9.9'\n", None),
        ("", None),
    ],
)
def test_version_in_a_version_file(text, version):
    assert version_in(text) == version
