"""What sealing costs: deriving the job's keys, and sealing/opening the records agents exchange.

Times JobKeys.derive (once per agent) and AES-GCM seal + unseal of a small record (an abort
record, a host announcement), a rank-failure record with a 20-line stderr tail, and a 1 MiB run
plan, against the HMAC-SHA256 signing they replaced. Prints medians in microseconds.
Usage: python scripts/bench_seal.py [N]
"""

from __future__ import annotations

import hashlib
import hmac
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.node.trust import JobKeys  # noqa: E402


def _median_us(fn, n: int) -> float:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def _hmac_roundtrip(record: dict) -> None:
    body = json.dumps(record, sort_keys=True, separators=(",", ":"))
    mac = hmac.new(b"k" * 32, body.encode(), hashlib.sha256).hexdigest()
    json.loads(body)
    hmac.compare_digest(mac, hmac.new(b"k" * 32, body.encode(), hashlib.sha256).hexdigest())


def main(n: int) -> None:
    keys = JobKeys.derive(b"s" * 32, "12345", "0")
    key = keys.namespace + "r0/a0/abort"
    records = {
        "host announcement": {"host": "gpu-node-0042"},
        "rank failure, 20-line stderr tail": {
            "kind": "rank",
            "rank": 7,
            "how": "exit code 1",
            "stderr_tail": ["Traceback (most recent call last): " + "x" * 80] * 20,
        },
        "run plan, 1 MiB config": {"plan": {"config": {"blob": "y" * (1 << 20)}}},
    }
    print(
        f"JobKeys.derive (HKDF-SHA256, once per agent): {_median_us(lambda: JobKeys.derive(b's' * 32, '1', '0'), n):.1f} us"
    )
    print("| record | AES-GCM seal + open | HMAC sign + verify (before) |")
    print("| --- | --- | --- |")
    for name, record in records.items():
        rounds = max(5, n // 20) if "1 MiB" in name else n
        ours = _median_us(lambda r=record: keys.unseal(keys.seal(r, key), key, "x"), rounds)
        before = _median_us(lambda r=record: _hmac_roundtrip(r), rounds)
        print(f"| {name} | {ours:.1f} us | {before:.1f} us |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
