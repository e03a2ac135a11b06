"""scripts/examples/allreduce_bench.py's pure math: sizes, caps, algbw/busbw as nccl-tests define them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "examples" / "allreduce_bench.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("allreduce_bench", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through it
    spec.loader.exec_module(module)
    return module


bench = _load()
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def test_importing_the_bench_does_not_import_torch() -> None:
    assert "torch" not in vars(bench)


@pytest.mark.parametrize(
    ("ranks", "factor"), [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75), (16, 1.875)]
)
def test_bus_factor_is_two_n_minus_one_over_n(ranks: int, factor: float) -> None:
    assert bench.bus_factor(ranks) == factor


def test_bus_factor_needs_a_rank() -> None:
    with pytest.raises(ValueError):
        bench.bus_factor(0)


# (nodes or GPUs, busbw, algbw) from the seeds' measured tables, rounded to 0.1 GB/s there.
SEED_003 = [
    (1, 2512.1, 1674.7),
    (2, 1192.2, 681.2),
    (4, 655.7, 349.7),
    (8, 658.3, 339.8),
    (16, 662.0, 336.3),
    (32, 663.8, 334.5),
    (64, 660.3, 331.5),
    (128, 633.6, 317.4),
]
SEED_004 = [
    (2, 1687.1, 1687.1),
    (4, 1621.5, 1081.0),
    (8, 1662.4, 949.9),
    (16, 122.3, 65.2),
    (32, 76.2, 39.3),
]


@pytest.mark.parametrize(
    ("ranks", "bus", "alg"), [(4 * nodes, bus, alg) for nodes, bus, alg in SEED_003] + SEED_004
)
def test_busbw_matches_published_tables(ranks: int, bus: float, alg: float) -> None:
    """Seed 003 ran 4 GPUs per node; seed 004 counts GPUs. Both follow busbw = algbw x 2(n-1)/n."""
    assert bench.busbw(alg, ranks) == pytest.approx(bus, rel=2e-3)


def test_algbw_is_bytes_over_time_in_decimal_gb() -> None:
    assert bench.algbw(10**9, 1.0) == 1.0
    assert bench.algbw(GIB, 0.5) == pytest.approx(2 * GIB / 1e9)
    assert bench.algbw(KIB, 0.0) == float("inf")


def test_make_row() -> None:
    row = bench.make_row(MIB, 4, "float32", 250e-6, 8)
    assert (row.size, row.count, row.type) == (MIB, MIB // 4, "float32")
    assert row.time_us == pytest.approx(250.0)
    assert row.algbw == pytest.approx(MIB / 250e-6 / 1e9)
    assert row.busbw / row.algbw == pytest.approx(1.75)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("1K", KIB),
        ("64k", 64 * KIB),
        ("64KiB", 64 * KIB),
        ("256M", 256 * MIB),
        ("1G", GIB),
        ("2gb", 2 * GIB),
        (" 8 MiB ", 8 * MIB),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert bench.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "1.5G", "-1K", "1X", "K"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        bench.parse_size(text)


def test_message_sizes_double_from_kib_to_the_cap() -> None:
    assert bench.message_sizes(KIB, GIB) == [KIB << i for i in range(21)]
    assert bench.message_sizes(KIB, 100 * KIB) == [
        KIB << i for i in range(7)
    ]  # 64 KiB: next is over
    assert bench.message_sizes(KIB, 4 * KIB, factor=4) == [KIB, 4 * KIB]
    assert bench.message_sizes(KIB, KIB - 1) == []


def test_memory_cap_shares_free_memory_between_local_ranks() -> None:
    assert bench.memory_cap(GIB, 64 * GIB, sharing=8) == GIB  # plenty: --max-bytes wins
    assert bench.memory_cap(GIB, 8 * GIB, sharing=4) == GIB // 2  # 8 GiB / (4 ranks x 4)
    assert bench.memory_cap(GIB, 0, sharing=2) == 0


def test_format_size() -> None:
    assert [bench.format_size(s) for s in (512, KIB, 64 * KIB, 3 * MIB, GIB)] == [
        "512 B",
        "1 KiB",
        "64 KiB",
        "3 MiB",
        "1 GiB",
    ]


def test_table_and_report() -> None:
    rows = [bench.make_row(size, 4, "float32", 1e-3, 4) for size in (KIB, 2 * KIB)]
    lines = bench.format_table(rows).splitlines()
    assert len(lines) == 4 and len({len(line) for line in lines}) == 1  # header, rule, two rows
    assert lines[0].split("|")[1:-1] == [
        " size (B) ",
        " count ",
        "    type ",
        " time (us) ",
        " algbw (GB/s) ",
        " busbw (GB/s) ",
    ]
    assert lines[2].split("|")[1].strip() == "1024"
    result = bench.report(rows, 4, {"backend": "gloo"})
    assert result["world_size"] == 4 and result["bus_factor"] == 1.5 and result["backend"] == "gloo"
    assert result["avg_busbw"] == pytest.approx((rows[0].busbw + rows[1].busbw) / 2)
    assert [r["size"] for r in result["rows"]] == [KIB, 2 * KIB]
