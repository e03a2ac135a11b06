"""The agent's options resolved: command line > the configs' `launcher:` section > defaults."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol

from agent.errors import AgentError
from agent.plan.option_table import (  # noqa: F401  (re-exported: the CLI builds on them)
    MAX_CONFIG_BYTES,
    OPTIONS,
    Option,
    OptionScope,
    number_text,
)

_BY_NAME = {o.name: o for o in OPTIONS}


def _default(name: str) -> Any:
    return _BY_NAME[name].default


@dataclass(frozen=True)
class Options:
    """Every option's value; the defaults are option_table's (its one source)."""

    nproc_per_node: str = _default("nproc_per_node")
    log_dir: str | None = _default("log_dir")
    console_ranks: str = _default("console_ranks")
    grace: float = _default("grace")
    max_restarts: int = _default("max_restarts")
    max_infra_restarts: int = _default("max_infra_restarts")
    restart_same_failure: bool = _default("restart_same_failure")
    checkpoint_dir: str | None = _default("checkpoint_dir")
    preempt_signal: str = _default("preempt_signal")
    spares: int = _default("spares")
    min_nodes: int = _default("min_nodes")
    exclude: str | None = _default("exclude")
    health_check: str | None = _default("health_check")
    health_timeout: float = _default("health_timeout")
    min_free_mib: int = _default("min_free_mib")
    numa_binding: str = _default("numa_binding")
    numa_strict: bool = _default("numa_strict")
    config_parser: str = _default("config_parser")
    max_config_bytes: int = _default("max_config_bytes")
    deepspeed: bool = _default("deepspeed")
    no_python: bool = _default("no_python")
    module: bool = _default("module")
    rank_prefix: str | None = _default("rank_prefix")
    rank_prefix_ranks: str = _default("rank_prefix_ranks")
    hang_warning: float = _default("hang_warning")
    flight_recorder: bool = _default("flight_recorder")
    hang_timeout: float = _default("hang_timeout")
    pdb: bool = _default("pdb")
    debug_timeout: float = _default("debug_timeout")
    progress_regex: str | None = _default("progress_regex")
    straggler_factor: float = _default("straggler_factor")
    restart_without_progress: bool = _default("restart_without_progress")
    metrics_port: int | None = _default("metrics_port")
    metrics_addr: str | None = _default("metrics_addr")
    cold: bool = _default("cold")
    preload: str = _default("preload")
    sysfs_root: str = _default("sysfs_root")
    live: bool = _default("live")
    world: str = _default("world")
    nnodes: int | None = _default("nnodes")
    node_rank: int | None = _default("node_rank")
    master_addr: str | None = _default("master_addr")
    master_port: int | None = _default("master_port")
    job_id: str | None = _default("job_id")
    rdzv_timeout: float = _default("rdzv_timeout")
    heartbeat_timeout: float = _default("heartbeat_timeout")


assert {f.name for f in fields(Options)} == set(_BY_NAME), "OPTIONS and Options disagree"
assert all(f.default is _BY_NAME[f.name].default for f in fields(Options)), (
    "a default not taken from OPTIONS"
)


def resolve(cli: Mapping[str, Any], launcher: Mapping[str, Any], where: str = "configs") -> Options:
    """CLI (values given) > the configs' `launcher:` section > defaults; everything validated."""
    values: dict[str, Any] = {}
    for key, value in launcher.items():
        option = _BY_NAME.get(key)
        if option is None:
            valid = ", ".join(o.name for o in OPTIONS if o.in_config)
            raise AgentError(f"unknown launcher key {key!r} in {where}; valid keys: {valid}")
        if not option.in_config:
            why = (
                "it limits how configs are read"
                if key == "max_config_bytes"
                else "every node needs it before node 0's configs arrive"
            )
            raise AgentError(
                f"launcher key {key!r} in {where} cannot come from a config: {why}; "
                f"pass --{key.replace('_', '-')} instead"
            )
        values[key] = _typed(option, value, f"launcher key {key} in {where}")
    for key, value in cli.items():
        if value is not None:
            values[key] = _typed(_BY_NAME[key], value, f"--{key.replace('_', '-')}")
    options = replace(Options(), **values)
    _check(options)
    return options


def _typed(option: Option, value: Any, what: str) -> Any:
    if option.name == "nproc_per_node":
        return _nproc(value, what)
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
    }[option.kind]
    if not ok:
        expected = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[
            option.kind
        ]
        raise AgentError(f"{what}: expected {expected}, got {value!r}")
    if option.choices and value not in option.choices:
        raise AgentError(f"{what}: {value!r} is not one of {', '.join(option.choices)}")
    if option.low is not None and option.high is not None:
        _check_range(option, value, what)
    return float(value) if option.kind is float else value


