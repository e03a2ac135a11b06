"""c10d's reverse-DNS switch, found in libtorch's symbol table once per process.

A child interpreter (torch is heavy) finds nothing before the first call, the flag's address
after it; clears the flag by hand (as c10d starts) and calls again: the flag is set again, at the
address found the first time.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")

CHILD = r"""
import ctypes, json, os
import torch
from agent.node import dnsfix

real = os.path.join(os.path.dirname(torch.__file__), "lib")
library = os.path.join(real, "libtorch_cpu.so")
unknown = dnsfix.found_address(library) is None
first = dnsfix.disable_reverse_dns(real)
address = dnsfix.found_address(library)
flag = ctypes.c_bool.from_address(address)
before = flag.value
flag.value = False  # as c10d starts: lookups on
again = dnsfix.disable_reverse_dns(real)
same = dnsfix.found_address(library) == address
print(json.dumps({"unknown": unknown, "same": same, "first": first, "before": before, "again": again, "after": flag.value}))
"""


def test_the_flag_is_found_once_and_set_at_every_call() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300, check=True
    )
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found == {
        "unknown": True,
        "same": True,
        "first": True,
        "before": True,
        "again": True,
        "after": True,
    }
