"""Hostile or absurd input is refused fast, as one line, exit 2: config bombs, files that are not
files, option values that are not sensible numbers, rank lists that cover billions of ranks."""

from __future__ import annotations

import contextvars
import math
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cluster import FIXTURE, base_env

from agent.errors import AgentError, ExitCode
from agent.launch.cli import parse
from agent.plan import config as cfg
from agent.plan.options import MAX_CONFIG_BYTES, OPTIONS, Options, progress_pattern, resolve
from agent.plan.rank_set import MAX_RANK_PARTS, RankSet, parse_rank_set

# Seconds: catches a hang or a blow-up only. The refusals take milliseconds (BENCHMARKS.md,
# `scripts/bench.py --only refusals`: the slowest ~0.05 s); a regression takes minutes or hangs.
FAST = 10.0


def _refused_fast(call: Callable[[], Any], *fragments: str) -> str:
    """call() raises a one-line usage AgentError containing fragments, within FAST seconds.

    It runs in a daemon thread, so a call that blocks (a FIFO) or explodes (an alias bomb) fails
    the test instead of hanging the suite."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:  # reported below, whatever it is
            outcome.append(exc)

    started = time.monotonic()
    context = contextvars.copy_context()  # cfg.size_limit() in force where the call was made
    thread = threading.Thread(target=context.run, args=(run,), daemon=True)
    thread.start()
    thread.join(FAST)
    assert outcome, f"still running after {FAST} s"
    elapsed = time.monotonic() - started
    exc = outcome[0]
    assert isinstance(exc, AgentError), f"expected an AgentError, got {exc!r}"
    message = str(exc)
    assert exc.code == ExitCode.USAGE
    assert "\n" not in message and len(message) < 500, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert elapsed < FAST
    return message


def _laughs(levels: int = 9) -> str:
    """The classic "billion laughs": 9 levels of 9 aliases each, 9**10 strings from ~500 bytes."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def _merge_laughs() -> str:
    """The same through `<<` merge keys: every level merges the one below twice."""
    lines = ["m0: &m0 {a: 1, b: 2, c: 3, d: 4}"]
    for i in range(1, 40):
        lines.append(f"m{i}: &m{i} {{x: *m{i - 1}, y: *m{i - 1}, <<: *m{i - 1}}}")
    return "\n".join(lines) + "\n"


DEPTH = cfg.MAX_DEPTH