def _check_range(option: Option, value: float, what: str) -> None:
    """Finite (no nan or inf) and within the option's range; huge ints compare exactly."""
    assert option.low is not None and option.high is not None
    finite = not isinstance(value, float) or math.isfinite(value)
    above_low = value > option.low if option.above else value >= option.low
    if finite and above_low and value <= option.high:
        return
    unit = {int: "an integer", float: "a number of seconds"}[option.kind]
    if option.name == "max_config_bytes":
        unit = "a number of bytes"
    if option.name == "straggler_factor":
        unit = "a factor"
    raise AgentError(_out_of_range(what, number_text(value), f"{unit} {option.range_text()}"))


def _out_of_range(what: str, shown: str, expected: str) -> str:
    """`--grace nan: expected ...`, as flags have always read; `launcher key ...: ..., got nan`."""
    if what.startswith("--"):
        return f"{what} {shown}: expected {expected}"
    return f"{what}: expected {expected}, got {shown}"


_RANKS = re.compile(r"-?[0-9]+")  # ASCII digits only: int() would take '٣' and refuse '²'
MAX_NPROC = 4096


def _nproc(value: Any, what: str) -> str:
    text = str(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else None
    if text is None or not (text in ("auto", "gpu") or _RANKS.fullmatch(text)):
        raise AgentError(f"{what}: expected a number of ranks, 'gpu' or 'auto', got {value!r}")
    if text not in ("auto", "gpu") and not (len(text) <= 12 and 1 <= int(text) <= MAX_NPROC):
        expected = f"1 to {MAX_NPROC} ranks per node, 'gpu' or 'auto'"
        raise AgentError(_out_of_range(what, number_text(text), expected))
    return text


def _check(o: Options) -> None:
    from agent.plan.rank_set import parse_rank_set

    parse_rank_set(o.console_ranks, "--console-ranks")
    parse_rank_set(o.rank_prefix_ranks, "--rank-prefix-ranks")
    preload_list(o.preload)
    if o.progress_regex is not None:
        progress_pattern(o.progress_regex)
    if o.module and o.no_python:
        raise AgentError("--module and --no-python exclude each other: pick one")


class ProgressPattern(Protocol):
    """A compiled --progress-regex: RE2's Pattern (linear time in the bytes searched)."""

    def search(self, text: bytes, pos: int = ..., endpos: int = ...) -> object: ...

    def finditer(self, text: bytes, pos: int = ..., endpos: int = ...) -> Iterator[object]: ...


def progress_pattern(text: str) -> ProgressPattern:
    """--progress-regex, compiled for the raw bytes ranks write (checked once, up front), with
    RE2: a pattern runs on every chunk a rank writes, in the thread that drains every pipe, so it
    must take linear time whatever it is (Python's `re` backtracks exponentially on `(a+)+$` and
    holds the GIL meanwhile: output stops, signals go unanswered). Multi-line: `^` and `$` match
    at each line's start and end."""
    if len(text) > 1000:
        raise AgentError("--progress-regex: longer than 1000 characters; give a shorter pattern")
    import re2  # google-re2; not at module import: --help and the clients do not need it

    options = re2.Options()
    options.log_errors = False  # RE2 would print its own error lines on stderr
    try:
        return re2.compile(b"(?m)" + text.encode("utf-8", "surrogateescape"), options)
    except re2.error as exc:
        why = exc.args[0] if exc.args else exc
        why = why.decode(errors="replace") if isinstance(why, bytes) else str(why)
        raise AgentError(
            f"--progress-regex {text[:60]!r}: not a regular expression RE2 accepts ({why}); "
            "backreferences and lookaround are not supported"
        ) from None


_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def preload_list(text: str) -> tuple[str, ...]:
    """--preload: 'auto' and 'none' as they are, else a checked list of module names."""
    if text in ("auto", "none"):
        return (text,)
    names = tuple(n.strip() for n in text.split(","))
    bad = [n for n in names if not _MODULE.fullmatch(n) or len(n) > 200]
    if bad or not names or len(names) > 64:
        shown = repr(bad[0][:40]) if bad else f"{len(names)} names"
        raise AgentError(
            f"--preload {shown}: expected 'auto', 'none' or up to 64 module names like torch,numpy"
        )
    return names
