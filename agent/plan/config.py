"""YAML configs: read strictly, merge deeply, apply `--set` overrides, split off `launcher:`."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from agent.errors import AgentError

_BaseLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_MERGE = "tag:yaml.org,2002:merge"


class _KeyProblem(yaml.constructor.ConstructorError):
    """A duplicate or non-string key; its message already says how to fix it."""


class _StrictLoader(_BaseLoader):  # type: ignore[misc, valid-type]
    """A SafeLoader that builds only JSON types and rejects duplicate and non-string keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        # Checked on the raw node: after PyYAML flattens `<<` merges, an explicit key that
        # overrides a merged one would look like a duplicate.
        first_line: dict[str, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:
                continue
            key = self.construct_object(key_node, deep=True)
            mark = key_node.start_mark
            if not isinstance(key, str):
                raise _KeyProblem(
                    None,
                    None,
                    f"key {key!r} is a {type(key).__name__}, not a string; quote it",
                    mark,
                )
            if key in first_line:
                raise _KeyProblem(
                    None,
                    None,
                    f"duplicate key {key!r} (first at line {first_line[key]}); remove one of them",
                    mark,
                )
            first_line[key] = mark.line + 1
        return super().construct_mapping(node, deep=deep)


# The payload is JSON: dates stay text, and tags building bytes, sets or ordered pairs are errors.
_NOT_JSON = {
    f"tag:yaml.org,2002:{name}" for name in ("timestamp", "binary", "set", "omap", "pairs")
}
_StrictLoader.yaml_constructors = {
    tag: build for tag, build in _BaseLoader.yaml_constructors.items() if tag not in _NOT_JSON
}
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP]
    for first, resolvers in _BaseLoader.yaml_implicit_resolvers.items()
}


# YAML 1.1 reads `3e-4` (no dot) as a string; learning rates are written that way all the time.
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def read_config(path: str) -> dict:
    """Read one YAML config file; every problem is an AgentError naming the file and the fix."""
    text = _read_text(Path(path))
    try:
        doc = yaml.load(text, Loader=_StrictLoader)  # _StrictLoader is a SafeLoader
    except yaml.MarkedYAMLError as exc:
        raise AgentError(_yaml_error_line(path, exc)) from None
    except yaml.YAMLError as exc:
        raise AgentError(f"config {path}: invalid YAML: {_one_line(str(exc))}") from None
    if doc is None:
        raise AgentError(f"config {path} is empty; write a mapping of key: value in it")
    if not isinstance(doc, dict):
        raise AgentError(
            f"config {path}: the top level is a {type(doc).__name__}, not a mapping; "
            "write key: value pairs at the top level"
        )
    return doc


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AgentError(
            f"config {path} not found; check the path (configs are read on node 0)"
        ) from None
    except IsADirectoryError:
        raise AgentError(f"config {path} is a directory; give a .yml file") from None
    except PermissionError:
        raise AgentError(
            f"config {path} is not readable; fix its permissions (chmod u+r {path})"
        ) from None
    except UnicodeDecodeError as exc:
        raise AgentError(
            f"config {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8"
        ) from None
    except OSError as exc:
        raise AgentError(f"config {path} cannot be read: {exc.strerror}; check the file") from None


def _yaml_error_line(path: str, exc: yaml.MarkedYAMLError) -> str:
    mark = exc.problem_mark or exc.context_mark
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
    if isinstance(exc, _KeyProblem):
        return f"config {where}: {exc.problem}"
    problem = _one_line(": ".join(part for part in (exc.context, exc.problem) if part))
    started = exc.context_mark
    if started and mark and started.line != mark.line:
        problem += f" (from line {started.line + 1})"
    fix = "use plain YAML values, without tags" if "tag" in problem else "fix the syntax there"
    return f"config {where}: invalid YAML: {problem}; {fix}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


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
    """`a.b.c=VALUE` -> (("a", "b", "c"), VALUE parsed as YAML: 1 int, true bool, x str, empty null)."""
    key, sep, raw = text.partition("=")
    if not sep:
        raise AgentError(f"--set {text!r} has no '='; write --set key.path=value")
    path = tuple(part.strip() for part in key.split("."))
    if not all(path):
        raise AgentError(f"--set {text!r} has an empty key part; write --set key.path=value")
    try:
        value = yaml.load(raw, Loader=_StrictLoader)  # _StrictLoader is a SafeLoader
    except yaml.YAMLError as exc:
        why = getattr(exc, "problem", None) or str(exc)
        raise AgentError(
            f"--set {text!r}: the value is not valid YAML ({_one_line(why)}); quote it"
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
                f"--set {text!r}: {where} is a {type(child).__name__} ({child!r}), not a mapping; "
                f"set {where} itself or pick another key"
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


def load_merged(paths: Sequence[str], overrides: Sequence[str]) -> dict[str, Any]:
    """Read every config, merge them in order, then apply the `--set` overrides."""
    return apply_overrides(merge([read_config(path) for path in paths]), overrides)
