"""The example scripts in scripts/examples/, run through real agents on simulated Slurm nodes."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
from cluster import REPO

pytestmark = pytest.mark.e2e

EXAMPLES = REPO / "scripts" / "examples"
CONFIGS = [str(REPO / "configs" / "data.yml"), str(REPO / "configs" / "model.yml")]


def example(name: str) -> str:
    return str(EXAMPLES / f"{name}.py")


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", example(name))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through it
    spec.loader.exec_module(module)
    return module


def rank_outputs(cluster, world: int) -> list[str]:
    return [cluster.rank_file(rank).read_text() for rank in range(world)]


# --- pure parts, no ranks -----------------------------------------------------------------


def test_pi_slices_cover_the_interval_once() -> None:
    pi = load_example("pi")
    for intervals, world in ((10, 3), (1000, 8), (5, 8)):
        slices = [pi.rank_slice(intervals, rank, world) for rank in range(world)]
        assert slices[0][0] == 0 and slices[-1][1] == intervals
        assert all(a[1] == b[0] for a, b in zip(slices, slices[1:], strict=False))
        whole = pi.trapezoid(0, intervals, intervals)
        parts = math.fsum(pi.trapezoid(first, last, intervals) for first, last in slices)
        assert parts == pytest.approx(whole, abs=1e-12)
    assert abs(pi.trapezoid(0, 1000, 1000) - math.pi) < 1e-6


def test_ddp_hyperparameters_come_from_the_config() -> None:
    ddp = load_example("ddp_train")
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "hidden_size": 64,
        "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.9, 0.95]}},
    }
    hyper = ddp.hyper_from_config(config)
    assert (hyper.micro_batch, hyper.lr, hyper.optimizer, hyper.betas, hyper.hidden) == (
        2,
        0.001,
        "adam",
        (0.9, 0.95),
        64,
    )
    assert ddp.hyper_from_config({}) == ddp.Hyper()
    args = ddp.parse_args(["--lr", "0.5", "--epochs", "1", "--out", "x"])
    assert (
        ddp.hyper_from_args(args, hyper).lr == 0.5
        and ddp.hyper_from_args(args, hyper).micro_batch == 2
    )


# --- through the agent --------------------------------------------------------------------


def test_deepspeed_style_script_runs_unchanged_with_deepspeed_flag(cluster_factory) -> None:
    cluster = cluster_factory(1).start(
        ["--nproc-per-node", "2", "--deepspeed", example("deepspeed_style"), "--tag", "x"]
    )
    assert cluster.wait(120) == [0], cluster.dump()
    for rank, text in enumerate(rank_outputs(cluster, 2)):
        match = re.search(r"deepspeed_style: OK (\{.*\})", text)
        assert match, text
        report = json.loads(match.group(1))
        assert report["local_rank"] == report["rank"] == rank
        assert report["argv"] == [
            f"--local_rank={rank}",
            "--tag",
            "x",
        ]  # first, as DeepSpeed passes it


def test_deepspeed_style_script_fails_without_deepspeed_flag(cluster_factory) -> None:
    cluster = cluster_factory(1).start(
        ["--nproc-per-node", "2", example("deepspeed_style"), "--tag", "x"]
    )
    assert cluster.wait(120) == [1], cluster.dump()
    summary = cluster.summary()
    assert summary["status"] == "failed" and summary["exit_code"] == 1
    cause = summary["root_cause"]
    assert cause["kind"] == "rank" and cause["returncode"] == 2  # argparse's usage error
    assert "the following arguments are required: --local_rank" in cause["stderr_tail"][-1]


def test_pi_on_four_nodes_of_two_ranks(cluster_factory) -> None:
    cluster = cluster_factory(4).start(["--nproc-per-node", "2", example("pi")])
    assert cluster.wait(240) == [0] * 4, cluster.dump()
    outputs = rank_outputs(cluster, 8)
    match = re.search(r"^pi=(\d\.\d+) error=(\S+) ranks=(\d+)", outputs[0], re.M)
    assert match, outputs[0]
    assert abs(float(match.group(1)) - math.pi) < 1e-6 and float(match.group(2)) < 1e-6
    assert match.group(3) == "8"
    assert not any("pi=" in text for text in outputs[1:])  # rank 0 alone prints


def test_allreduce_bench_busbw_table(cluster_factory, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ["--max-bytes", "64K", "--warmup", "1", "--iters", "3", "--json", str(out)]
    cluster = cluster_factory(2).start(["--nproc-per-node", "2", example("allreduce_bench"), *args])
    assert cluster.wait(240) == [0, 0], cluster.dump()
    n = 4
    result = json.loads(out.read_text())
    assert result["world_size"] == n and result["backend"] == "gloo"
    rows = result["rows"]
    assert [r["size"] for r in rows] == [1024 << i for i in range(7)]  # 1 KiB .. 64 KiB
    for r in rows:
        assert r["count"] == r["size"] // 4 and r["time_us"] > 0
        assert r["busbw"] / r["algbw"] == pytest.approx(2 * (n - 1) / n)
    table = [line for line in rank_outputs(cluster, 1)[0].splitlines() if line.startswith("|")]
    assert "busbw (GB/s)" in table[0] and len(table) == 2 + len(rows)


def test_ddp_train_saves_one_checkpoint(cluster_factory, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    script = ["--", "--epochs", "2", "--samples", "64", "--out", str(ckpt)]
    cluster = cluster_factory(1).start(
        ["--nproc-per-node", "2", example("ddp_train"), *CONFIGS, *script]
    )
    assert cluster.wait(180) == [0], cluster.dump()
    outputs = rank_outputs(cluster, 2)
    assert "'micro_batch': 2, 'lr': 0.001" in outputs[0]  # from configs/model.yml
    assert len(re.findall(r"^epoch \d+ loss ", outputs[0], re.M)) == 2
    assert sum(text.count("saved checkpoint") for text in outputs) == 1
    assert sorted(p.name for p in ckpt.iterdir()) == ["checkpoint.pt"]
    assert zipfile.is_zipfile(ckpt / "checkpoint.pt")  # torch.save's format, whole
