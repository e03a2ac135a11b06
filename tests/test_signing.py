"""agent.signing: sealed JSON records and the shared secret; and no pickle anywhere."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agent.errors import AgentError, ExitCode
from agent.node.signing import SECRET_RELPATH, load_secret, seal, unseal

REPO = Path(__file__).resolve().parents[1]
KEY = b"0123456789abcdef" * 4
WHAT = "config payload from the store"
RECORD = {
    "config": {"lr": 0.001, "name": "r\u00e9sum\u00e9", "l": [1, 2]},
    "argv": ["--x"],
    "env": {},
}


def _refused(data: bytes, key: bytes = KEY) -> str:
    with pytest.raises(AgentError) as excinfo:
        unseal(data, key, WHAT)
    assert excinfo.value.code == ExitCode.REFUSED
    message = str(excinfo.value)
    assert message.startswith(f"refusing {WHAT}: ")
    assert "\n" not in message
    return message


def test_roundtrip():
    assert unseal(seal(RECORD, KEY), KEY, WHAT) == RECORD


def test_sealed_record_is_canonical_ascii_json():
    sealed = seal({"b": 1, "a": [1, {"d": 2, "c": "\u00e9"}]}, KEY)
    record = json.loads(sealed)
    assert set(record) == {"body", "mac"}
    assert record["body"] == '{"a":[1,{"c":"\\u00e9","d":2}],"b":1}'
    assert re.fullmatch(r"[0-9a-f]{64}", record["mac"])
    assert sealed.isascii()
    assert seal({"a": [1, {"c": "\u00e9", "d": 2}], "b": 1}, KEY) == sealed


def test_every_one_byte_change_is_refused():
    sealed = seal(RECORD, KEY)
    for index in range(len(sealed)):
        altered = bytearray(sealed)
        altered[index] ^= 0x01
        _refused(bytes(altered))


def test_an_altered_value_with_a_valid_format_is_refused():
    record = json.loads(seal({"lr": 1}, KEY))
    record["body"] = record["body"].replace("1", "2")
    assert "does not match" in _refused(json.dumps(record).encode())


def test_wrong_key_is_refused_with_the_shared_secret_hint():
    message = _refused(seal(RECORD, KEY), key=b"another secret")
    assert "does not match" in message
    assert "AGENT_SECRET" in message


NOT_SEALED = [
    ("plain-json-payload", json.dumps(RECORD).encode(), "unsigned"),
    ("body-only", json.dumps({"body": "{}"}).encode(), "unsigned"),
    ("json-list", b"[1, 2]", "unsigned"),
    ("empty", b"", "not a signed launch-agent record"),
    ("not-json", b"\x80\x04\x95 pickle-like bytes", "not a signed launch-agent record"),
    ("extra-key", json.dumps({"body": "{}", "mac": "0" * 64, "x": 1}).encode(), "not a signed launch-agent record"),
    ("mac-not-str", json.dumps({"body": "{}", "mac": 1}).encode(), "not a signed launch-agent record"),
    ("mac-short", json.dumps({"body": "{}", "mac": "abc"}).encode(), "signature is malformed"),
    ("mac-upper-hex", json.dumps({"body": "{}", "mac": "A" * 64}).encode(), "signature is malformed"),
    ("body-not-object", "[1]", "not a JSON object"),
    ("body-not-json", "{", "not a JSON object"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("data", "fragment"), [c[1:] for c in NOT_SEALED], ids=[c[0] for c in NOT_SEALED]
)
def test_unsigned_or_malformed_records_are_refused(data, fragment):
    if isinstance(data, str):  # a body signed with the right key that is still not an object
        mac = hmac.new(KEY, data.encode(), hashlib.sha256).hexdigest()
        data = json.dumps({"body": data, "mac": mac}).encode()
    assert fragment in _refused(data)


def test_unseal_refuses_str():
    assert "expected bytes" in _refused(seal(RECORD, KEY).decode())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "obj", [{"x": float("nan")}, {"x": b"bytes"}, {"x": object()}], ids=["nan", "bytes", "object"]
)
def test_seal_refuses_what_json_cannot_carry(obj):
    with pytest.raises(AgentError) as excinfo:
        seal(obj, KEY)
    assert "not plain JSON" in str(excinfo.value)


def test_empty_key_is_an_error():
    with pytest.raises(AgentError, match="secret is empty"):
        seal(RECORD, b"")


# --- the secret ----------------------------------------------------------------------------


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


def test_signed_with_the_loaded_secret_roundtrips(tmp_path):
    key = load_secret({}, tmp_path)
    assert unseal(seal(RECORD, key), load_secret({}, tmp_path), WHAT) == RECORD


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
