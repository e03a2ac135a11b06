"""Run the rank's script or module as CPython's main does (Modules/main.c, pythonrun.c), in the
forked child; the interpreter's own finalisation then ends the process (see zygote_main)."""

from __future__ import annotations

import _io  # the C bases: isinstance on io's ABCs is a Python call per object
import atexit
import builtins
import ctypes
import gc
import itertools
import os
import runpy
import signal
import sys
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib.machinery import EXTENSION_SUFFIXES, BuiltinImporter, SourceFileLoader
from types import ModuleType
from typing import Any, NoReturn


def run(request: Mapping[str, Any], keep: frozenset[str]) -> tuple[int, bool]:
    """(exit code, ended by an uncaught KeyboardInterrupt) once the user's code is done."""
    kind, target, args = request["form"], request["target"], list(request["args"])
    sys.orig_argv = list(request["argv"])
    main = _fresh_main()
    runner: Callable[[], object]
    if kind == "module":
        sys.argv = ["-m", *args]  # runpy puts the module's path there once it is found
        _add_path0(os.getcwd())
        runner = lambda: _runpy_main(target, alter_argv=True)  # noqa: E731
    else:
        sys.argv = [target, *args]
        filename = os.path.join(os.getcwd(), target)  # CPython 3.9+: __file__ is absolute
        if _is_importer(filename):  # a directory or zip with __main__.py
            sys.path.insert(0, filename)
            runner = lambda: _runpy_main("__main__", alter_argv=False)  # noqa: E731
        else:
            try:
                with open(filename, "rb") as file:
                    source = file.read()
            except OSError as exc:
                program = request["argv"][0]
                print(
                    f"{program}: can't open file {filename!r}: [Errno {exc.errno}] {exc.strerror}",
                    file=sys.stderr,
                )
                return 2, False
            _add_path0(os.path.dirname(os.path.realpath(filename)))
            main.__file__ = filename
            main.__cached__ = None  # type: ignore[attr-defined]  # a module's own dunder
            main.__loader__ = SourceFileLoader("__main__", filename)
            # dont_inherit: this module's `from __future__` flags must not reach user code.
            code = compile(source, filename, "exec", dont_inherit=True)
            runner = lambda: exec(code, main.__dict__)  # noqa: E731, S102
    _forget_modules(keep)
    sys.modules["__main__"] = main
    if kind == "module":
        sys.modules["runpy"] = runpy  # `python -m` imports runpy before the module runs
    return _call(runner)


def _runpy_main(module: str, alter_argv: bool) -> object:
    """What `python -m` calls (private to runpy, stable since 3.4): the module runs as __main__
    with the interpreter's own errors."""
    return runpy._run_module_as_main(module, alter_argv=alter_argv)  # type: ignore[attr-defined]


def _fresh_main() -> ModuleType:
    """__main__ as the interpreter creates it at start (pylifecycle.c add_main_module)."""
    main = ModuleType("__main__")
    main.__annotations__ = {}
    main.__builtins__ = builtins  # type: ignore[attr-defined]  # a module's own dunder
    main.__loader__ = BuiltinImporter
    return main


def _add_path0(path: str) -> None:
    if not getattr(sys.flags, "safe_path", False):  # -P / PYTHONSAFEPATH (3.11+)
        sys.path.insert(0, path)


def _is_importer(path: str) -> bool:
    """What CPython asks to decide whether the script argument is a directory or zip to run."""
    for hook in sys.path_hooks:
        try:
            hook(path)
        except ImportError:
            continue
        return True
    return False


def _forget_modules(keep: frozenset[str]) -> None:
    """Modules the zygote imported for itself (ours, json, selectors...) and this child imported
    for the binding leave sys.modules: the user's `import agent` or `import numa` must find their
    own. Extension modules stay, as re-initialising one in-process is not always supported.
    What leaves is kept alive here: freeing it would write to (and so copy) the pages of every
    object it held, 10-20 ms of a rank's start; so is the zygote's cache of path finders."""
    names = _frozen.own_modules
    if len(sys.modules) != _frozen.module_count:  # the binding imported some: list them all
        names = tuple(name for name in sys.modules if name not in keep)
    for name in names:
        module = sys.modules.get(name)
        origin = getattr(getattr(module, "__spec__", None), "origin", None) or ""
        if name not in sys.builtin_module_names and not origin.endswith(tuple(EXTENSION_SUFFIXES)):
            _left_behind.append(sys.modules.pop(name, None))
    # Finders the zygote cached (its own dirs among them) are forgotten too.
    _left_behind.append(sys.path_importer_cache)
    sys.path_importer_cache = {}


_left_behind: list[Any] = []  # what a rank forgot, never freed (see _forget_modules)


def _call(runner: Callable[[], object]) -> tuple[int, bool]:
    try:
        runner()
    except SystemExit as exc:
        return _system_exit_code(exc.code), False
    except BaseException as exc:
        _print_uncaught(exc)
        return 1, isinstance(exc, KeyboardInterrupt)
    return 0, False


def _system_exit_code(code: object) -> int:
    """_Py_HandleSystemExit: None is 0, an int is itself, anything else is printed and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF  # what exit(3) keeps of it
    print(code, file=sys.stderr)
    return 1


def _print_uncaught(exc: BaseException) -> None:
    """Through sys.excepthook as CPython does, from the user's first frame (not ours); a -m
    traceback keeps runpy's frames, as CPython's does."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    exc.__traceback__ = tb
    try:
        sys.excepthook(type(exc), exc, tb)
    except BaseException:  # a broken hook: CPython falls back to the default one too
        sys.__excepthook__(type(exc), exc, tb)


