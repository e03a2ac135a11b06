"""The job's keys: secret-derived names, AES-GCM records bound to their store key."""

from __future__ import annotations

import json

import pytest

from agent.errors import AgentError, ExitCode
from agent.node.trust import JobKeys, Refused

SECRET = b"0123456789abcdef" * 4
KEYS = JobKeys.derive(SECRET, "4242", "0")
RECORD = {"config": {"wandb_api_key": "sk-live-123", "name": "r\u00e9sum\u00e9"}, "argv": ["--x"]}
KEY = KEYS.namespace + "r0/plan"


def _refused(data: bytes, key: str = KEY, keys: JobKeys = KEYS) -> str:
    with pytest.raises(Refused) as excinfo:
        keys.unseal(data, key, "config payload")
    assert excinfo.value.code == ExitCode.REFUSED and "\n" not in excinfo.value.message
    return excinfo.value.message


def test_roundtrip():
    assert KEYS.unseal(KEYS.seal(RECORD, KEY), KEY, "config payload") == RECORD


def test_no_config_value_is_readable_in_a_sealed_record():
    sealed = KEYS.seal(RECORD, KEY)
    for value in (
        "wandb_api_key",
        "sk-live-123",
        "r\u00e9sum\u00e9".encode().decode("latin-1"),
        "config",
    ):
        assert value.encode("latin-1", "replace") not in sealed
    assert KEYS.seal(RECORD, KEY) != sealed  # a fresh nonce every time


def test_names_depend_on_the_secret_job_and_step_and_reveal_none_of_them():
    assert KEYS.namespace.startswith("la/") and "4242" not in KEYS.namespace
    others = [
        JobKeys.derive(b"another secret", "4242", "0"),
        JobKeys.derive(SECRET, "4243", "0"),
        JobKeys.derive(SECRET, "4242", "1"),
    ]
    assert len({KEYS.namespace, *(k.namespace for k in others)}) == 4
    assert len({KEYS.check_value, *(k.check_value for k in others)}) == 4
    assert JobKeys.derive(SECRET, "4242", "0") == KEYS


@pytest.mark.parametrize(
    ("moved_to", "why"),
    [
        (KEYS.namespace + "r0/a0/abort", "another key of the same job"),
        (KEYS.namespace + "r0/a1/plan", "another attempt"),
        (KEYS.namespace + "r1/plan", "another run"),
        (JobKeys.derive(SECRET, "4243", "0").namespace + "r0/plan", "another job"),
    ],
)
def test_a_genuine_record_moved_elsewhere_does_not_open(moved_to, why):
    sealed = KEYS.seal(RECORD, KEY)
    other = JobKeys.derive(SECRET, "4243", "0") if "another job" in why else KEYS
    assert "does not open with this job's key" in _refused(sealed, moved_to, other), why


def test_every_one_byte_change_is_refused():
    sealed = KEYS.seal({"lr": 1}, KEY)
    for index in range(len(sealed)):
        altered = bytearray(sealed)
        altered[index] ^= 0x01
        _refused(bytes(altered))


@pytest.mark.parametrize(
    "data",
    [b"", b"{}", json.dumps({"body": "{}", "mac": "0" * 64}).encode(), b"\x01" + b"\0" * 20],
)
def test_unsealed_or_malformed_data_is_refused(data):
    assert "refusing config payload" in _refused(data)


def test_another_secret_is_refused_with_the_shared_secret_hint():
    sealed = JobKeys.derive(b"another secret", "4242", "0").seal(RECORD, KEY)
    assert "must share the same AGENT_SECRET" in _refused(sealed)


def test_what_json_cannot_carry_is_an_error():
    with pytest.raises(AgentError, match="not plain JSON"):
        KEYS.seal({"x": float("nan")}, KEY)
    with pytest.raises(AgentError, match="secret is empty"):
        JobKeys.derive(b"", "1", "0")
