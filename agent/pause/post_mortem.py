"""`--pdb`: each rank runs `python -m agent.pause.post_mortem SCRIPT ARGS` (or `-m MOD ARGS`),
which runs the script as `python SCRIPT ARGS` would (as `python -m pdb` does) and, when it raises,
pauses the rank in pdb at the frame that raised (`hook.post_mortem`) before it fails as it would
have: the same traceback on stderr, exit status 1."""

from __future__ import annotations

import os
import runpy
import sys

from agent.pause.hook import TIMEOUT_ENV, post_mortem

MODULE = "agent.pause.post_mortem"
DEFAULT_TIMEOUT = 600.0


def main(argv: list[str]) -> None:
    if not argv or argv[0] == "-m" and len(argv) < 2:
        print(f"usage: python -m {MODULE} SCRIPT [ARGS] | -m MODULE [ARGS]", file=sys.stderr)
        raise SystemExit(2)
    module = argv[0] == "-m"
    target = argv[1] if module else argv[0]
    sys.argv = argv[1:] if module else list(argv)
    if not module and not getattr(sys.flags, "safe_path", False):
        sys.path[0] = os.path.dirname(os.path.realpath(target))  # not the cwd `-m` put there
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        post_mortem(exc, _timeout())
        raise


def _timeout() -> float:
    try:
        return float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT))
    except ValueError:
        return DEFAULT_TIMEOUT


if __name__ == "__main__":
    main(sys.argv[1:])
