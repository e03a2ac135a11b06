"""The shared secret (env or 0600 file), and no pickle anywhere in the product."""

from __future__ import annotations

import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agent.errors import AgentError, ExitCode
from agent.node.signing import SECRET_RELPATH, load_secret
from agent.node.trust import JobKeys

REPO = Path(__file__).resolve().parents[1]
KEY = b"0123456789abcdef" * 4
WHAT = "config payload from the store"
RECORD = {
    "config": {"lr": 0.001, "name": "r\u00e9sum\u00e9", "l": [1, 2]},
    "argv": ["--x"],
    "env": {},
}


# --- the secret -------------------------------------------------------------------------


def test_agent_secret_env_wins(tmp_path):
    path = tmp_path / SECRET_RELPATH
    path.parent.mkdir(parents=True)
    path.write_text("from the file\n")
    path.chmod(0o600)
    assert load_secret({"AGENT_SECRET": "from env"}, tmp_path) == b"from env"


def test_empty_agent_secret_env_falls_back_to_the_file(tmp_path):
    secret = load_secret({"AGENT_SECRET": ""}, tmp_path)
    assert secret == (tmp_path / SECRET_RELPATH).read_bytes().strip()


def test_secret_file_is_created_0600_in_a_0700_dir_and_reused(tmp_path):
    home = tmp_path / "home"
    secret = load_secret({}, home)
    path = home / SECRET_RELPATH
    assert re.fullmatch(rb"[0-9a-f]{64}", secret)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load_secret({}, home) == secret
    assert [p.name for p in path.parent.iterdir()] == ["secret"]  # no temporary left behind


def test_agents_racing_on_a_shared_home_all_get_the_same_secret(tmp_path):
    code = "import sys; from pathlib import Path; from agent.node.signing import load_secret; "
    code += "sys.stdout.write(load_secret({}, Path(sys.argv[1])).decode())"
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        for _ in range(8)
    ]
    secrets = {racer.communicate(timeout=60)[0] for racer in racers}
    assert secrets == {(tmp_path / SECRET_RELPATH).read_text().strip()}


def test_two_homes_get_different_secrets(tmp_path):
    assert load_secret({}, tmp_path / "a") != load_secret({}, tmp_path / "b")


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660], ids=oct)
def test_secret_file_readable_by_others_is_refused_with_the_chmod_fix(tmp_path, mode):
    path = tmp_path / SECRET_RELPATH
    path.parent.mkdir(parents=True)
    path.write_text("s3cret\n")
    path.chmod(mode)
    with pytest.raises(AgentError) as excinfo:
        load_secret({}, tmp_path)
    message = str(excinfo.value)
    assert excinfo.value.code == ExitCode.USAGE
    assert f"mode {mode:04o}" in message
    assert f"chmod 600 {path}" in message


def test_empty_secret_file_is_an_error(tmp_path):
    path = tmp_path / SECRET_RELPATH
    path.parent.mkdir(parents=True)
    path.write_text("\n")
    path.chmod(0o600)
    with pytest.raises(AgentError, match="is empty; delete it"):
        load_secret({}, tmp_path)


def test_keys_derived_from_the_loaded_secret_open_each_others_records(tmp_path):
    first = JobKeys.derive(load_secret({}, tmp_path), "7", "0")
    again = JobKeys.derive(load_secret({}, tmp_path), "7", "0")
    assert again.unseal(first.seal({"a": 1}, "k"), "k", "record") == {"a": 1}


# --- no pickle -----------------------------------------------------------------------------

# Any import of a pickle-family module, or attribute use such as pickle.loads (prose ending in
# "pickle." is not code).
_PICKLES = r"(?:pickle|cPickle|_pickle|cloudpickle|dill)"
PICKLE_USE = re.compile(
    rf"^[ \t]*(?:import|from)[ \t]+[\w., \t]*?\b{_PICKLES}\b|\b{_PICKLES}\.\w", re.M
)


def test_no_pickle_in_the_product():
    this_file = Path(__file__).resolve()
    offenders = [
        f"{path.relative_to(REPO)}:{text[: match.start()].count(chr(10)) + 1}"
        for folder in ("agent", "bootstrap", "scripts")
        for path in sorted((REPO / folder).rglob("*"))
        if path.is_file()
        and path.suffix in {".py", ".sh", ".sbatch", ".j2", ".txt", ""}
        and path.resolve() != this_file
        for text in [path.read_text(errors="replace")]
        for match in PICKLE_USE.finditer(text)
    ]
    assert not offenders, f"pickle used in: {offenders}"


@pytest.mark.parametrize(
    "line",
    [
        "import pickle",
        "from pickle import loads",
        "x = pickle.loads(b)",
        "import cPickle",
        "  import dill",
    ],
)
def test_the_pickle_pattern_catches(line):
    assert PICKLE_USE.search(line)


@pytest.mark.parametrize(
    "line", ["# JSON, never pickle.", "payloads are JSON (never pickle)", "import picklejar"]
)
def test_the_pickle_pattern_ignores_prose(line):
    assert not PICKLE_USE.search(line)