# (case id, file content, fragments of the one line; "{path}" is the file). The nesting cases
# depend on PyYAML's version: the libyaml bundled with PyYAML 6.0.4 refuses 1,000 levels while
# scanning ahead, before our composer sees level 200; load_yaml then re-reads the text with
# PyYAML's own scanner, so the place and the limit named are ours with 6.0.3 and 6.0.4 alike.
CONFIG_BOMBS = [
    ("billion-laughs", _laughs(), ["{path}:7:10", "aliases expand", "1,000,000", "alias bomb"]),
    ("merge-key-laughs", _merge_laughs(), ["{path}:", "aliases expand", "1,000,000"]),
    ("recursive-alias", "a: &x [1, *x]\n", ["{path}:1:11", "alias *x", "contain itself"]),
    ("recursive-merge", "a: &x {b: 1, <<: *x}\n", ["{path}:1:", "alias *x", "contain itself"]),
    ("10k-nested-lists", "a: " + "[" * 10_000 + "]" * 10_000 + "\n", ["{path}:1:203", f"more than {DEPTH} levels", "flatten"]),
    ("10k-nested-maps", "a: " + "{b: " * 10_000 + "1" + "}" * 10_000 + "\n", ["{path}:1:", f"more than {DEPTH} levels"]),
    ("1M-nested-lists", "[" * 1_000_000, ["{path}:1:201", f"more than {DEPTH} levels"]),
    ("block-nesting", "".join(" " * i + f"k{i}:\n" for i in range(DEPTH + 5)), ["{path}:201:", f"more than {DEPTH} levels"]),
    ("deep-complex-key", "? " + "[" * 199 + "]" * 199 + "\n: 1\n", ["{path}:1:3", "key is a list", "quote it"]),
    ("huge-int", "a: " + "1" * 5000 + "\n", ["{path}:1:4", "integer 5,000 characters", "quote it"]),
    ("huge-base60-int", "a: 1" + ":00" * 200_000 + "\n", ["{path}:1:4", "integer", "quote it"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("content", "fragments"), [c[1:] for c in CONFIG_BOMBS], ids=[c[0] for c in CONFIG_BOMBS]
)
def test_config_bombs_are_refused_fast(tmp_path, content, fragments):
    path = tmp_path / "bomb.yml"
    path.write_text(content)
    wanted = [f.replace("{path}", str(path)) for f in fragments]
    _refused_fast(lambda: cfg.read_config(str(path)), *wanted)
    _refused_fast(lambda: cfg.load_merged([str(path)], ["a=1"]), *wanted)


# The limits are limits, not bans: what is just within them still loads.
WITHIN_LIMITS = [
    ("nested-to-the-limit", "a: " + "[" * (DEPTH - 1) + "]" * (DEPTH - 1) + "\n"),
    ("aliases-used-sanely", "base: &b {lr: 0.1, betas: [0.9, 0.95]}\nx: *b\ny: {<<: *b, lr: 1}\n"),
    ("laughs-below-the-limit", _laughs(5)),  # 9**6 = 531,441 strings
    ("long-int-within-limit", "a: " + "1" * cfg.MAX_INT_CHARS + "\n"),
]  # fmt: skip


@pytest.mark.parametrize(
    "content", [c[1] for c in WITHIN_LIMITS], ids=[c[0] for c in WITHIN_LIMITS]
)
def test_configs_within_the_limits_load(tmp_path, content):
    path = tmp_path / "ok.yml"
    path.write_text(content)
    assert cfg.load_merged([str(path)], [])


def _fifo(tmp_path: Path) -> str:
    os.mkfifo(tmp_path / "pipe.yml")
    return str(tmp_path / "pipe.yml")


def _dev_zero(tmp_path: Path) -> str:
    (tmp_path / "zero.yml").symlink_to("/dev/zero")
    return str(tmp_path / "zero.yml")


def _sparse(size: int) -> Callable[[Path], str]:
    def make(tmp_path: Path) -> str:
        with open(tmp_path / "huge.yml", "wb") as file:
            file.truncate(size)  # sparse: no disk used, st_size says it all
        return str(tmp_path / "huge.yml")

    return make


def _sized(size: int) -> Callable[[Path], str]:
    def make(tmp_path: Path) -> str:
        (tmp_path / "c.yml").write_text("a: " + "x" * (size - 4) + "\n")
        return str(tmp_path / "c.yml")

    return make


# (case id, makes the file, max_bytes given to the loader, fragments; "{path}" is the file)
NOT_CONFIG_FILES = [
    ("fifo", _fifo, None, ["{path}", "a FIFO", "not a regular file", ".yml file"]),
    ("dev-zero", _dev_zero, None, ["{path}", "a character device", "not a regular file"]),
    ("dev-null", lambda _: "/dev/null", None, ["/dev/null", "a character device"]),
    ("over-default-limit", _sparse(MAX_CONFIG_BYTES + 1), None, ["{path}", f"{MAX_CONFIG_BYTES:,}-byte limit", "--max-config-bytes"]),
    ("over-given-limit", _sized(101), 100, ["{path}", "100-byte limit", "(101 bytes)", "--max-config-bytes N"]),
    ("terabyte-sparse", _sparse(1 << 40), None, ["{path}", "1,099,511,627,776 bytes"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("make", "max_bytes", "fragments"),
    [c[1:] for c in NOT_CONFIG_FILES],
    ids=[c[0] for c in NOT_CONFIG_FILES],
)
def test_only_bounded_regular_files_are_read(tmp_path, make, max_bytes, fragments):
    path = make(tmp_path)
    wanted = [f.replace("{path}", path) for f in fragments]
    _refused_fast(lambda: cfg.read_config(path, max_bytes), *wanted)
    _refused_fast(lambda: cfg.load_merged([path], [], max_bytes=max_bytes), *wanted)


def test_the_size_limit_is_inclusive_and_can_be_raised(tmp_path):
    path = _sized(100)(tmp_path)
    assert cfg.read_config(path, 100) == {"a": "x" * 96}
    with cfg.size_limit(99):  # what config parsers read inside decide
        _refused_fast(lambda: cfg.load_merged([path], []), "99-byte limit")
        assert cfg.load_merged([path], [], max_bytes=100) == {"a": "x" * 96}
    assert cfg.load_merged([path], []) == {"a": "x" * 96}  # the default is back


# (case id, --set text, fragments of the one line)
OVERRIDE_BOMBS = [
    ("laughs-value", "x=" + _laughs().replace("\n", ", ").join("{}"), ["--set", "aliases expand", "chars)"]),
    ("recursive-value", "x=&a [1, *a]", ["--set 'x=&a [1, *a]'", "contain itself"]),
    ("deep-value", "x=" + "[" * 10_000 + "]" * 10_000, ["--set", f"nested more than {DEPTH - 1} levels", "1-part key path"]),
    ("deep-value-and-path", "a.b.c=" + "[" * (DEPTH - 2) + "]" * (DEPTH - 2), ["3-part key path", f"at most {DEPTH} levels"]),
    ("long-key-path", ".".join(["k"] * (DEPTH + 1)) + "=1", ["--set", f"more than {DEPTH} parts"]),
    ("huge-int-value", "x=" + "9" * 5000, ["--set", "integer 5,000 characters"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "fragments"), [c[1:] for c in OVERRIDE_BOMBS], ids=[c[0] for c in OVERRIDE_BOMBS]
)
def test_override_bombs_are_refused_fast(text, fragments):
    _refused_fast(lambda: cfg.load_merged((), [text]), *fragments)


def test_an_override_at_the_depth_limit_still_applies():
    path = ".".join(["k"] * (DEPTH - 1))
    merged = cfg.load_merged((), [f"{path}=[1]"])
    for _ in range(DEPTH - 1):
        merged = merged["k"]
    assert merged == [1]


# --- option values ------------------------------------------------------------------------------

NUMERIC = [o for o in OPTIONS if o.kind in (int, float)]
# (option, values refused): nan, inf, -inf, 0, negative, huge, for every numeric option
BAD_NUMBERS = {
    "grace": [math.nan, math.inf, -math.inf, -1.0, -1e-9, 86400.5, 1e300],
    "hang_warning": [math.nan, math.inf, -math.inf, 0.0, -5.0, 1e10, 1e300],
    "rdzv_timeout": [math.nan, math.inf, -math.inf, 0.0, -5.0, 1e7, 1e300],
    "heartbeat_timeout": [math.nan, math.inf, -math.inf, 0.0, 1.5, -5.0, 86401.0, 1e300],
    "max_restarts": [-1, 10001, 10**30, 10**5000],
    "max_infra_restarts": [-1, 10001, 10**30, 10**5000],
    "master_port": [0, -1, 65536, 10**30],
    "nnodes": [0, -1, 10**7, 10**30],
    "node_rank": [-1, 10**6, 10**30],
    "max_config_bytes": [0, -1, (1 << 30) + 1, 10**30],
    "hang_timeout": [math.nan, math.inf, -math.inf, -1.0, 365 * 86400.0 + 1, 1e300],
    "spares": [-1, 1_000_001, 10**30],
    "min_nodes": [-1, 1_000_001, 10**30],
    "health_timeout": [math.nan, math.inf, -math.inf, 0.0, -1.0, 86401.0, 1e300],
    "straggler_factor": [math.nan, math.inf, -math.inf, 1.0, 0.5, -2.0, 1000.5, 1e300],
    "min_free_mib": [-1, (1 << 40) + 1, 10**30],
    "metrics_port": [-1, 65536, 10**30],
    "debug_timeout": [math.nan, math.inf, -math.inf, 0.0, -1.0, 365 * 86400.0 + 1, 1e300],
}
GOOD_NUMBERS = {
    "grace": [0, 0.0, 5, 86400.0],
    "hang_warning": [0.001, 300, 365 * 86400.0],
    "rdzv_timeout": [0.1, 300, 7 * 86400.0],
    "heartbeat_timeout": [2, 6.0, 86400.0],
    "max_restarts": [0, 3, 10000],
    "max_infra_restarts": [0, 3, 10000],
    "master_port": [1, 29500, 65535],
    "nnodes": [1, 1000],
    "node_rank": [0, 999],
    "max_config_bytes": [1, 4096, 1 << 30],
    "hang_timeout": [0, 5, 600.0, 365 * 86400.0],
    "spares": [0, 1, 1_000_000],
    "min_nodes": [0, 2, 1_000_000],
    "health_timeout": [0.001, 60, 86400.0],
    "straggler_factor": [1.01, 1.5, 2, 1000.0],
    "min_free_mib": [0, 64, 1 << 40],
    "metrics_port": [0, 9400, 65535],
    "debug_timeout": [0.001, 600, 365 * 86400.0],
}


def test_every_numeric_option_has_a_range():
    assert {o.name for o in NUMERIC} == set(BAD_NUMBERS) == set(GOOD_NUMBERS)
    for option in NUMERIC:
        assert option.low is not None and option.high is not None, option.name
        assert option.low <= option.default <= option.high if option.default is not None else True


def _id(value: float) -> str:
    return f"2**{value.bit_length()}" if isinstance(value, int) and value > 10**100 else repr(value)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@pytest.mark.parametrize(
    ("name", "value"),
    [(name, value) for name, values in BAD_NUMBERS.items() for value in values],
    ids=[f"{name}={_id(value)}" for name, values in BAD_NUMBERS.items() for value in values],
)
def test_numeric_option_out_of_range_is_one_line(name, value):
    option = next(o for o in OPTIONS if o.name == name)
    bounds = option.range_text()
    _refused_fast(lambda: resolve({name: value}, {}), f"{_flag(name)} ", ": expected", bounds)
    if option.in_config:
        _refused_fast(
            lambda: resolve({}, {name: value}, "c.yml"),
            f"launcher key {name} in c.yml: expected",
            bounds,
            ", got ",
        )
    # a float option given an int too big for a float: no OverflowError
    if option.kind is float:
        _refused_fast(lambda: resolve({name: 10**400}, {}), "about 401 digits: expected", bounds)


@pytest.mark.parametrize(
    ("name", "value"),
    [(name, value) for name, values in GOOD_NUMBERS.items() for value in values],
    ids=[f"{name}={value!r}" for name, values in GOOD_NUMBERS.items() for value in values],
)
def test_numeric_option_in_range_is_kept(name, value):
    assert getattr(resolve({name: value}, {}), name) == value


# (command-line text, what the one line says): through argparse, as a user types them
CLI_NUMBERS = [
    (["--grace", "nan"], ["--grace nan: expected a number of seconds from 0 to 86400"]),
    (["--grace", "1e400"], ["--grace inf: expected"]),
    (["--grace=-inf"], ["--grace -inf: expected"]),
    (["--heartbeat-timeout", "0"], ["--heartbeat-timeout 0: expected", "from 2 to 86400"]),
    (["--rdzv-timeout", "0"], ["--rdzv-timeout", "more than 0, at most 604800"]),
    (["--hang-warning", "0"], ["--hang-warning", "more than 0"]),
    (["--max-restarts", "99999999999999999999"], ["--max-restarts", "from 0 to 10000"]),
    (["--master-port", "70000"], ["--master-port", "from 1 to 65535"]),
    (["--max-config-bytes", "0"], ["--max-config-bytes", "a number of bytes from 1 to 1073741824"]),
    (["--nproc-per-node", "0"], ["--nproc-per-node", "1 to 4096 ranks per node"]),
    (["--nproc-per-node", "4097"], ["--nproc-per-node 4097: expected 1 to 4096"]),
    (["--nproc-per-node", "9" * 5000], ["--nproc-per-node", "digits"]),
    (["--nproc-per-node", "²"], ["--nproc-per-node", "expected a number of ranks"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "fragments"), CLI_NUMBERS, ids=[" ".join(c[0])[:40] for c in CLI_NUMBERS]
)
def test_command_line_numbers_are_checked(argv, fragments):
    command = parse([*argv, "train.py"])
    _refused_fast(lambda: resolve(command.options, {}), *fragments)


def test_max_config_bytes_is_a_flag_and_not_a_launcher_key():
    command = parse(["--max-config-bytes", "1000", "train.py"])
    assert resolve(command.options, {}).max_config_bytes == 1000
    assert Options().max_config_bytes == MAX_CONFIG_BYTES == 16 * 1024 * 1024
    _refused_fast(
        lambda: resolve({}, {"max_config_bytes": 1000}, "c.yml"),
        "launcher key 'max_config_bytes' in c.yml cannot come from a config",
        "--max-config-bytes",
    )


# --- rank lists ---------------------------------------------------------------------------------

# (text, ranges it stands for, ranks in it, ranks not in it)
RANK_SETS = [
    ("0", ((0, 0),), [0], [1, -1]),
    ("0,3-5", ((0, 0), (3, 5)), [0, 3, 4, 5], [1, 2, 6]),
    (" 5 , 1 - 2 ", ((1, 2), (5, 5)), [1, 2, 5], [0, 3, 4, 6]),
    ("3-5,4-8,10,9", ((3, 10),), [3, 8, 9, 10], [2, 11]),
    ("0-9999999999", ((0, 9_999_999_999),), [0, 123_456_789, 9_999_999_999], [10**10, -1]),
    ("7-7", ((7, 7),), [7], [6, 8]),
    (",".join(str(r) for r in range(0, 2 * MAX_RANK_PARTS, 2)), None, [0, 19998], [1, 20000]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "ranges", "inside", "outside"), RANK_SETS, ids=[c[0][:20] for c in RANK_SETS]
)
def test_rank_sets_are_ranges(text, ranges, inside, outside):
    ranks = parse_rank_set(text, "--console-ranks")
    assert isinstance(ranks, RankSet)
    if ranges is not None:
        assert ranks.ranges == ranges
    assert all(rank in ranks for rank in inside)
    assert not any(rank in ranks for rank in outside)
    assert None not in ranks and "1" not in ranks


def test_a_huge_range_costs_nothing():
    started = time.monotonic()
    ranks = parse_rank_set("0-9999999999,20000000000-29999999999", "--console-ranks")
    assert ranks is not None and len(ranks) == 2 * 10**10 and 25 * 10**9 in ranks
    assert hash(ranks) == hash(parse_rank_set("0-9999999999,20000000000-29999999999", "x"))
    assert ranks != frozenset({0})
    # Enumerating 2·10^10 ranks would take hours and all memory; the bench measures ~0.1 ms.
    assert time.monotonic() - started < 10


def test_rank_sets_equal_frozensets_as_before():
    ranks = parse_rank_set("1,3-4", "--rank")
    assert ranks == frozenset({1, 3, 4}) and frozenset({1, 3, 4}) == ranks
    assert ranks != frozenset({1, 3}) and ranks != frozenset({1, 3, 4, 5})
    assert hash(ranks) == hash(frozenset({1, 3, 4}))
    assert sorted(ranks) == [1, 3, 4] and len(ranks) == 3
    assert parse_rank_set("none", "--rank") == frozenset() and not parse_rank_set("none", "x")
    assert parse_rank_set("all", "--rank") is None and parse_rank_set(None, "--rank") is None
    with pytest.raises(AttributeError):
        ranks._lows = ()  # type: ignore[misc]


# (text, fragments of the one line)
BAD_RANK_SETS = [
    ("-1", ["'-1'", "ranks are 0 or more"]),
    ("0,-3", ["'-3'", "ranks are 0 or more"]),
    ("5-3", ["'5-3'", "range 5-3 is reversed", "write 3-5"]),
    ("1-x", ["'1-x'", "expected ranks like 0,3-5"]),
    ("3-", ["'3-'", "not a rank or a range"]),
    ("1,,2", ["not a rank or a range"]),
    ("", ["not a rank or a range"]),
    ("1" * 19, ["not a rank or a range"]),
    ("+1", ["not a rank or a range"]),
    ("٣", ["not a rank or a range"]),
    (",".join(["1"] * (MAX_RANK_PARTS + 1)), ["more than 10,000 comma-separated parts", "chars)"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "fragments"), BAD_RANK_SETS, ids=[c[0][:20] or "empty" for c in BAD_RANK_SETS]
)
def test_bad_rank_sets_are_one_line(text, fragments):
    _refused_fast(lambda: parse_rank_set(text, "--console-ranks"), "--console-ranks", *fragments)
    _refused_fast(lambda: resolve({"console_ranks": text}, {}), "--console-ranks", *fragments)


BAD_PROGRESS = [
    (r"(a)\1", ["invalid escape sequence", "backreferences and lookaround are not supported"]),
    ("(?=x)", ["invalid perl operator: (?="]),
    ("(?<=x)y", ["invalid perl operator: (?<="]),
    ("a++", ["bad repetition operator"]),
    ("(", ["missing )"]),
]  # fmt: skip


@pytest.mark.parametrize(("text", "fragments"), BAD_PROGRESS, ids=[c[0] for c in BAD_PROGRESS])
def test_progress_regex_outside_re2_is_one_line(text, fragments):
    _refused_fast(lambda: progress_pattern(text), "--progress-regex", "RE2", *fragments)
    _refused_fast(lambda: resolve({"progress_regex": text}, {}), "--progress-regex", *fragments)


def test_progress_regex_runs_in_linear_time_line_by_line():
    """The catastrophic case for a backtracking engine is a miss like any other; `^`/`$` are a
    line's ends within the chunk a rank wrote."""
    pattern = progress_pattern("(a+)+$")
    assert pattern.search(b"a" * 40 + b"b") is None  # 2^40 steps in Python's re
    assert pattern.search(b"a" * (1 << 20) + b"b\n" * 1000) is None  # a whole 1 MiB read
    assert pattern.search(b"x\naaa\ny") is not None
    assert progress_pattern(r"^iter \d+$").search(b"loss 3\niter 12\nloss 2\n") is not None


# --- end to end: python -m agent -----------------------------------------------------------------


def _cli_cases(tmp_path: Path) -> list[tuple[str, list[str], str]]:
    bomb = tmp_path / "bomb.yml"
    bomb.write_text(_laughs())
    deep = tmp_path / "deep.yml"
    deep.write_text("a: " + "[" * 10_000 + "]" * 10_000 + "\n")
    big = tmp_path / "big.yml"
    big.write_text("a: 1\n" * 100)
    return [
        ("fifo", [_fifo(tmp_path)], "a FIFO"),
        ("dev-zero", [_dev_zero(tmp_path)], "a character device"),
        ("alias bomb", [str(bomb)], "aliases expand"),
        ("deep nesting", [str(deep)], f"more than {DEPTH} levels"),
        ("grace nan", ["--grace", "nan"], "--grace nan: expected"),
        ("heartbeat 0", ["--heartbeat-timeout", "0"], "--heartbeat-timeout 0: expected"),
        ("reversed ranks", ["--console-ranks", "5-3"], "range 5-3 is reversed"),
        ("lookahead", ["--progress-regex", "(?=x)"], "not a regular expression RE2 accepts"),
    ]


def _memory_bound() -> None:
    limit = 1 << 30  # 1 GiB of address space: plenty for a one-node agent, fatal to a bomb
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@pytest.mark.e2e
def test_hostile_input_on_the_command_line_is_one_line_exit_2(tmp_path):
    ready = tmp_path / "ready"
    ready.mkdir()
    for name, args, expected in _cli_cases(tmp_path):
        flags = [a for a in args if not a.endswith(".yml")]
        configs = [a for a in args if a.endswith(".yml")]
        argv = ["--log-dir", str(tmp_path / "logs"), *flags, FIXTURE, *configs]
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "agent", *argv, "--ready-to", str(ready)],
            env=base_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=30,
            cwd=tmp_path,
            preexec_fn=_memory_bound,  # a bomb that got through would die of MemoryError here
        )
        assert time.monotonic() - start < 10, f"{name}: took {time.monotonic() - start:.1f}s"
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, f"{name}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
        assert len(lines) == 1 and lines[0].startswith("agent: error: "), f"{name}: {lines[:5]}"
        assert expected in lines[0], f"{name}: {expected!r} not in {lines[0]!r}"
        assert not list(ready.iterdir()), f"{name}: a rank started"
        assert not (tmp_path / "logs").exists(), f"{name}: left a log dir behind"


def test_every_default_is_the_option_tables():
    """One source for defaults: the table (OPTIONS) that also drives the flags and their help."""
    from dataclasses import asdict

    assert asdict(Options()) == {o.name: o.default for o in OPTIONS}
