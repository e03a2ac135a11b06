"""YAML configs: read strictly, merge deeply, apply `--set` overrides, split off `launcher:`."""

from __future__ import annotations

import contextlib
import contextvars
import copy
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from agent.errors import AgentError
from agent.plan.config_file import read_text
from agent.plan.options import MAX_CONFIG_BYTES
from agent.plan.yaml_loader import (  # noqa: F401  (limits re-exported for callers)
    MAX_ALIAS_NODES,
    MAX_DEPTH,
    MAX_INT_CHARS,
    KeyProblem,
    Refused,
    TooDeep,
    brief,
    load_yaml,
)

# Hostile or broken input must fail fast, as one line: every limit below is checked while the
# file is read or composed, before anything walks the (possibly exponential) expanded tree.
_max_bytes: contextvars.ContextVar[int] = contextvars.ContextVar(
    "max_config_bytes", default=MAX_CONFIG_BYTES
)


@contextlib.contextmanager
def size_limit(max_bytes: int) -> Iterator[None]:
    """Configs read inside (config parsers included) may be up to max_bytes long."""
    token = _max_bytes.set(max_bytes)
    try:
        yield
    finally:
        _max_bytes.reset(token)


def read_config(path: str, max_bytes: int | None = None) -> dict:
    """Read one YAML config file; every problem is an AgentError naming the file and the fix.

    A config is a regular file of at most max_bytes (default: the `--max-config-bytes` in force,
    see size_limit), nested at most MAX_DEPTH levels, whose aliases add at most MAX_ALIAS_NODES.
    """
    text = read_text(Path(path), _max_bytes.get() if max_bytes is None else max_bytes)
    try:
        doc = load_yaml(text)
    except TooDeep as exc:
        raise AgentError(
            f"{_yaml_error_line(path, exc)} deep, the limit for a config; flatten the structure"
        ) from None
    except yaml.MarkedYAMLError as exc:
        raise AgentError(_yaml_error_line(path, exc)) from None
    except yaml.YAMLError as exc:
        raise AgentError(f"config {path}: invalid YAML: {_one_line(str(exc))}") from None
    except RecursionError:  # a backstop: the composer is iterative and the depth bounded
        raise AgentError(
            f"config {path} is nested too deeply to read (the limit is {MAX_DEPTH} levels); "
            "flatten the structure"
        ) from None
    if doc is None:
        raise AgentError(f"config {path} is empty; write a mapping of key: value in it")
    if not isinstance(doc, dict):
        raise AgentError(
            f"config {path}: the top level is a {type(doc).__name__}, not a mapping; "
            "write key: value pairs at the top level"
        )
    return doc


def _yaml_error_line(path: str, exc: yaml.MarkedYAMLError) -> str:
    mark = exc.problem_mark or exc.context_mark
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
    if isinstance(exc, (KeyProblem, Refused)):
        return f"config {where}: {exc.problem}"
    problem = _one_line(": ".join(part for part in (exc.context, exc.problem) if part))
    started = exc.context_mark
    if started and mark and started.line != mark.line:
        problem += f" (from line {started.line + 1})"
    fix = "use plain YAML values, without tags" if "tag" in problem else "fix the syntax there"
    return f"config {where}: invalid YAML: {problem}; {fix}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _shown(text: str, limit: int = 120) -> str:
    """repr(text), shortened: a hostile `--set` must not turn the one error line into megabytes."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text):,} chars)"


def merge(docs: Sequence[Mapping]) -> dict:
    """Merge configs in order: later wins, mappings merge deeply, lists and scalars are replaced."""
    merged: dict = {}
    for doc in docs:
        merged = _merge_two(merged, doc)
    return merged


def _merge_two(base: Mapping, top: Mapping) -> dict:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge_two(out[key], value)
        elif isinstance(value, Mapping):
            out[key] = _merge_two({}, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_override(text: str) -> tuple[tuple[str, ...], object]:
    """`a.b.c=VALUE` -> (("a", "b", "c"), VALUE parsed as YAML: 1 int, true bool, x str, empty null).

    Key path and value together nest at most MAX_DEPTH levels."""
    key, sep, raw = text.partition("=")
    if not sep:
        raise AgentError(f"--set {_shown(text)} has no '='; write --set key.path=value")
    if key.count(".") >= MAX_DEPTH:
        raise AgentError(
            f"--set {_shown(text)}: the key path has more than {MAX_DEPTH} parts (the nesting "
            "limit); shorten it"
        )
    path = tuple(part.strip() for part in key.split("."))
    if not all(path):
        raise AgentError(f"--set {_shown(text)} has an empty key part; write --set key.path=value")
    try:
        value = load_yaml(raw, MAX_DEPTH - len(path))
    except TooDeep as exc:
        raise AgentError(
            f"--set {_shown(text)}: the value is {exc.problem} under a {len(path)}-part key "
            f"path (at most {MAX_DEPTH} levels in all); flatten it"
        ) from None
    except Refused as exc:
        raise AgentError(f"--set {_shown(text)}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        why = getattr(exc, "problem", None) or str(exc)
        raise AgentError(
            f"--set {_shown(text)}: the value is not valid YAML ({_one_line(why)}); quote it"
        ) from None
    except RecursionError:  # a backstop, as in read_config
        raise AgentError(
            f"--set {_shown(text)}: the value is nested too deeply (the limit is {MAX_DEPTH} "
            "levels); flatten it"
        ) from None
    return path, value


def apply_overrides(cfg: Mapping, overrides: Sequence[str]) -> dict:
    """Return a copy of cfg with each `--set` applied in order; missing mappings are created."""
    out = merge([cfg])
    for text in overrides:
        path, value = parse_override(text)
        _set_path(out, path, value, text)
    return out


def _set_path(cfg: dict, path: tuple[str, ...], value: object, text: str) -> None:
    node = cfg
    for depth, part in enumerate(path[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            where = ".".join(path[: depth + 1])
            raise AgentError(
                f"--set {_shown(text)}: {where} is a {type(child).__name__} ({brief(child)}), "
                f"not a mapping; set {where} itself or pick another key"
            )
        node = child
    node[path[-1]] = value


def split_launcher(cfg: Mapping) -> tuple[dict, dict]:
    """Split off the `launcher:` section (agent options) from the config the script receives."""
    rest = {key: value for key, value in cfg.items() if key != "launcher"}
    launcher = cfg.get("launcher")
    if launcher is None:
        return {}, rest
    if not isinstance(launcher, Mapping):
        raise AgentError(
            f"the launcher: section is a {type(launcher).__name__} ({launcher!r}), not a mapping; "
            "it holds launch-agent options as key: value pairs (DeepSpeed's `launcher: pdsh|slurm` "
            "is not needed here: remove it)"
        )
    return dict(launcher), rest


def load_merged(
    paths: Sequence[str], overrides: Sequence[str], *, max_bytes: int | None = None
) -> dict[str, Any]:
    """Read every config, merge them in order, then apply the `--set` overrides; with no
    config at all, the overrides alone (`--set launcher.nproc_per_node=2` still counts).

    max_bytes: the largest config file read (default: the size_limit in force, else
    `--max-config-bytes`' default)."""
    docs = [read_config(path, max_bytes) for path in paths]
    try:
        return apply_overrides(merge(docs), overrides)
    except RecursionError:  # a backstop: every document and override is depth-bounded
        raise AgentError(
            f"configs {' + '.join(paths) or '(none)'} with the --set overrides nest too deeply "
            f"to merge (the limit is {MAX_DEPTH} levels); flatten them"
        ) from None
