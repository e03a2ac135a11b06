"""Which rank commands can be forked from a zygote, and which environments a zygote may serve.

Pure apart from resolving the interpreter's path: no torch, no processes.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agent.world.others import MPI_LOCAL_SIZE


@dataclass(frozen=True)
class WarmCommand:
    kind: str  # "script" | "module"
    target: str  # script path as given, or module name
    args: tuple[str, ...]  # sys.argv[1:] for the rank


def _same_interpreter(program: str, python: str) -> bool:
    """The same binary started from the same directory: a venv's bin/python is a symlink to the
    base interpreter, so the realpath alone would equate them, yet CPython finds pyvenv.cfg next
    to the path it was started as, and the venv's site-packages differ. A relative path with a
    slash would resolve against the rank's cwd, unknown here: not taken."""
    if os.sep in program and not os.path.isabs(program):
        return False
    found = program if os.path.isabs(program) else shutil.which(program)
    if not found:
        return False
    mine, theirs = os.path.abspath(python), os.path.abspath(found)
    same_dir = os.path.dirname(mine) == os.path.dirname(theirs)
    return same_dir and os.path.realpath(mine) == os.path.realpath(theirs)


def _module_name(name: str) -> bool:
    return bool(name) and all(part.isidentifier() for part in name.split("."))


def warm_command(argv: Sequence[str], python: str) -> WarmCommand | None:
    """What a rank command runs, when it is exactly `python SCRIPT ARGS` or `python -m MOD ARGS`
    with the zygote's interpreter; None for anything else (interpreter flags change sys.flags,
    which a forked interpreter cannot take on, so they go to a fresh interpreter)."""
    if len(argv) < 2 or not _same_interpreter(argv[0], python):
        return None
    first, rest = argv[1], tuple(argv[2:])
    if first.startswith("-m"):  # "-m mod" or "-mmod"
        name, rest = (first[2:], rest) if len(first) > 2 else ((rest or ("",))[0], rest[1:])
        return WarmCommand("module", name, rest) if _module_name(name) else None
    if not first or first.startswith("-"):  # "-" is stdin; every other flag is an option
        return None
    if first.endswith((".pyc", ".pyo")):  # compiled scripts: left to a fresh interpreter
        return None
    return WarmCommand("script", first, rest)


# What the environment decides before the rank's own code runs: read when the zygote's
# interpreter started or when the preload list was imported, so a forked rank keeps the zygote's
# values. Found by logging every getenv() (an LD_PRELOAD shim) and every os.environ read while
# `import torch` / `import numpy` ran (torch 2.15, numpy 2.4), plus what the interpreter and
# glibc read at start. An entry ending in "*" is a prefix.
IMPORT_SENSITIVE: tuple[str, ...] = (
    # glibc: the dynamic loader and malloc read these at process start; dlopen keeps the
    # LD_LIBRARY_PATH of exec time, so even libraries loaded later in the rank would differ.
    "LD_*",
    "GLIBC_TUNABLES",
    "GLIBCXX_TUNABLES",
    "MALLOC_*",
    # CPython at start: sys.path (PYTHONPATH, PYTHONHOME, user site), hash seed, warnings,
    # sys.flags, stdio encoding (PYTHONIOENCODING, the locale), sysconfig; HOME names the user
    # site and torch reads it at import; the time module reads TZ at import.
    "PYTHON*",
    "_PYTHON*",
    "HOME",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    # OpenMP runtimes (libgomp, Intel's) read their settings once, when loaded with torch;
    # OMP_NUM_THREADS is the exception the rank re-applies (see REAPPLIED).
    "OMP_*",
    "GOMP_*",
    "KMP_*",
    "ACC_DEVICE_*",
    # MKL, oneDNN and the MPI hints MKL sizes its threads by; OpenBLAS (numpy's) and the Fortran
    # runtime it loads; numpy's CPU dispatch and allocator switches.
    "MKL_*",
    "MKLDNN_*",
    "DNNL_*",
    "ONEDNN_*",
    "I_MPI_*",
    "MPI_LOCALNRANKS",
    MPI_LOCAL_SIZE,
    "INTEL_LIBITTNOTIFY*",
    "OPENBLAS_*",
    "GOTO_*",
    "GFORTRAN_*",
    "NPY_*",
    "NUMPY_*",
    "OPENSSL_*",
    # torch: C++ logging and stack traces, the allocator configs (parsed at load), logging
    # (TORCH_LOGS*), dynamo/inductor/export configs and backend autoload (module-level reads),
    # the NVIDIA libraries' static initialisers. CUDA_MODULE_LOADING is read by cuInit, which only
    # ever runs in a rank, but torch writes a default for it: kept on the safe side.
    "TORCH_*",
    "TORCHDYNAMO_*",
    "TORCHINDUCTOR_*",
    "TORCHEXPORT_*",
    "PYTORCH_*",
    "FX_*",
    "COMPILE_STROBELIGHT_*",
    "KINETO_*",
    "CUDA_MODULE_LOADING",
    "CUDA_PREFER_SPINLOCKS_ON_HOST",
    "CUBLAS*",
    "NVRTC_*",
    "LIBNVVM_*",
    "NV_NVVM_VERSION",
    "LLVM_*",
)

# Matched by the prefixes above, yet read only after the rank started, or re-applied by it:
# the thread count (torch.set_num_threads, OpenBLAS), stdio buffering (sys.stdout is rebuilt),
# and what torch reads when a NCCL process group is made (the agent sets them per attempt).
# PYTHONBREAKPOINT: sys.breakpointhook reads it at each breakpoint(), never at start.
REAPPLIED: tuple[str, ...] = (
    "OMP_NUM_THREADS",
    "PYTHONUNBUFFERED",
    "PYTHONBREAKPOINT",
    "TORCH_NCCL_*",
    "TORCH_FR_*",
)


class _Patterns:
    """Names and NAME* prefixes, matched in C (str.startswith with a tuple): the fingerprint is
    taken for each rank's environment on the way to its fork."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.names = frozenset(p for p in patterns if not p.endswith("*"))
        self.prefixes = tuple(p[:-1] for p in patterns if p.endswith("*"))

    def match(self, name: str) -> bool:
        return name in self.names or name.startswith(self.prefixes)


_SENSITIVE, _REAPPLIED = _Patterns(IMPORT_SENSITIVE), _Patterns(REAPPLIED)


def import_fingerprint(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The sorted (name, value) pairs of `env` that preloaded libraries have already read."""
    return tuple(
        sorted(
            (name, value)
            for name, value in env.items()
            if _SENSITIVE.match(name) and not _REAPPLIED.match(name)
        )
    )
