"""A savanna-style train.py stand-in: decodes the base64-JSON args and checks them against the env.

Launch it with the `savanna` config parser (agent/parsers.py: savanna_parser); argv carries `--deepspeed_config B64 --megatron_config B64`,
each urlsafe-base64 of JSON, exactly as savanna's GlobalConfig.consume_neox_args reads them; other
arguments (e.g. `--local_rank=N`) are ignored. Stdlib only, so it runs wherever the ranks run.
Prints one line per rank; exits 1 with the mismatches on stderr if a derived value is wrong.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from typing import Any


def decode(encoded: str) -> dict[str, Any]:
    """One `--*_config` argument back to its dict."""
    return json.loads(base64.urlsafe_b64decode(encoded).decode("utf-8"))


def parse_args(argv: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    parser.add_argument("--megatron_config", required=True)
    parser.add_argument("--deepspeed_config", default=None)
    args, _ = parser.parse_known_args(argv)
    deepspeed = decode(args.deepspeed_config) if args.deepspeed_config else {}
    return decode(args.megatron_config), deepspeed


def parallel_size(config: dict[str, Any], key: str) -> int:
    """savanna's rule: absent or 0 means 1."""
    return max(int(config.get(key) or 1), 1)


def model_parallel_size(config: dict[str, Any]) -> int:
    """Ranks per data-parallel replica: mp * pp * cp."""
    size = 1
    for key in ("model_parallel_size", "pipe_parallel_size", "context_parallel_size"):
        size *= parallel_size(config, key)
    return size


def mismatches(
    megatron: dict[str, Any], deepspeed: dict[str, Any], rank: int, world: int
) -> list[str]:
    """Everything in the decoded configs that disagrees with RANK/WORLD_SIZE."""
    problems = []
    if not 0 <= rank < world:
        problems.append(f"RANK {rank} is outside WORLD_SIZE {world}")
    for key in ("world_size", "global_num_gpus"):
        if megatron.get(key) != world:
            problems.append(f"{key} {megatron.get(key)!r} != WORLD_SIZE {world}")
    dp = world // model_parallel_size(megatron)
    micro = megatron.get("train_micro_batch_size_per_gpu")
    if micro is not None:
        expected = dp * int(megatron.get("gradient_accumulation_steps") or 1) * int(micro)
        if megatron.get("train_batch_size") != expected:
            problems.append(f"train_batch_size {megatron.get('train_batch_size')!r} != {expected}")
    for key, value in deepspeed.items():
        if megatron.get(key) != value:
            problems.append(
                f"deepspeed_config {key} {value!r} != megatron_config {megatron.get(key)!r}"
            )
    return problems


def main(argv: list[str]) -> int:
    megatron, deepspeed = parse_args(argv)
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError) as exc:
        print(
            f"savanna_train: RANK and WORLD_SIZE must be set to integers ({exc!r})", file=sys.stderr
        )
        return 2
    problems = mismatches(megatron, deepspeed, rank, world)
    if problems:
        print(
            f"savanna_train rank {rank}/{world}: MISMATCH: {'; '.join(problems)}", file=sys.stderr
        )
        return 1
    print(
        f"savanna_train rank {rank}/{world}: ok "
        f"data_parallel_size={world // model_parallel_size(megatron)} "
        f"train_batch_size={megatron.get('train_batch_size')} "
        f"model_parallel_size={parallel_size(megatron, 'model_parallel_size')} "
        f"pipe_parallel_size={parallel_size(megatron, 'pipe_parallel_size')} "
        f"keys={len(megatron)} deepspeed_keys={len(deepspeed)}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
