"""agent.plan.parsers and agent.plan.payload: built-in and plugin parsers, savanna argv, payload shape."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.errors import AgentError, ExitCode
from agent.plan.parsers import (
    MAX_ARG_BYTES,
    default_parser,
    load_parser,
    run_parser,
    savanna_parser,
)
from agent.plan.payload import JobShape, Payload

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
LAUNCHER_TEST = CONFIGS / "launcher-test"
SAVANNA_TRAIN = REPO / "scripts" / "examples" / "savanna_train.py"


def _savanna_paths(model: str) -> list[str]:
    return [
        str(LAUNCHER_TEST / "data_configs" / "synthetic.yml"),
        str(LAUNCHER_TEST / "model_configs" / model),
    ]


def _decode(encoded: str) -> dict:
    return json.loads(base64.urlsafe_b64decode(encoded))


def _error(excinfo: pytest.ExceptionInfo[AgentError], *fragments: str) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


# --- default parser ------------------------------------------------------------------------


def test_default_parser_resolves_the_example_configs():
    paths = [str(CONFIGS / "data.yml"), str(CONFIGS / "model.yml")]
    payload = default_parser(paths, ["train_iters=3"], JobShape(4, 2, 2))
    assert isinstance(payload, Payload)
    assert (payload.argv, payload.env) == ((), {})
    config = payload.config
    assert (config["world_size"], config["data_parallel_size"], config["train_batch_size"]) == (
        4,
        4,
        8,
    )
    assert (config["train_iters"], config["vocab_size"]) == (3, 256)


def test_default_parser_drops_the_launcher_section(tmp_path):
    model = tmp_path / "model.yml"
    model.write_text("a: 1\nlauncher:\n  max_restarts: 2\n")
    payload = default_parser([str(model)], [], JobShape(1, 1, 1))
    assert payload.config == {"a": 1, "world_size": 1, "data_parallel_size": 1}


def test_default_parser_errors_are_usage_errors(tmp_path):
    model = tmp_path / "model.yml"
    model.write_text("model_parallel_size: 3\n")
    with pytest.raises(AgentError) as excinfo:
        default_parser([str(model)], [], JobShape(4, 1, 4))
    assert excinfo.value.code == ExitCode.USAGE
    _error(excinfo, "world size 4", "not divisible")


# --- savanna parser ------------------------------------------------------------------------

SAVANNA_JOBS = [
    ("regression_test 2x1", "regression_test.yml", JobShape(2, 2, 1), 2, 4),
    ("40b_test_config 4x8", "40b_test_config.yml", JobShape(32, 4, 8), 16, 32),
]  # fmt: skip


@pytest.mark.parametrize(
    ("model", "shape", "dp", "tbs"), [c[1:] for c in SAVANNA_JOBS], ids=[c[0] for c in SAVANNA_JOBS]
)
def test_savanna_argv_is_deepspeed_then_megatron_base64_json(model, shape, dp, tbs):
    payload = savanna_parser(_savanna_paths(model), [], shape)
    assert payload.argv[0::2] == ("--deepspeed_config", "--megatron_config")
    deepspeed, megatron = _decode(payload.argv[1]), _decode(payload.argv[3])
    assert megatron["train_batch_size"] == deepspeed["train_batch_size"] == tbs
    assert megatron["global_num_gpus"] == megatron["world_size"] == shape.world_size
    assert "data_parallel_size" not in megatron  # savanna's GlobalConfig has no such field
    assert payload.config["data_parallel_size"] == dp
    assert "train_iters" in megatron and "train-iters" not in megatron  # '-' became '_'
    assert set(deepspeed) <= set(megatron)
    assert deepspeed["zero_optimization"] == megatron["zero_optimization"]
    assert "num_layers" not in deepspeed


@pytest.mark.parametrize(
    ("model", "shape", "dp", "tbs"), [c[1:] for c in SAVANNA_JOBS], ids=[c[0] for c in SAVANNA_JOBS]
)
def test_savanna_train_decodes_the_argv_in_a_real_subprocess(model, shape, dp, tbs):
    payload = savanna_parser(_savanna_paths(model), [], shape)
    last = shape.world_size - 1
    result = _run_savanna_train(
        [*payload.argv, f"--local_rank={last % shape.nproc_per_node}"], last, shape.world_size
    )
    assert result.returncode == 0, result.stderr
    assert f"rank {last}/{shape.world_size}: ok" in result.stdout
    assert f"data_parallel_size={dp} train_batch_size={tbs}" in result.stdout


def test_savanna_train_exits_non_zero_when_the_world_size_does_not_match():
    payload = savanna_parser(_savanna_paths("40b_test_config.yml"), [], JobShape(32, 4, 8))
    result = _run_savanna_train(list(payload.argv), 0, 16)
    assert result.returncode == 1
    assert "MISMATCH" in result.stderr
    assert "world_size 32 != WORLD_SIZE 16" in result.stderr
    assert "train_batch_size 32 != 16" in result.stderr


def _run_savanna_train(argv: list[str], rank: int, world: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world)}
    return subprocess.run(
        [sys.executable, str(SAVANNA_TRAIN), *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_savanna_parser_refuses_an_argument_linux_cannot_exec(tmp_path):
    big = tmp_path / "big.yml"
    big.write_text(f"paths: ['{'x' * MAX_ARG_BYTES}']\n")
    with pytest.raises(AgentError) as excinfo:
        savanna_parser([str(big)], [], JobShape(1, 1, 1))
    _error(excinfo, f"{MAX_ARG_BYTES}-byte limit", "into a file")


def test_savanna_parser_refuses_both_spellings_with_different_values(tmp_path):
    model = tmp_path / "model.yml"
    model.write_text("train-iters: 10\ntrain_iters: 20\n")
    with pytest.raises(AgentError) as excinfo:
        savanna_parser([str(model)], [], JobShape(1, 1, 1))
    _error(excinfo, "train_iters", "10", "20", "keep one")


def test_savanna_parser_refuses_a_disagreeing_global_num_gpus(tmp_path):
    model = tmp_path / "model.yml"
    model.write_text("global_num_gpus: 8\n")
    with pytest.raises(AgentError) as excinfo:
        savanna_parser([str(model)], [], JobShape(4, 1, 4))
    _error(excinfo, "global_num_gpus 8", "world size 4")


# --- load_parser / run_parser --------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("default", default_parser),
        ("savanna", savanna_parser),
        ("agent.plan.parsers:savanna_parser", savanna_parser),
        ("json:dumps", json.dumps),
        ("json:JSONDecoder.decode", json.JSONDecoder.decode),
    ],
)
def test_load_parser(spec, expected):
    assert load_parser(spec) is expected


BAD_SPECS = [
    ("unknown-name", "fancy", ["'fancy'", "default or savanna or module:function"]),
    ("empty-function", "json:", ["'json:'", "module:function"]),
    ("empty-module", ":dumps", ["':dumps'", "module:function"]),
    ("unknown-module", "no_such_module_for_launch_agent:parse", ["cannot import no_such_module_for_launch_agent", "ModuleNotFoundError", "PYTHONPATH"]),
    ("unknown-function", "json:no_such_function", ["json has no attribute no_such_function"]),
    ("not-callable", "math:pi", ["'math:pi' is a float, not a callable"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "fragments"), [c[1:] for c in BAD_SPECS], ids=[c[0] for c in BAD_SPECS]
)
def test_load_parser_errors_name_the_spec(spec, fragments):
    with pytest.raises(AgentError) as excinfo:
        load_parser(spec)
    assert excinfo.value.code == ExitCode.USAGE
    _error(excinfo, "config parser", *fragments)


def test_load_parser_reports_a_module_that_fails_to_import(tmp_path, monkeypatch):
    (tmp_path / "la_broken_parser_module.py").write_text("raise RuntimeError('no config today')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AgentError) as excinfo:
        load_parser("la_broken_parser_module:parse")
    _error(excinfo, "cannot import la_broken_parser_module", "RuntimeError: no config today")


def test_plugin_parser_from_a_module_runs(tmp_path, monkeypatch):
    (tmp_path / "la_plugin_parser_module.py").write_text(
        "from agent.plan.payload import Payload\n"
        "def parse(paths, overrides, shape):\n"
        "    return Payload(config={'n': shape.world_size, 'paths': list(paths)}, env={'X': '1'})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    payload = run_parser(
        load_parser("la_plugin_parser_module:parse"), ["a.yml"], [], JobShape(2, 1, 2)
    )
    assert payload == Payload(config={"n": 2, "paths": ["a.yml"]}, env={"X": "1"})


def _raising(paths, overrides, shape):
    raise ValueError("boom\non two lines")


def _usage(paths, overrides, shape):
    raise AgentError("config x.yml: bad", ExitCode.USAGE)


def _refused(paths, overrides, shape):
    raise AgentError("refused by the parser", ExitCode.REFUSED)


def _returns_dict(paths, overrides, shape):
    return {"config": {}}


def _returns_none(paths, overrides, shape):
    return None


def _bad_payload(paths, overrides, shape):
    return Payload(config={"when": object()})


RUN_FAILURES = [
    ("raises", _raising, ExitCode.USAGE, ["config parser", "_raising failed: ValueError: boom on two lines"]),
    ("returns-dict", _returns_dict, ExitCode.USAGE, ["_returns_dict returned a dict", "expected agent.payload.Payload"]),
    ("returns-none", _returns_none, ExitCode.USAGE, ["returned a NoneType"]),
    ("builds-bad-payload", _bad_payload, ExitCode.USAGE, ["payload config.when is a object", "JSON cannot carry"]),
    ("agent-error-usage", _usage, ExitCode.USAGE, ["config x.yml: bad"]),
    ("agent-error-code-kept", _refused, ExitCode.REFUSED, ["refused by the parser"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("fn", "code", "fragments"), [c[1:] for c in RUN_FAILURES], ids=[c[0] for c in RUN_FAILURES]
)
def test_run_parser_failures(fn, code, fragments):
    with pytest.raises(AgentError) as excinfo:
        run_parser(fn, [], [], JobShape(1, 1, 1))
    assert excinfo.value.code == code
    _error(excinfo, *fragments)


def test_run_parser_passes_agent_errors_through_unchanged():
    error = AgentError("as raised", ExitCode.REFUSED)

    def parser(paths, overrides, shape):
        raise error

    with pytest.raises(AgentError) as excinfo:
        run_parser(parser, [], [], JobShape(1, 1, 1))
    assert excinfo.value is error


# --- payload -------------------------------------------------------------------------------


def test_payload_json_roundtrip_normalises_to_plain_types():
    payload = Payload(config={"t": (1, 2), "o": {"x": None}}, argv=["--a", "b"], env={"K": "v"})
    assert payload.argv == ("--a", "b")
    assert payload.config == {"t": [1, 2], "o": {"x": None}}
    data = json.loads(json.dumps(payload.to_json()))
    assert data == {
        "config": {"t": [1, 2], "o": {"x": None}},
        "argv": ["--a", "b"],
        "env": {"K": "v"},
    }
    assert Payload.from_json(data) == payload


BAD_PAYLOADS = [
    ("not-an-object", [1], ["payload must be a JSON object", "list"]),
    ("missing-config", {"argv": []}, ["keys config, argv, env", "same launch-agent version"]),
    ("unknown-key", {"config": {}, "extra": 1}, ["keys config, argv, env", "'extra'"]),
    ("config-not-mapping", {"config": [1]}, ["payload config must be a mapping", "list"]),
    ("argv-str", {"config": {}, "argv": "--a b"}, ["argv must be a list of strings", "str"]),
    ("argv-int", {"config": {}, "argv": ["a", 1]}, ["argv[1]", "1"]),
    ("argv-nul", {"config": {}, "argv": ["a\0b"]}, ["argv[0]", "without NUL"]),
    ("env-not-mapping", {"config": {}, "env": ["A=1"]}, ["env must be a mapping"]),
    ("env-bad-name", {"config": {}, "env": {"A=B": "1"}}, ["invalid variable name 'A=B'"]),
    ("env-empty-name", {"config": {}, "env": {"": "1"}}, ["invalid variable name ''"]),
    ("env-int-value", {"config": {}, "env": {"A": 1}}, ["env A must be a string"]),
    ("config-nan", {"config": {"o": {"lr": float("nan")}}}, ["config.o.lr is nan", "finite"]),
    ("config-bytes", {"config": {"l": [b"x"]}}, ["config.l[0] is a bytes"]),
    ("config-inf-listed", {"config": {"l": [0.5, float("-inf")]}}, ["config.l[1] is -inf"]),
    ("config-int-key", {"config": {"o": {1: "x"}}}, ["config.o has a non-string key 1"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("data", "fragments"), [c[1:] for c in BAD_PAYLOADS], ids=[c[0] for c in BAD_PAYLOADS]
)
def test_payload_from_json_validates_types(data, fragments):
    with pytest.raises(AgentError) as excinfo:
        Payload.from_json(data)
    assert excinfo.value.code == ExitCode.USAGE
    _error(excinfo, *fragments)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((0, 1, 1), "world_size must be a positive integer"),
        ((2, 1, True), "nproc_per_node must be a positive integer"),
        ((4, 2, 3), "world_size 4 != nnodes 2 x nproc_per_node 3"),
    ],
)
def test_job_shape_validates(args, fragment):
    with pytest.raises(AgentError) as excinfo:
        JobShape(*args)
    _error(excinfo, fragment)


def test_config_modules_never_import_torch():
    code = (
        "import sys, agent.plan.config, agent.plan.derived, agent.plan.payload, agent.plan.parsers, agent.node.signing; "
        "sys.exit('torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr or "torch was imported"
