"""In a forked rank: re-apply what preloaded libraries read once, when the zygote imported them.

Runs in the rank after its environment and CPU binding are in place, before user code. Only
touches libraries already in sys.modules (never imports torch or numpy itself).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# numpy's bundled OpenBLAS (scipy-openblas, symbol-prefixed) first, then plain builds.
_OPENBLAS_SETTERS = (
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "openblas_set_num_threads",
)


def thread_count(value: str | None) -> int:
    """A thread count as libgomp and OpenBLAS read it: the leading number of the first level
    ("4,2" → 4); 0 when unset or not a positive number."""
    head = (value or "").strip().split(",")[0].strip()
    return int(head) if head.isdigit() and int(head) > 0 else 0


def _torch_threads(env: Mapping[str, str], moved: bool) -> None:
    """libgomp read OMP_NUM_THREADS and the CPU affinity when torch was imported in the zygote,
    so the rank's own values must be set explicitly (acceptance: get_num_threads() ==
    OMP_NUM_THREADS). Without the variable a fresh rank gets one thread per CPU it may use."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "set_num_threads"):
        return
    wanted = thread_count(env.get("OMP_NUM_THREADS"))
    if not wanted and moved:
        wanted = len(os.sched_getaffinity(0))
    if wanted:
        torch.set_num_threads(wanted)


def _openblas_libraries() -> list[str]:
    """Loaded OpenBLAS builds, found in our own memory map (numpy bundles one under its own name)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/") and ".so" in p)


def openblas_setters() -> tuple[Callable[[int], Any], ...]:
    """Each loaded OpenBLAS's set_num_threads, found once in the zygote: its memory map and the
    libraries are the ranks' too, and reading the map costs each rank ~2 ms."""
    setters = []
    for path in _openblas_libraries():
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)  # already loaded
        except OSError:
            continue
        for name in _OPENBLAS_SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter.argtypes = [ctypes.c_int]
                setters.append(setter)
                break
    return tuple(setters)


def _openblas_threads(env: Mapping[str, str], setters: Sequence[Callable[[int], Any]]) -> None:
    """OpenBLAS sizes its pool when loaded: OPENBLAS_NUM_THREADS, else GOTO_NUM_THREADS, else
    OMP_NUM_THREADS, capped by (or, unset, equal to) the CPUs this process may use. The rank's
    OMP_NUM_THREADS and binding differ from the zygote's, so apply the rank's count."""
    cpus = len(os.sched_getaffinity(0))
    names = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
    wanted = min(next((n for n in (thread_count(env.get(v)) for v in names) if n), cpus), cpus)
    for setter in setters:
        setter(wanted)


def _reseed() -> None:
    """Generators a fresh interpreter seeds from the OS at start, forked with the zygote's state.
    The random module reseeds itself after a fork (os.register_at_fork)."""
    random = sys.modules.get("numpy.random")
    if random is not None:
        random.seed()  # numpy seeds its global RandomState from the OS at import: every rank anew
    torch = sys.modules.get("torch")
    generator = getattr(torch, "default_generator", None)
    if generator is not None:
        # torch's CPU default generator takes a non-deterministic seed when torch is imported.
        # Only the CPU one: CUDA's default generators are created (non-deterministically seeded)
        # on first use in the rank, as CUDA is never initialised in the zygote; torch.seed()
        # would give them all the CPU generator's seed, which a fresh interpreter does not.
        generator.seed()


def reapply(
    env: Mapping[str, str],
    zygote_env: Mapping[str, str],
    zygote_cpus: set[int],
    openblas: Sequence[Callable[[int], Any]] = (),
) -> None:
    """Thread pools, RNG seeds and secrets that a fresh interpreter would have made its own
    (`openblas`: openblas_setters(), as the zygote found them)."""
    moved = os.sched_getaffinity(0) != zygote_cpus or "OMP_NUM_THREADS" in zygote_env
    _torch_threads(env, moved)
    _openblas_threads(env, openblas)
    _reseed()
    process = sys.modules.get("multiprocessing.process")
    if process is not None:
        # Imported in the zygote, multiprocessing drew one authkey there for every rank; a fresh
        # interpreter draws its own (it authenticates Manager and Listener connections).
        process.current_process().authkey = os.urandom(32)
        # The directory it started in: spawn children resolve relative paths against it.
        process.ORIGINAL_DIR = os.path.abspath(os.getcwd())  # type: ignore[attr-defined]
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        # gettempdir() caches TMPDIR: the rank's may differ
        tempfile.tempdir = None  # type: ignore[attr-defined]
    linecache = sys.modules.get("linecache")
    if linecache is not None:
        # Source lines the zygote cached may be stale by now. Replaced, not cleared: freeing the
        # zygote's lines (torch's import warnings cache whole files) costs a rank ~8 ms.
        _replaced.append(linecache.cache)
        linecache.cache = {}  # type: ignore[attr-defined]


_replaced: list[Any] = []  # what reapply replaced, never freed (it is the zygote's memory)
