"""Reading scheduler variables: every error names the variable, its value and how to fix it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

from agent.errors import AgentError

DIGITS = re.compile(r"[0-9]+")


class Int(NamedTuple):
    """An integer and the variable (or flag) it came from, printed as `NAME=value` in errors."""

    name: str
    value: int

    def __str__(self) -> str:
        return f"{self.name}={self.value}"


def show(name: str, value: str) -> str:
    plain = value and not any(c.isspace() for c in value)
    return f"{name}={value}" if plain else f"{name}={value!r}"


def lookup(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """The first of `names` that is set, with its value: Slurm spells some variables two ways."""
    for name in names:
        if name in env:
            return name, env[name]
    return None


def require(env: Mapping[str, str], names: tuple[str, ...], fix: str) -> tuple[str, str]:
    found = lookup(env, *names)
    if found is None:
        which = f"{names[0]} is not" if len(names) == 1 else f"none of {', '.join(names)} is"
        raise AgentError(f"{which} set: {fix}")
    return found


def to_int(name: str, text: str, fix: str, low: int = 0) -> Int:
    stripped = text.strip()
    if not DIGITS.fullmatch(stripped) or int(stripped) < low:
        kind = "a positive" if low > 0 else "a non-negative"
        raise AgentError(f"{show(name, text)} is not {kind} integer: {fix}")
    return Int(name, int(stripped))


def need_int(env: Mapping[str, str], names: tuple[str, ...], fix: str, low: int = 0) -> Int:
    return to_int(*require(env, names, fix), fix, low)


def opt_int(env: Mapping[str, str], names: tuple[str, ...], fix: str, low: int = 0) -> Int | None:
    found = lookup(env, *names)
    return None if found is None else to_int(*found, fix, low)


def below(index: Int, size: Int, fix: str) -> None:
    if index.value >= size.value:
        raise AgentError(f"{index} is out of range for {size}: {fix}")


def parse_visible(value: str | None) -> tuple[str, ...] | None:
    """CUDA_VISIBLE_DEVICES -> its tokens; unset -> None (all GPUs), "" -> () (none).

    The one parser of that variable: the world, the GPU count and the GPU selection use it."""
    if value is None:
        return None
    return tuple(t.strip() for t in value.split(",") if t.strip())


def visible_devices(env: Mapping[str, str]) -> tuple[str, ...] | None:
    return parse_visible(env.get("CUDA_VISIBLE_DEVICES"))


def port_from_env(env: Mapping[str, str], fix: str) -> int | None:
    port = opt_int(env, ("MASTER_PORT",), fix, low=1)
    if port is not None and port.value > 65535:
        raise AgentError(f"{port} is not a TCP port (1..65535): {fix}")
    return None if port is None else port.value


def master_addr(env: Mapping[str, str], given: str | None, missing: str) -> str:
    addr = given or env.get("MASTER_ADDR", "").strip()
    if not addr:
        raise AgentError(missing)
    return addr