def fast_exit(code: int, interrupted: bool) -> NoReturn:
    """What CPython's shutdown does that a script can rely on (non-daemon threads joined, atexit
    handlers, files left open closed — their buffers flushed, a gzip file's trailer written —,
    stdio flushed, 120 if that fails), then _exit: no module teardown, which costs 0.5-1 s with
    torch and a process group loaded. What is lost: other objects' __del__ (CPython does not
    promise to run them at exit either)."""
    threading = sys.modules.get("threading")
    try:
        if threading is not None:
            threading._shutdown()  # joins non-daemon threads, as Py_FinalizeEx does first
        _forgo_torch_deregistration()
        atexit._run_exitfuncs()
    except KeyboardInterrupt:  # CPython too gives up waiting at a second Ctrl-C
        pass
    _close_left_open()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            code = 120
    ctypes.CDLL(None).fflush(None)  # C stdio (extensions' printf), which exit() would flush
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _forgo_torch_deregistration() -> None:
    """torch undoes each operator library's registrations at exit (weakref.finalize, atexit):
    134 calls into the dispatcher with torch 2.13, 0.1-0.2 s of a rank's end when 8 end at
    once on 2 cores, and nothing outside the process that is ending could see the difference.
    Every other exit finaliser (the user's, any library's) still runs."""
    registry = weakref.finalize._registry  # type: ignore[attr-defined]  # stable since 3.4
    if not isinstance(registry, dict):
        return
    for finalizer, info in list(registry.items()):
        func = getattr(info, "func", None)
        where = (getattr(func, "__module__", ""), getattr(func, "__name__", ""))
        if where == ("torch.library", "_del_library"):
            finalizer.atexit = False


@dataclass(frozen=True)
class Frozen:
    """What the zygote knew when it froze, for each rank forked from it."""

    files: tuple[weakref.ref[Any], ...] = ()  # the preload's open files, weakly
    own_modules: tuple[str, ...] = ()  # modules the zygote imported for itself (not preloaded)
    module_count: int = 0  # len(sys.modules) then: more in a rank, and its own are listed anew


def freeze_preloaded(keep: frozenset[str]) -> None:
    """In the zygote, once its preload (`keep`) and its own modules are imported: move every
    object into gc's permanent generation, so that no rank's collection or scan writes to the
    pages it shares with the zygote (with torch, 165k objects: each write a page copied, per
    rank); remember the preload's open files, which a rank closes at its end as it closes its
    own, and the zygote's own modules, which each rank forgets."""
    global _frozen
    # Weak: a reference from here would keep a file open past a full shutdown's module teardown
    # (this module has left sys.modules in a rank, and frozen cycles are never collected).
    files = tuple(map(weakref.ref, _open_files(gc.get_objects())))
    own = tuple(name for name in sys.modules if name not in keep)
    _frozen = Frozen(files, own, len(sys.modules))
    gc.freeze()


_frozen = Frozen()


def _open_files(objects: list[Any]) -> Iterator[Any]:
    """The io objects among `objects`, picked by C loops: a Python loop asking each of torch's
    165k objects isinstance costs ~0.1 s. Types are told apart by id, as a metaclass may make
    them unhashable, and by type(obj), never obj.__class__: a proxy's (torch's deprecated
    names) warns."""
    kinds = list(map(id, map(type, objects)))
    one_of_each = dict(zip(kinds, objects, strict=True))
    io = frozenset(k for k, obj in one_of_each.items() if issubclass(type(obj), _io._IOBase))
    return itertools.compress(objects, map(io.__contains__, kinds))


def _close_left_open() -> None:
    """Close the files the script left open, as their __del__ would in the interpreter's
    teardown: wrappers before what they wrap (text, then compressed and other buffered files,
    then the plain buffers, then raw files), so each close flushes into an open file. stdio is
    flushed by the caller, not closed. Errors are ignored, as __del__'s are. The zygote's
    objects are frozen (freeze_preloaded): gc lists only the rank's own, plus the preload's files
    remembered before the freeze."""
    std = {id(s) for s in (sys.stdin, sys.stdout, sys.stderr) if s is not None}
    std |= {id(getattr(s, "buffer", None)) for s in (sys.stdout, sys.stderr, sys.stdin)}
    found: list[list[Any]] = [[], [], [], []]
    preloaded = (file() for file in _frozen.files)
    for obj in itertools.chain(_open_files(gc.get_objects()), preloaded):
        if obj is None or id(obj) in std:
            continue
        try:
            if obj.closed or obj.fileno() in (0, 1, 2):  # stdio's layers, however wrapped
                continue
        except (OSError, ValueError):  # no descriptor of its own (BytesIO, gzip): not stdio
            pass
        except Exception:  # a half-built object: nothing to flush
            continue
        kind = type(obj)
        if issubclass(kind, _io._TextIOBase):
            found[0].append(obj)
        elif issubclass(kind, _io._BufferedIOBase):
            found[2 if hasattr(obj, "raw") else 1].append(obj)
        else:
            found[3].append(obj)
    for group in found:
        for obj in group:
            try:
                obj.close()
            except Exception:
                pass
