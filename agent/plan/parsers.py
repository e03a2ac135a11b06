"""Config parsers: pure callables (config paths, overrides, job shape) -> Payload, run on node 0."""

from __future__ import annotations

import base64
import functools
import importlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agent.errors import AgentError
from agent.plan.config import load_merged, split_launcher
from agent.plan.derived import derive
from agent.plan.payload import JobShape, Payload

Parser = Callable[[Sequence[str], Sequence[str], JobShape], Payload]

# GlobalConfigDeepspeedConfig's fields in savanna (GPT-NeoX: NeoXArgsDeepspeedConfig), i.e. the
# top-level keys of DeepSpeed's JSON config; deepspeed_extra_args entries are added to them.
DEEPSPEED_KEYS = (
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "optimizer", "scheduler", "fp32_allreduce", "prescale_gradients", "gradient_predivide_factor",
    "sparse_gradients", "fp16", "bf16", "amp", "gradient_clipping", "zero_optimization",
    "curriculum_learning", "curriculum_seqlen", "steps_per_print", "wall_clock_breakdown",
    "dump_state", "flops_profiler", "communication_data_type", "autotuning",
    "activation_checkpointing", "sparse_attention", "data_efficiency", "tensorboard", "wandb",
    "csv_monitor", "elasticity", "comms_logger", "compression_training", "checkpoint", "data_types",
)  # fmt: skip
# Derived keys savanna's GlobalConfig has no field for: GlobalConfig.from_dict would reject them.
NOT_SAVANNA_KEYS = ("data_parallel_size",)
# Linux refuses to exec an argv string longer than this (MAX_ARG_STRLEN, 32 pages).
MAX_ARG_BYTES = 131072


def resolve(
    config_paths: Sequence[str], overrides: Sequence[str], shape: JobShape
) -> dict[str, Any]:
    """Read and merge the configs, apply overrides, drop `launcher:`, add the derived values."""
    _, config = split_launcher(load_merged(config_paths, overrides))
    return derive(config, shape.world_size)


def default_parser(
    config_paths: Sequence[str], overrides: Sequence[str], shape: JobShape
) -> Payload:
    """The resolved config, unchanged; the agent hands it to each rank (see the agent's docs)."""
    return Payload(config=resolve(config_paths, overrides, shape))


def savanna_parser(
    config_paths: Sequence[str], overrides: Sequence[str], shape: JobShape
) -> Payload:
    """What savanna's / GPT-NeoX's launcher gives train.py: argv `--deepspeed_config B64
    --megatron_config B64`, each urlsafe-base64 of JSON, as GlobalConfig.consume_neox_args reads.

    Top-level `-` in keys become `_` (as GPT-NeoX's from_ymls does); the megatron config also
    gets global_num_gpus = world size, so savanna does not read it back from SLURM variables.
    """
    _, config = split_launcher(load_merged(config_paths, overrides))
    config = derive(_underscore_keys(config), shape.world_size)
    config = _with_value(config, "global_num_gpus", shape.world_size)
    megatron = {key: value for key, value in config.items() if key not in NOT_SAVANNA_KEYS}
    argv = (
        "--deepspeed_config", _b64_json(deepspeed_config(megatron)),
        "--megatron_config", _b64_json(megatron),
    )  # fmt: skip
    return Payload(config=config, argv=argv)


def deepspeed_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The DeepSpeed part of a savanna config: DEEPSPEED_KEYS plus deepspeed_extra_args."""
    out = {key: config[key] for key in DEEPSPEED_KEYS if config.get(key) is not None}
    extra = config.get("deepspeed_extra_args") or {}
    if not isinstance(extra, Mapping):
        raise AgentError(
            f"config deepspeed_extra_args must be a mapping, got {type(extra).__name__}"
        )
    return {**out, **extra}


def _underscore_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = key.replace("-", "_")
        if name in out and out[name] != value:
            raise AgentError(
                f"config sets both {name} and its spelling with '-' to different values "
                f"({out[name]!r} vs {value!r}); keep one"
            )
        out[name] = value
    return out


def _with_value(config: Mapping[str, Any], key: str, value: int) -> dict[str, Any]:
    if config.get(key) not in (None, value):
        raise AgentError(
            f"config {key} {config[key]!r} disagrees with the job's world size {value}; remove it"
        )
    return {**config, key: value}


def _b64_json(obj: Mapping[str, Any]) -> str:
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    encoded = base64.urlsafe_b64encode(text.encode("utf-8")).decode("ascii")
    if len(encoded) >= MAX_ARG_BYTES:
        raise AgentError(
            f"the encoded config is {len(encoded)} bytes, over Linux's {MAX_ARG_BYTES}-byte limit "
            "for one argument; move large lists (e.g. data paths) into a file the script reads"
        )
    return encoded


BUILTIN_PARSERS: dict[str, Parser] = {"default": default_parser, "savanna": savanna_parser}


def load_parser(spec: str) -> Parser:
    """`default`, `savanna`, or `package.module:function` (an importable callable)."""
    if spec in BUILTIN_PARSERS:
        return BUILTIN_PARSERS[spec]
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AgentError(
            f"config parser {spec!r} is not {' or '.join(BUILTIN_PARSERS)} or module:function"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any error while importing user code is the user's to fix
        raise AgentError(
            f"config parser {spec!r}: cannot import {module_name}: {type(exc).__name__}: "
            f"{_one_line(str(exc))}; check the name and PYTHONPATH"
        ) from None
    try:
        fn = functools.reduce(getattr, attr.split("."), module)
    except AttributeError:
        raise AgentError(f"config parser {spec!r}: {module_name} has no attribute {attr}") from None
    if not callable(fn):
        raise AgentError(f"config parser {spec!r} is a {type(fn).__name__}, not a callable")
    return fn


def run_parser(
    fn: Parser, config_paths: Sequence[str], overrides: Sequence[str], shape: JobShape
) -> Payload:
    """Call a parser; its failures and wrong results become one-line AgentErrors."""
    try:
        payload = fn(config_paths, overrides, shape)
    except AgentError:
        raise
    except Exception as exc:  # a user parser's bug must read as one line, not a traceback
        raise AgentError(
            f"config parser {_name(fn)} failed: {type(exc).__name__}: {_one_line(str(exc))}"
        ) from exc
    if not isinstance(payload, Payload):
        raise AgentError(
            f"config parser {_name(fn)} returned a {type(payload).__name__}, "
            "expected agent.payload.Payload"
        )
    return payload


def _name(fn: Callable) -> str:
    module = getattr(fn, "__module__", None) or "?"
    return f"{module}:{getattr(fn, '__qualname__', repr(fn))}"


def _one_line(text: str) -> str:
    return " ".join(text.split())
