"""agent.derived: data-parallel size and train batch size from the world size (seed examples)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import AgentError, ExitCode
from agent.plan.config import load_merged
from agent.plan.derived import derive

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
LAUNCHER_TEST = CONFIGS / "launcher-test"


def _launcher_test(model: str) -> dict:
    data = LAUNCHER_TEST / "data_configs" / "synthetic.yml"
    return load_merged([str(data), str(LAUNCHER_TEST / "model_configs" / model)], [])


# The seed's two hand-checked examples, on its shipped-style configs.
SEED_EXAMPLES = [
    ("regression_test 2 nodes x 1 GPU", "regression_test.yml", 2 * 1, 2, 4),
    ("40b_test_config 4 nodes x 8 GPUs", "40b_test_config.yml", 4 * 8, 16, 32),
]  # fmt: skip


@pytest.mark.parametrize(
    ("model", "world", "dp", "tbs"),
    [c[1:] for c in SEED_EXAMPLES],
    ids=[c[0] for c in SEED_EXAMPLES],
)
def test_seed_examples(model, world, dp, tbs):
    derived = derive(_launcher_test(model), world)
    assert (derived["world_size"], derived["data_parallel_size"], derived["train_batch_size"]) == (
        world,
        dp,
        tbs,
    )


DERIVES = [
    ("defaults", {}, 8, {"world_size": 8, "data_parallel_size": 8}),
    ("micro-only", {"train_micro_batch_size_per_gpu": 2}, 2, {"data_parallel_size": 2, "train_batch_size": 4}),
    ("gas", {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}, 4, {"train_batch_size": 32}),
    ("mp-pp", {"model_parallel_size": 2, "pipe_parallel_size": 2, "train_micro_batch_size_per_gpu": 1}, 8, {"data_parallel_size": 2, "train_batch_size": 2}),
    ("pp-zero-means-one", {"pipe_parallel_size": 0, "train_micro_batch_size_per_gpu": 1}, 4, {"data_parallel_size": 4}),
    ("context-parallel", {"context_parallel_size": 2, "train_micro_batch_size_per_gpu": 1}, 8, {"data_parallel_size": 4, "train_batch_size": 4}),
    ("megatron-names", {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2}, 8, {"data_parallel_size": 2}),
    ("hyphen-spelling", {"model-parallel-size": 2, "train-micro-batch-size-per-gpu": 3}, 4, {"data_parallel_size": 2, "train_batch_size": 6}),
    ("agreeing-train-batch", {"train_micro_batch_size_per_gpu": 2, "train_batch_size": 8}, 4, {"train_batch_size": 8}),
    ("train-batch-without-micro-kept", {"train_batch_size": 7}, 4, {"train_batch_size": 7}),
    ("agreeing-world-size", {"world_size": 4}, 4, {"world_size": 4}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("config", "world", "expected"), [c[1:] for c in DERIVES], ids=[c[0] for c in DERIVES]
)
def test_derive(config, world, expected):
    before = dict(config)
    derived = derive(config, world)
    assert {key: derived[key] for key in expected} == expected
    assert {key: derived[key] for key in config} == config
    assert config == before


def test_no_micro_batch_means_no_train_batch_size():
    assert "train_batch_size" not in derive({"gradient_accumulation_steps": 4}, 4)


CONFLICTS = [
    ("world-not-divisible", {"model_parallel_size": 4}, 6, ["world size 6", "model_parallel_size 4", "= 4", "not divisible"]),
    ("parallel-larger-than-world", {"model_parallel_size": 2, "pipe_parallel_size": 4}, 4, ["world size 4", "pipe_parallel_size 4", "= 8"]),
    ("train-batch-disagrees", {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "train_batch_size": 16}, 4, ["train_batch_size 16", "data_parallel_size 4", "gradient_accumulation_steps 1", "train_micro_batch_size_per_gpu 2", "= 8"]),
    ("data-parallel-disagrees", {"data_parallel_size": 3}, 4, ["data_parallel_size 3", "derived data_parallel_size 4"]),
    ("world-size-disagrees", {"world_size": 8}, 4, ["world_size 8", "derived world_size 4"]),
    ("two-spellings-disagree", {"model_parallel_size": 2, "tensor_model_parallel_size": 4}, 8, ["model_parallel_size=2", "tensor_model_parallel_size=4", "keep one"]),
    ("bad-parallel-type", {"model_parallel_size": "2"}, 8, ["model_parallel_size", "non-negative integer", "'2'"]),
    ("negative-parallel", {"pipe_parallel_size": -1}, 8, ["pipe_parallel_size", "-1"]),
    ("zero-micro", {"train_micro_batch_size_per_gpu": 0}, 8, ["train_micro_batch_size_per_gpu", "positive integer"]),
    ("bool-gas", {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": True}, 8, ["gradient_accumulation_steps", "True"]),
    ("bad-world", {}, 0, ["world size must be a positive integer"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("config", "world", "fragments"), [c[1:] for c in CONFLICTS], ids=[c[0] for c in CONFLICTS]
)
def test_conflicts_are_usage_errors_with_the_numbers(config, world, fragments):
    with pytest.raises(AgentError) as excinfo:
        derive(config, world)
    assert excinfo.value.code == ExitCode.USAGE
    for fragment in fragments:
        assert fragment in str(excinfo.value), (fragment, str(excinfo.value))
