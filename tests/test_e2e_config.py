"""End to end: the signed broadcast refuses forgeries; bad input is one line, exit 2, nothing started."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from cluster import FIXTURE, REPO, base_env, slurm_env

pytestmark = pytest.mark.e2e

MODEL = str(REPO / "configs" / "model.yml")
DATA = str(REPO / "configs" / "data.yml")
SEED = REPO / "configs" / "launcher-test"


def _agent(tmp_path, args, env=None, nnodes=1, node=0, job="5151", timeout=60):
    full = base_env(tmp_path)
    if nnodes > 1 or node:
        full.update(slurm_env(job, nnodes, node))
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "agent", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _bad_inputs(tmp_path):
    """(name, args, env, what the one line must say)."""
    ready = str(tmp_path / "ready")
    rank = [FIXTURE, "--ready-to", ready]
    busy = socket.socket()
    busy.bind(("0.0.0.0", 0))
    busy.listen(1)
    tmp_path.joinpath("busy-port").write_text(str(busy.getsockname()[1]))
    _bad_inputs.keep = busy  # held open for the test's duration
    secret_home = tmp_path / "home"
    (secret_home / ".config" / "launch-agent").mkdir(parents=True)
    secret = secret_home / ".config" / "launch-agent" / "secret"
    secret.write_text("a" * 64)
    secret.chmod(0o644)
    _write(
        tmp_path,
        "badparser.py",
        "def boom(paths, overrides, shape):\n    raise ValueError('parser exploded')\n"
        "def wrong(paths, overrides, shape):\n    return {'config': {}}\n",
    )
    return [
        ("missing script", ["nope.py"], {}, "script 'nope.py' not found"),
        ("script is a directory", [str(tmp_path)], {}, "is a directory"),
        ("missing config", [*rank, str(tmp_path / "absent.yml")], {}, "absent.yml"),
        ("config is a directory", [*rank, _dir(tmp_path, "cfgdir.yml")], {}, "cfgdir.yml"),
        ("invalid YAML", [*rank, _write(tmp_path, "bad.yml", "a: 1\nb: [1, 2\n")], {}, "bad.yml:"),
        (
            "top level not a mapping",
            [*rank, _write(tmp_path, "list.yml", "- 1\n- 2\n")],
            {},
            "list.yml",
        ),
        ("empty config", [*rank, _write(tmp_path, "empty.yml", "# nothing\n")], {}, "empty.yml"),
        (
            "duplicate keys",
            [*rank, _write(tmp_path, "dup.yml", "a: 1\nb: 2\na: 3\n")],
            {},
            "dup.yml",
        ),
        ("--set without =", ["--set", "lr", *rank, MODEL], {}, "'lr'"),
        ("--set through a scalar", ["--set", "num_layers.x=1", *rank, MODEL], {}, "num_layers"),
        (
            "unknown launcher key",
            [*rank, _write(tmp_path, "l1.yml", "launcher:\n  gracee: 1\n")],
            {},
            "valid keys",
        ),
        (
            "launcher key of the wrong type",
            [*rank, _write(tmp_path, "l2.yml", "launcher:\n  nproc_per_node: two\n")],
            {},
            "nproc_per_node",
        ),
        ("nproc 0", ["--nproc-per-node", "0", *rank], {}, "--nproc-per-node 0"),
        ("nproc negative", ["--nproc-per-node", "-2", *rank], {}, "--nproc-per-node -2"),
        ("master port out of range", ["--master-port", "70000", *rank], {}, "70000"),
        (
            "master port in use",
            ["--master-port", tmp_path.joinpath("busy-port").read_text(), *rank],
            {},
            "in use",
        ),
        (
            "malformed nodelist",
            rank,
            {**slurm_env("1", 2, 0), "SLURM_STEP_NODELIST": "n[1-"},
            "SLURM_STEP_NODELIST",
        ),
        (
            "node id out of range",
            rank,
            {**slurm_env("1", 2, 0), "SLURM_NODEID": "2"},
            "SLURM_NODEID",
        ),
        (
            "SLURM_NNODES disagrees with the nodelist",
            rank,
            {
                **slurm_env("1", 2, 0),
                "SLURM_NNODES": "3",
                "SLURM_STEP_TASKS_PER_NODE": "1(x3)",
                "SLURM_NTASKS": "3",
            },
            "SLURM_NNODES",
        ),
        (
            "more ranks than GPUs",
            ["--nproc-per-node", "2", *rank],
            {"CUDA_VISIBLE_DEVICES": "0"},
            "only 1 GPU",
        ),
        (
            "log dir under a file",
            ["--log-dir", str(tmp_path / "badparser.py" / "logs"), *rank],
            {},
            "not a directory",
        ),
        (
            "derived-value conflict",
            [
                "--nproc-per-node",
                "2",
                *rank,
                _write(tmp_path, "mp.yml", "model_parallel_size: 3\n"),
            ],
            {},
            "3",
        ),
        (
            "train_batch_size disagrees",
            [
                "--nproc-per-node",
                "2",
                *rank,
                MODEL,
                _write(tmp_path, "tbs.yml", "train_batch_size: 5\n"),
            ],
            {},
            "train_batch_size",
        ),
        (
            "secret file readable by others",
            rank,
            {"AGENT_SECRET": "", "HOME": str(secret_home)},
            "chmod 600",
        ),
        (
            "config parser raises",
            ["--config-parser", "badparser:boom", *rank],
            {"PYTHONPATH": f"{tmp_path}:{REPO}"},
            "parser exploded",
        ),
        (
            "config parser returns the wrong type",
            ["--config-parser", "badparser:wrong", *rank],
            {"PYTHONPATH": f"{tmp_path}:{REPO}"},
            "dict",
        ),
        (
            "unknown config parser",
            ["--config-parser", "nosuchmodule:fn", *rank],
            {},
            "nosuchmodule",
        ),
        ("unknown option", ["--nproc-per-nod", "2", *rank], {}, "--nproc-per-nod"),
        ("bad console rank list", ["--console-ranks", "1-x", *rank], {}, "1-x"),
        (
            "both --module and --no-python",
            ["--module", "--no-python", "json.tool"],
            {},
            "exclude each other",
        ),
    ]


def _dir(tmp_path, name):
    (tmp_path / name).mkdir()
    return str(tmp_path / name)


def test_every_bad_input_is_one_line_exit_2_and_starts_nothing(tmp_path):
    (tmp_path / "ready").mkdir()
    cases = _bad_inputs(tmp_path)
    assert len(cases) >= 20
    for name, args, env, expected in cases:
        proc = _agent(
            tmp_path,
            ["--log-dir", str(tmp_path / "logs"), *args] if "--log-dir" not in args else args,
            env,
        )
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, f"{name}: exit {proc.returncode}\n{proc.stderr}"
        assert len(lines) == 1 and lines[0].startswith("agent: error: "), f"{name}: {proc.stderr!r}"
        assert expected in lines[0], f"{name}: {expected!r} not in {lines[0]!r}"
        assert not list((tmp_path / "ready").iterdir()), f"{name}: a rank started"
        assert not (tmp_path / "logs").exists(), f"{name}: left a log dir behind"
