"""agent.config: strict YAML reading, deep merge, `--set` overrides, the launcher: section."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.errors import AgentError, ExitCode
from agent.plan.config import (
    apply_overrides,
    load_merged,
    merge,
    parse_override,
    read_config,
    split_launcher,
)

REPO = Path(__file__).resolve().parents[1]


def _usage_error(excinfo: pytest.ExceptionInfo[AgentError], *fragments: str) -> str:
    message = str(excinfo.value)
    assert excinfo.value.code == ExitCode.USAGE
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


# (case id, file content, fragments the one-line error must contain; "{path}" is the file).
# Our words only: PyYAML's own wording of a syntax error is its business, the place is ours.
BAD_YAML = [
    ("unclosed-list", "a: [1, 2\nb: 3\n", ["{path}:2:", "invalid YAML", "fix the syntax"]),
    ("bad-indent", "a: 1\n  b: 2\n", ["{path}:2:", "invalid YAML", "fix the syntax"]),
    ("unterminated-string", 'a: "x\n', ["{path}:2:", "(from line 1)", "invalid YAML"]),
    ("tab-indent", "\t- a\n", ["{path}:1:1", "invalid YAML"]),
    ("two-documents", "a: 1\n---\nb: 2\n", ["{path}:2:", "single document"]),
    ("undefined-alias", "a: *nope\n", ["{path}:1:4", "undefined alias"]),
    ("python-tag", "a: !!python/object:os.system x\n", ["{path}:1:4", "without tags"]),
    ("binary-tag", "a: !!binary aGk=\n", ["{path}:1:4", "without tags"]),
    ("top-level-list", "- 1\n- 2\n", ["{path}", "list, not a mapping", "key: value"]),
    ("top-level-scalar", "hello\n", ["{path}", "str, not a mapping"]),
    ("empty", "", ["{path} is empty", "key: value"]),
    ("only-comments", "# nothing\n\n", ["{path} is empty"]),
    ("duplicate-top", "a: 1\nb: 2\na: 3\n", ["{path}:3:1", "duplicate key 'a'", "first at line 1", "remove one"]),
    ("duplicate-nested", "x:\n  a: 1\n  a: 2\n", ["{path}:3:3", "duplicate key 'a'", "first at line 2"]),
    ("duplicate-flow", '{"a": 1,\n "a": 2}\n', ["{path}:2:2", "duplicate key 'a'"]),
    ("int-key", "1: x\n", ["{path}:1:1", "key 1 is a int", "quote it"]),
    ("yes-key", "yes: 1\n", ["{path}:1:1", "key True is a bool", "quote it"]),
    ("list-key", "? [a]\n: 1\n", ["{path}:1:", "is a list", "quote it"]),
    ("not-utf8", b"a: \xff\xfe\n", ["{path}", "not UTF-8", "save it as UTF-8"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("content", "fragments"), [c[1:] for c in BAD_YAML], ids=[c[0] for c in BAD_YAML]
)
def test_bad_config_is_one_line_usage_error_naming_the_file(tmp_path, content, fragments):
    path = tmp_path / "model.yml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(AgentError) as excinfo:
        read_config(str(path))
    _usage_error(excinfo, *(f.replace("{path}", str(path)) for f in fragments))


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yml"
    with pytest.raises(AgentError) as excinfo:
        read_config(str(path))
    _usage_error(excinfo, str(path), "not found", "check the path")


def test_directory(tmp_path):
    with pytest.raises(AgentError) as excinfo:
        read_config(str(tmp_path))
    _usage_error(excinfo, str(tmp_path), "is a directory", ".yml file")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path):
    path = tmp_path / "secret.yml"
    path.write_text("a: 1\n")
    path.chmod(0)
    with pytest.raises(AgentError) as excinfo:
        read_config(str(path))
    _usage_error(excinfo, str(path), "not readable", "chmod u+r")


GOOD_YAML = [
    ("merge-key-overridden", "base: &b {a: 1, c: 3}\nx:\n  <<: *b\n  a: 2\n", {"base": {"a": 1, "c": 3}, "x": {"a": 2, "c": 3}}),
    ("dates-stay-text", "d: 2024-01-01\nt: 2024-01-01T10:00:00\n", {"d": "2024-01-01", "t": "2024-01-01T10:00:00"}),
    ("savanna-flow-style", '{\n  # comment\n  "a-b": True,\n  x: CharLevelTokenizer,\n  "o": {"p": [1, 2],},\n}\n', {"a-b": True, "x": "CharLevelTokenizer", "o": {"p": [1, 2]}}),
    ("exponent-without-dot-is-float", "lr: 3e-4\nn: 1e5\n", {"lr": 0.0003, "n": 100000.0}),
    ("same-key-in-sibling-mappings", "x: {a: 1}\ny: {a: 2}\n", {"x": {"a": 1}, "y": {"a": 2}}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("content", "expected"), [c[1:] for c in GOOD_YAML], ids=[c[0] for c in GOOD_YAML]
)
def test_good_config(tmp_path, content, expected):
    path = tmp_path / "c.yml"
    path.write_text(content)
    assert read_config(str(path)) == expected


@pytest.mark.parametrize("path", sorted(str(p) for p in (REPO / "configs").rglob("*.yml")))
def test_shipped_configs_load(path):
    assert read_config(path)


MERGES = [
    ("later-scalar-wins", [{"a": 1}, {"a": 2}], {"a": 2}),
    ("deep-merge", [{"o": {"a": 1, "b": 1}}, {"o": {"b": 2, "c": 3}}], {"o": {"a": 1, "b": 2, "c": 3}}),
    ("three-levels", [{"o": {"p": {"a": 1}}}, {"o": {"p": {"b": 2}}}], {"o": {"p": {"a": 1, "b": 2}}}),
    ("list-replaced", [{"l": [1, 2, 3]}, {"l": [9]}], {"l": [9]}),
    ("mapping-replaced-by-scalar", [{"o": {"a": 1}}, {"o": None}], {"o": None}),
    ("scalar-replaced-by-mapping", [{"o": 1}, {"o": {"a": 1}}], {"o": {"a": 1}}),
    ("list-replaced-by-mapping", [{"o": [1]}, {"o": {"a": 1}}], {"o": {"a": 1}}),
    ("order-of-three", [{"a": 1}, {"a": 2, "b": 1}, {"a": 3}], {"a": 3, "b": 1}),
    ("nothing", [], {}),
]  # fmt: skip


@pytest.mark.parametrize(("docs", "expected"), [c[1:] for c in MERGES], ids=[c[0] for c in MERGES])
def test_merge(docs, expected):
    assert merge(docs) == expected


def test_merge_leaves_inputs_alone_and_shares_nothing():
    first, second = {"o": {"a": [1]}}, {"o": {"b": [2]}}
    merged = merge([first, second])
    merged["o"]["a"].append(9)
    merged["o"]["b"].append(9)
    assert first == {"o": {"a": [1]}}
    assert second == {"o": {"b": [2]}}


OVERRIDES = [
    ("int", "a=1", ("a",), 1),
    ("bool", "a=true", ("a",), True),
    ("str", "a=x", ("a",), "x"),
    ("float", "lr=3e-4", ("lr",), 3e-4),
    ("float-dotted", "lr=0.001", ("lr",), 0.001),
    ("quoted-str", "a='1'", ("a",), "1"),
    ("null", "a=null", ("a",), None),
    ("empty-is-null", "a=", ("a",), None),
    ("list", "b=[0.9, 0.95]", ("b",), [0.9, 0.95]),
    ("date-stays-str", "d=2024-01-01", ("d",), "2024-01-01"),
    ("value-with-equals", "a=b=c", ("a",), "b=c"),
    ("nested", "optimizer.params.lr=0.1", ("optimizer", "params", "lr"), 0.1),
    ("hyphen-key", "train-iters=5", ("train-iters",), 5),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "path", "value"), [c[1:] for c in OVERRIDES], ids=[c[0] for c in OVERRIDES]
)
def test_parse_override(text, path, value):
    assert parse_override(text) == (path, value)
    assert type(parse_override(text)[1]) is type(value)


BAD_OVERRIDES = [
    ("no-equals", "a.b", ["'a.b'", "no '='", "key.path=value"]),
    ("empty-key", "=1", ["empty key part"]),
    ("empty-middle-part", "a..b=1", ["'a..b=1'", "empty key part"]),
    ("trailing-dot", "a.=1", ["empty key part"]),
    ("bad-yaml-value", "a=[1,", ["'a=[1,'", "not valid YAML", "quote it"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "fragments"), [c[1:] for c in BAD_OVERRIDES], ids=[c[0] for c in BAD_OVERRIDES]
)
def test_bad_override(text, fragments):
    with pytest.raises(AgentError) as excinfo:
        parse_override(text)
    _usage_error(excinfo, "--set", *fragments)


APPLY = [
    ("replace", {"a": 1}, ["a=2"], {"a": 2}),
    ("create-nested", {}, ["x.y.z=1"], {"x": {"y": {"z": 1}}}),
    ("into-existing", {"o": {"a": 1}}, ["o.b=2"], {"o": {"a": 1, "b": 2}}),
    ("replace-mapping", {"o": {"a": 1}}, ["o=3"], {"o": 3}),
    ("in-order", {}, ["a=1", "a=2"], {"a": 2}),
    ("none", {"a": 1}, [], {"a": 1}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("cfg", "overrides", "expected"), [c[1:] for c in APPLY], ids=[c[0] for c in APPLY]
)
def test_apply_overrides(cfg, overrides, expected):
    before = repr(cfg)
    assert apply_overrides(cfg, overrides) == expected
    assert repr(cfg) == before


@pytest.mark.parametrize(
    ("cfg", "override", "fragments"),
    [
        ({"a": 1}, "a.b=2", ["a is a int (1), not a mapping", "'a.b=2'"]),
        ({"o": {"l": [1]}}, "o.l.x=2", ["o.l is a list", "not a mapping"]),
        ({"o": {"s": "t"}}, "o.s.u.v=1", ["o.s is a str ('t')"]),
    ],
    ids=["top", "list", "deep"],
)
def test_override_through_a_scalar_names_the_key_path(cfg, override, fragments):
    with pytest.raises(AgentError) as excinfo:
        apply_overrides(cfg, [override])
    _usage_error(excinfo, "--set", *fragments)


SPLITS = [
    ("with-section", {"launcher": {"nproc_per_node": 2}, "a": 1}, ({"nproc_per_node": 2}, {"a": 1})),
    ("without-section", {"a": 1}, ({}, {"a": 1})),
    ("empty-section", {"launcher": None, "a": 1}, ({}, {"a": 1})),
]  # fmt: skip


@pytest.mark.parametrize(("cfg", "expected"), [c[1:] for c in SPLITS], ids=[c[0] for c in SPLITS])
def test_split_launcher(cfg, expected):
    assert split_launcher(cfg) == expected


@pytest.mark.parametrize("section", ["slurm", [1, 2], 3], ids=["str", "list", "int"])
def test_launcher_section_must_be_a_mapping(section):
    with pytest.raises(AgentError) as excinfo:
        split_launcher({"launcher": section})
    _usage_error(
        excinfo, "launcher:", f"is a {type(section).__name__} ({section!r}), not a mapping"
    )


def test_load_merged_reads_in_order_then_applies_overrides(tmp_path):
    data, model = tmp_path / "data.yml", tmp_path / "model.yml"
    data.write_text("seq_length: 64\nshared: {a: 1, b: 1}\n")
    model.write_text("seq_length: 128\nshared: {b: 2}\nlauncher: {x: 1}\n")
    merged = load_merged([str(data), str(model)], ["shared.c=3", "seq_length=256"])
    assert merged == {"seq_length": 256, "shared": {"a": 1, "b": 2, "c": 3}, "launcher": {"x": 1}}


def test_load_merged_names_the_bad_file(tmp_path):
    good, bad = tmp_path / "good.yml", tmp_path / "bad.yml"
    good.write_text("a: 1\n")
    bad.write_text("a: 1\na: 2\n")
    with pytest.raises(AgentError) as excinfo:
        load_merged([str(good), str(bad)], [])
    _usage_error(excinfo, f"{bad}:2:1", "duplicate key")


# (case id, overrides, what load_merged gives without any config file)
NO_CONFIGS = [
    ("launcher-option", ("launcher.nproc_per_node=2",), {"launcher": {"nproc_per_node": 2}}),
    ("several", ("launcher.grace=1.5", "lr=3e-4", "launcher.grace=2"), {"launcher": {"grace": 2}, "lr": 3e-4}),
    ("nothing", (), {}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "expected"), [c[1:] for c in NO_CONFIGS], ids=[c[0] for c in NO_CONFIGS]
)
def test_load_merged_applies_overrides_without_any_config(overrides, expected):
    assert load_merged((), overrides) == expected
    assert split_launcher(load_merged((), overrides))[0] == expected.get("launcher", {})


def test_load_merged_takes_a_size_limit(tmp_path):
    path = tmp_path / "c.yml"
    path.write_text("a: 1\n")  # 5 bytes
    assert load_merged([str(path)], [], max_bytes=5) == {"a": 1}
    with pytest.raises(AgentError) as excinfo:
        load_merged([str(path)], [], max_bytes=4)
    _usage_error(excinfo, str(path), "4-byte limit", "--max-config-bytes")
