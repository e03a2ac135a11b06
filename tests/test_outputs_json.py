"""The job's JSON files (agent.run.outputs.write_json): whatever the layout and the encoder,
the file reads back as what was written, whole, and the layouts stay as documented."""

from __future__ import annotations

import json
import math

import pytest

from agent.run.outputs import COMPACT, READABLE, write_json

RANK = {"rank": 7, "host": "node0001", "start": 1795740572.9017026, "how": "killed by SIGTERM"}


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"ranks": [RANK] * 3}, {"ranks": [RANK] * 3}),  # orjson's way
        ({"tail": ["é ☃ \u202e", "\x00\x1b[31m"]}, {"tail": ["é ☃ \u202e", "\x00\x1b[31m"]}),
        ({"pair": (1, 2), "big": 2**40}, {"pair": [1, 2], "big": 2**40}),
        ({1: "int key"}, {"1": "int key"}),  # orjson refuses it: json writes it
        ({"huge": 2**70}, {"huge": 2**70}),  # beyond 64 bits: json again
        ({"lone": "\udcff"}, {"lone": "\udcff"}),  # no UTF-8 for it: json escapes it
    ],
)
def test_the_compact_layout_reads_back_as_written(tmp_path, data, expected) -> None:
    path = tmp_path / "summary.json"
    write_json(str(path), data, **COMPACT)
    raw = path.read_bytes()
    assert raw.endswith(b"\n") and b", " not in raw and b'": ' not in raw
    assert json.loads(raw.decode("utf-8")) == expected
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary left


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"b": {"y": 1, "x": [RANK]}, "a": "é ☃"}, {"a": "é ☃", "b": {"x": [RANK], "y": 1}}),
        ({"huge": 2**70, "a": 1}, {"a": 1, "huge": 2**70}),  # beyond 64 bits: json again
        ({"z": None, "y": True, "x": 0.1}, {"x": 0.1, "y": True, "z": None}),
        ({"lone": "\udcff", "é": 1}, {"lone": "\udcff", "é": 1}),  # no UTF-8 for it: escaped
    ],
)
def test_the_readable_layout_is_sorted_indented_and_reads_back(tmp_path, data, expected) -> None:
    """The resolved config: people read it, so keys sorted and one per line, whichever encoder
    wrote it (orjson, or json past what orjson refuses)."""
    path = tmp_path / "resolved-config.json"
    write_json(str(path), data, **READABLE)
    text = path.read_text(encoding="utf-8")
    assert json.loads(text) == expected
    assert list(json.loads(text)) == sorted(expected)  # top-level keys in order
    assert text.startswith("{\n  ") and text.endswith("}\n")


def test_the_indented_layout_is_json_s_own(tmp_path) -> None:
    path = tmp_path / "summary.json"
    data = {"ranks": [RANK], "tail": ["é"], "ratio": math.pi}
    write_json(str(path), data, indent=1, ensure_ascii=False)
    assert path.read_text(encoding="utf-8") == json.dumps(data, indent=1, ensure_ascii=False) + "\n"
