"""Values derived from the world size: data-parallel size and the global train batch size."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.errors import AgentError

# Spellings accepted for each input, first one canonical. GPT-NeoX/savanna accept `-` for `_`
# in top-level keys; Megatron-LM names the first two tensor_/pipeline_model_parallel_size.
MODEL_PARALLEL = ("model_parallel_size", "tensor_model_parallel_size")
PIPE_PARALLEL = ("pipe_parallel_size", "pipeline_model_parallel_size")
CONTEXT_PARALLEL = ("context_parallel_size",)
MICRO_BATCH = ("train_micro_batch_size_per_gpu",)
GRAD_ACCUM = ("gradient_accumulation_steps",)
TRAIN_BATCH = ("train_batch_size",)


def derive(config: Mapping[str, Any], world_size: int) -> dict[str, Any]:
    """Return config plus world_size, data_parallel_size and (given a micro batch) train_batch_size.

    dp = world_size // (mp * pp * cp), each size defaulting to 1 and 0 meaning 1 (savanna writes
    pipe_parallel_size: 0 for "no pipeline"); train_batch_size = dp * gas * micro batch. A value
    the user already set that disagrees with the derived one is an error, never overwritten.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise AgentError(f"world size must be a positive integer, got {world_size!r}")
    mp = _parallel_size(config, MODEL_PARALLEL)
    pp = _parallel_size(config, PIPE_PARALLEL)
    cp = _parallel_size(config, CONTEXT_PARALLEL)
    if world_size % (mp * pp * cp):
        raise AgentError(
            f"world size {world_size} is not divisible by model_parallel_size {mp} x "
            f"pipe_parallel_size {pp} x context_parallel_size {cp} = {mp * pp * cp}; "
            "change the parallel sizes or the number of nodes/GPUs"
        )
    derived = {"world_size": world_size, "data_parallel_size": world_size // (mp * pp * cp)}
    micro = _lookup(config, MICRO_BATCH)
    if micro is not None:
        gas = _lookup(config, GRAD_ACCUM)
        gas = 1 if gas is None else _positive_int(gas, GRAD_ACCUM[0])
        micro = _positive_int(micro, MICRO_BATCH[0])
        derived["train_batch_size"] = derived["data_parallel_size"] * gas * micro
        _check_batch(config, derived["train_batch_size"], derived["data_parallel_size"], gas, micro)
    _check_agrees(config, derived)
    return {**config, **derived}


def _spellings(name: str) -> tuple[str, str]:
    return name, name.replace("_", "-")


def _lookup(config: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    """The one value given under any accepted spelling; two spellings that disagree are an error."""
    found = {key: config[key] for name in names for key in _spellings(name) if key in config}
    if len({repr(value) for value in found.values()}) > 1:
        given = ", ".join(f"{key}={value!r}" for key, value in found.items())
        raise AgentError(f"config sets {given}: these mean the same thing; keep one")
    return next(iter(found.values()), None)


def _parallel_size(config: Mapping[str, Any], names: tuple[str, ...]) -> int:
    value = _lookup(config, names)
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AgentError(f"config {names[0]} must be a non-negative integer, got {value!r}")
    return max(value, 1)


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise AgentError(f"config {name} must be a positive integer, got {value!r}")
    return value


def _check_batch(config: Mapping[str, Any], derived: int, dp: int, gas: int, micro: int) -> None:
    given = _lookup(config, TRAIN_BATCH)
    if given is not None and given != derived:
        raise AgentError(
            f"config train_batch_size {given!r} disagrees with data_parallel_size {dp} x "
            f"gradient_accumulation_steps {gas} x train_micro_batch_size_per_gpu {micro} = "
            f"{derived}; remove train_batch_size or fix the others"
        )


def _check_agrees(config: Mapping[str, Any], derived: Mapping[str, int]) -> None:
    for key, value in derived.items():
        given = _lookup(config, (key,))
        if given is not None and given != value:
            raise AgentError(
                f"config {key} {given!r} disagrees with the job's derived {key} {value}; "
                f"remove {key} from the config (it is derived from the world size)"
            )
