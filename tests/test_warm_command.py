"""Which rank commands and environments a zygote can serve (pure tables)."""

from __future__ import annotations

import os
import sys

import pytest

from agent.warm.command import WarmCommand, import_fingerprint, warm_command

PY = sys.executable


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([PY, "train.py"], WarmCommand("script", "train.py", ())),
        (
            [PY, "a/train.py", "--lr", "1", "-m", "x"],
            WarmCommand("script", "a/train.py", ("--lr", "1", "-m", "x")),
        ),
        ([PY, "-m", "pkg.mod", "--x", "-u"], WarmCommand("module", "pkg.mod", ("--x", "-u"))),
        ([PY, "-mpkg.mod", "a"], WarmCommand("module", "pkg.mod", ("a",))),
        (
            [os.path.join(os.path.dirname(PY), ".", os.path.basename(PY)), "t.py"],
            WarmCommand("script", "t.py", ()),
        ),
        ([PY], None),  # an interactive interpreter
        ([PY, "-u", "train.py"], None),  # interpreter flags change sys.flags
        ([PY, "-X", "dev", "train.py"], None),
        ([PY, "-O", "train.py"], None),
        ([PY, "-c", "print(1)"], None),
        ([PY, "-"], None),  # stdin
        ([PY, "--", "train.py"], None),
        ([PY, "train.pyc"], None),
        ([PY, ""], None),
        ([PY, "-m"], None),
        ([PY, "-m", "-x"], None),
        ([PY, "-m", "pkg..mod"], None),
        (["/bin/sh", "train.py"], None),  # not python at all
        (["torchrun", "train.py"], None),
        (["no-such-python-anywhere", "train.py"], None),
        (["./bin/python", "train.py"], None),  # relative to the rank's cwd, unknown here
    ],
)
def test_warm_command(argv, expected):
    assert warm_command(argv, PY) == expected


def test_same_binary_elsewhere_is_another_interpreter(tmp_path):
    """A venv's bin/python links to the base interpreter, yet its site-packages differ: the
    directory it is started from counts, not only the binary."""
    link = tmp_path / "python"
    link.symlink_to(os.path.realpath(PY))
    assert os.path.realpath(link) == os.path.realpath(PY)
    assert warm_command([str(link), "train.py"], PY) is None
    assert warm_command([str(link), "train.py"], str(link)) == WarmCommand("script", "train.py", ())


BASE = {"PATH": "/bin", "HOME": "/root", "LD_LIBRARY_PATH": "/opt/lib", "OMP_PROC_BIND": "close"}


@pytest.mark.parametrize(
    ("change", "fits"),
    [
        ({}, True),
        ({"OMP_NUM_THREADS": "4"}, True),  # re-applied in each rank
        ({"PYTHONUNBUFFERED": "1"}, True),  # sys.stdout is rebuilt in each rank
        ({"RANK": "3", "LOCAL_RANK": "1", "MASTER_PORT": "29500"}, True),
        ({"CUDA_VISIBLE_DEVICES": "1", "NCCL_DEBUG": "INFO"}, True),  # read at CUDA/NCCL init
        ({"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_BUFFER_SIZE": "2000"}, True),
        ({"TORCHELASTIC_RESTART_COUNT": "2", "PATH": "/usr/bin"}, True),
        ({"LD_PRELOAD": "/lib/libx.so"}, False),
        ({"LD_LIBRARY_PATH": "/other"}, False),
        ({"TORCH_CPP_LOG_LEVEL": "INFO"}, False),
        ({"TORCH_LOGS": "+dynamo"}, False),
        ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, False),
        ({"PYTHONPATH": "/src"}, False),
        ({"PYTHONHASHSEED": "0"}, False),
        ({"OMP_PROC_BIND": "spread"}, False),
        ({"MKL_NUM_THREADS": "2"}, False),
        ({"OPENBLAS_NUM_THREADS": "2"}, False),
        ({"KMP_AFFINITY": "compact"}, False),
        ({"LC_ALL": "C"}, False),
        ({"HOME": "/home/other"}, False),
    ],
)
def test_fingerprint(change, fits):
    assert (import_fingerprint({**BASE, **change}) == import_fingerprint(BASE)) is fits


def test_fingerprint_is_sorted_pairs_of_what_imports_read():
    env = {
        "TZ": "UTC",
        "LD_PRELOAD": "a.so",
        "RANK": "0",
        "OMP_NUM_THREADS": "2",
        "GOMP_SPINCOUNT": "0",
    }
    assert import_fingerprint(env) == (
        ("GOMP_SPINCOUNT", "0"),
        ("LD_PRELOAD", "a.so"),
        ("TZ", "UTC"),
    )
