"""bootstrap sweeps: search config × --set → one resolved config and one script per combination."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml

from agent.errors import AgentError
from bootstrap.__main__ import main
from bootstrap.sweep import point_name, points

TEMPLATE = """\
train_micro_batch_size_per_gpu: 2
gradient_accumulation_steps: 1
optimizer:
  type: adam
  params:
    lr: 0.001
    betas: [0.9, 0.95]
"""
SEARCH = """\
train_micro_batch_size_per_gpu: [1, 2, 4]
optimizer:
  params:
    lr: [0.001, 0.0001]
gradient_accumulation_steps: 4
"""
EXPECTED_NAMES = [
    "config_0__train_micro_batch_size_per_gpu=1__optimizer.params.lr=0.001",
    "config_1__train_micro_batch_size_per_gpu=1__optimizer.params.lr=0.0001",
    "config_2__train_micro_batch_size_per_gpu=2__optimizer.params.lr=0.001",
    "config_3__train_micro_batch_size_per_gpu=2__optimizer.params.lr=0.0001",
    "config_4__train_micro_batch_size_per_gpu=4__optimizer.params.lr=0.001",
    "config_5__train_micro_batch_size_per_gpu=4__optimizer.params.lr=0.0001",
]


def run_main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv, environ={})
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the CLI writes relative to where it runs, like a user's shell
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "data.yml").write_text("data_path: /data\n")
    (tmp_path / "model.yml").write_text(TEMPLATE)
    (tmp_path / "search.yml").write_text(SEARCH)
    return tmp_path


def test_three_by_two_sweep_writes_six_configs_and_six_scripts(workdir):
    code, _, err = run_main(
        ["--search-config", "search.yml", "-o", "sweep", "train.py", "data.yml", "model.yml"]
    )
    assert code == 0, err
    sweep = workdir / "sweep"
    assert sorted(p.name for p in sweep.glob("*.yml")) == sorted(f"{n}.yml" for n in EXPECTED_NAMES)
    assert sorted(p.name for p in sweep.glob("*.sbatch")) == sorted(
        f"{n}.sbatch" for n in EXPECTED_NAMES
    )
    assert "wrote 6 configs and 6 scripts to sweep/" in err


@pytest.mark.parametrize(("index", "mbs", "lr"), [(0, 1, 0.001), (3, 2, 0.0001), (5, 4, 0.0001)])
def test_each_resolved_config_is_the_template_with_its_values(workdir, index, mbs, lr):
    run_main(["--search-config", "search.yml", "-o", "sweep", "train.py", "data.yml", "model.yml"])
    config = yaml.safe_load((workdir / "sweep" / f"{EXPECTED_NAMES[index]}.yml").read_text())
    assert config == {
        "train_micro_batch_size_per_gpu": mbs,
        "gradient_accumulation_steps": 4,  # a scalar in the search config is set in every point
        "optimizer": {"type": "adam", "params": {"lr": lr, "betas": [0.9, 0.95]}},
    }


def test_each_script_passes_its_config_in_the_templates_place(workdir):
    run_main(["--search-config", "search.yml", "-o", "sweep", "train.py", "data.yml", "model.yml"])
    name = EXPECTED_NAMES[4]
    script = (workdir / "sweep" / f"{name}.sbatch").read_text()
    assert f"  train.py data.yml sweep/{name}.yml" in script
    assert "model.yml" not in script
    assert "#SBATCH --job-name=train-4" in script


def test_set_overrides_the_search_config_before_expansion(workdir):
    argv = [
        "--search-config",
        "search.yml",
        "--set",
        "optimizer.params.lr=[0.1]",
        "--set",
        "optimizer.type=[adam,sgd]",
        "-o",
        "s",
        "train.py",
        "data.yml",
        "model.yml",
    ]
    assert run_main(argv)[0] == 0
    names = sorted(p.stem for p in (workdir / "s").glob("*.yml"))
    assert len(names) == 6  # 3 batch sizes x 2 optimizers; lr is fixed now, so not in the names
    assert "config_1__train_micro_batch_size_per_gpu=1__optimizer.type=sgd" in names
    config = yaml.safe_load((workdir / "s" / f"{names[0]}.yml").read_text())
    assert config["optimizer"]["params"]["lr"] == 0.1


def test_set_alone_is_a_sweep(workdir):
    assert run_main(["--set", "seed=[1,2]", "train.py", "model.yml"])[0] == 0
    assert sorted(p.name for p in (workdir / "train-sweep").iterdir()) == [
        "config_0__seed=1.sbatch",
        "config_0__seed=1.yml",
        "config_1__seed=2.sbatch",
        "config_1__seed=2.yml",
    ]


def test_missing_search_config_is_one_line_exit_2(workdir):
    code, _, err = run_main(["--search-config", "nope.yml", "train.py", "model.yml"])
    assert code == 2
    assert err == "bootstrap: search config nope.yml not found: check the path\n"


def test_point_values_and_names_are_pure():
    result = points({"a": {"b": 1}}, {"a": {"b": [True, None]}, "c": "x"})
    assert [p.name for p in result] == ["config_0__a.b=true", "config_1__a.b=null"]
    assert result[1].values == (("a.b", None), ("c", "x"))
    assert result[1].config == {"a": {"b": None}, "c": "x"}


def test_a_list_of_lists_sweeps_over_list_values():
    result = points({}, {"betas": [[0.9, 0.95], [0.9, 0.99]]})
    assert [p.config["betas"] for p in result] == [[0.9, 0.95], [0.9, 0.99]]
    assert result[0].name == "config_0__betas=0.9,0.95"


def test_empty_list_is_an_error():
    with pytest.raises(AgentError, match="search config key lr is an empty list"):
        points({}, {"lr": []})


def test_names_are_file_safe():
    assert point_name(7, [(("path",), "/data/a b")]) == "config_7__path=_data_a_b"


def test_template_is_not_modified():
    template = {"a": {"b": 1}}
    points(template, {"a": {"b": [2, 3]}})
    assert template == {"a": {"b": 1}}


def test_sweep_print_writes_nothing(workdir):
    code, out, _ = run_main(["--print", "--set", "seed=[1,2]", "train.py", "model.yml"])
    assert code == 0
    assert out.count("#!/bin/bash") == 2
    assert "# ==> train-sweep/config_1__seed=2.sbatch <==" in out
    assert not Path(workdir / "train-sweep").exists()
