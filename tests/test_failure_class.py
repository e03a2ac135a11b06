"""Restarts that know a bug from a fault (pure): an attempt's failure classed, and the verdict
over two attempts in a row — as tables."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agent.errors import ExitCode
from agent.node.failure import Failure, Kind
from agent.node.result import Result
from agent.run.failure_class import FailureClass, Frame, classify, signature_of
from agent.run.verdict import Budget, judge

SCRIPT = "/home/u/train.py"


def _traceback(exception: str, line: int, lib: bool = True) -> str:
    frames = [
        '  File "/home/u/train.py", line 120, in <module>',
        "    main()",
        f'  File "/home/u/train.py", line {line}, in main',
        "    step(batch)",
    ]
    if lib:  # the innermost frames are a library's: the user's frame is the one that called it
        frames += [
            '  File "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py", line 9, '
            "in _call_impl",
            "    return forward_call(*args)",
            '  File "/usr/lib/python3.12/json/__init__.py", line 346, in loads',
            "    return _default_decoder.decode(s)",
        ]
    return "\n".join(["Traceback (most recent call last):", *frames, f"{exception}: bad"])


def _rank(seq: int, rank: int = 1, returncode: int = 1, **more) -> Failure:
    how = f"exit code {returncode}" if returncode >= 0 else "killed by SIGSEGV"
    record = {"kind": "rank", "rank": rank, "node_rank": 0, "host": "n0", "how": how}
    return failure({**record, "returncode": returncode, "stderr_tail": [], "seq": seq, **more})


def failure(record: dict) -> Failure:
    """A record as the store carries it, read back as the agent reads it."""
    found = Failure.from_json(record)
    assert found is not None
    return found


def _raised(exception: str, line: int, seq: int = 1, via: str = "traceback") -> Failure:
    text = _traceback(exception, line)
    return _rank(seq, **({"traceback": text} if via == "traceback" else {}),
                 **({"stderr_tail": text.splitlines()[-20:]} if via == "stderr" else {}))  # fmt: skip


OK = Result.from_json({"exits": [{"rank": 0, "state": "succeeded", "returncode": 0}]})
FAILED = Result.from_json({"exits": [{"rank": 1, "state": "failed", "returncode": 1}]})
LOST = Result.from_json({"lost": True, "node": 1, "host": "n1", "exits": []})
LOST_RECORD = failure({"kind": "lost", "node_rank": 1, "host": "n1", "how": "lost: its agent stopped", "seq": 1})  # fmt: skip
SCHEDULER = failure({"kind": "signal", "node_rank": 0, "host": "n0", "how": "agent received SIGTERM",
             "signal": "SIGTERM", "seq": 1})  # fmt: skip
HANG = failure({"kind": "hang", "node_rank": 0, "host": "n0", "how": "hang: no progress for 8 s", "seq": 1})  # fmt: skip
# (results, failures) of one attempt
VALUE_88 = ([OK, FAILED], [_raised("ValueError", 88)])
VALUE_88_STDERR = ([OK, FAILED], [_raised("ValueError", 88, via="stderr")])
VALUE_90 = ([OK, FAILED], [_raised("ValueError", 90)])
KEY_88 = ([OK, FAILED], [_raised("KeyError", 88)])
EXIT_3 = ([OK, FAILED], [_rank(1, returncode=3)])
EXIT_4 = ([OK, FAILED], [_rank(1, returncode=4)])
NODE_LOST = ([OK, LOST], [LOST_RECORD])
STOPPED = ([OK, replace(FAILED, signal=15)], [SCHEDULER])
HUNG = ([OK, OK], [HANG])


@pytest.mark.parametrize(
    ("first", "second", "budget", "restart", "code", "cause"),
    [
        # the same exception at the same user frame twice → stop, exit 5, naming both
        (VALUE_88, VALUE_88, Budget(10), False, ExitCode.NO_PROGRESS,
         "the same failure twice: ValueError at train.py:88; not restarting"),
        # ... whether the traceback came from the error file or only from stderr
        (VALUE_88, VALUE_88_STDERR, Budget(10), False, ExitCode.NO_PROGRESS,
         "the same failure twice: ValueError at train.py:88; not restarting"),
        (VALUE_88, VALUE_88, Budget(10, restart_same_failure=True), True, 1, None),
        (VALUE_88, KEY_88, Budget(10), True, 1, None),  # another exception
        (VALUE_88, VALUE_90, Budget(10), True, 1, None),  # the same one at another line
        # without a traceback: the same exit code from the same script twice → stop
        (EXIT_3, EXIT_3, Budget(10), False, ExitCode.NO_PROGRESS,
         "the same failure twice: exit code 3 from train.py; not restarting"),
        (EXIT_3, EXIT_4, Budget(10), True, 1, None),
        # the budget ends a run before the guard would: its own failure's code, as before
        (VALUE_88, VALUE_88, Budget(1), False, 1, None),
        # a lost node twice: infrastructure, never "the same failure"; its own budget
        (NODE_LOST, NODE_LOST, Budget(0, 2), True, ExitCode.RENDEZVOUS, None),
        (NODE_LOST, NODE_LOST, Budget(10, 1), False, ExitCode.RENDEZVOUS, None),  # used up
        # program failures do not spend the infrastructure budget, nor the reverse
        (VALUE_88, NODE_LOST, Budget(1, 1), True, ExitCode.RENDEZVOUS, None),
        (NODE_LOST, VALUE_88, Budget(1, 1), True, 1, None),
        # hangs are infrastructure (agent.run.failure_class says why): never "the same twice"
        (HUNG, HUNG, Budget(0, 2), True, 1, None),
        (HUNG, HUNG, Budget(10, 1), False, 1, None),
        # the scheduler's (or an operator's) signal: infrastructure, and always final
        (VALUE_88, STOPPED, Budget(10, 10), False, 143, None),
    ],
)  # fmt: skip
def test_two_attempts_in_a_row(first, second, budget, restart, code, cause):
    before = judge(0, *first, budget, replaceable=True, script=SCRIPT)
    assert before.restart, "the first failure restarts in every row"
    after = judge(1, *second, budget, replaceable=True, earlier=[before.failure], script=SCRIPT)
    assert (after.restart, after.code) == (restart, code)
    if cause is not None:
        assert after.root_cause.how == cause and after.root_cause.kind is Kind.SAME_FAILURE
        assert after.root_cause.failure == second[1][0], "the attempt's own failure kept"
        assert after.record["root_cause"] == after.root_cause.to_json()
        assert after.record["root_cause"]["kind"] == "same_failure"
    else:
        assert after.root_cause == second[1][0]


@pytest.mark.parametrize(
    ("cause", "others", "lost", "expected", "why"),
    [
        (_raised("ValueError", 88), [], False, FailureClass.PROGRAM, "rank 1: ValueError at train.py:88"),
        (_rank(1, returncode=3), [], False, FailureClass.PROGRAM, "rank 1: exit code 3 from train.py"),
        (_rank(1, returncode=-11), [], False, FailureClass.PROGRAM, "rank 1: killed by SIGSEGV from train.py"),
        (LOST_RECORD, [], True, FailureClass.INFRA, "node 1 (n1) lost"),
        # a rank's ValueError, then its node lost: a lost node explains the attempt
        (_raised("ValueError", 88), [replace(LOST_RECORD, seq=2)], False, FailureClass.INFRA, "node 1 (n1) lost"),
        (SCHEDULER, [], False, FailureClass.INFRA, "signal"),
        (HANG, [], False, FailureClass.INFRA, "hang"),
        (failure({"kind": "excluded", "node_rank": 2, "how": "failed its health check", "seq": 1}), [],
         False, FailureClass.INFRA, "excluded"),
        (None, [], False, FailureClass.INFRA, "no failure record"),
        # a connection reset first, its peer's ValueError after: the peer's bug is why
        (_rank(1, stderr_tail=["RuntimeError: [gloo] Connection closed by peer [127.0.0.2]:9"]),
         [replace(_raised("ValueError", 88, seq=2), rank=3)], False, FailureClass.PROGRAM,
         "rank 3: ValueError at train.py:88"),
        # ... its peer's node lost: infrastructure
        (_rank(1, stderr_tail=["RuntimeError: Connection reset by peer"]),
         [replace(LOST_RECORD, seq=2)], False, FailureClass.INFRA, "node 1 (n1) lost"),
    ],
)  # fmt: skip
def test_classify(cause, others, lost, expected, why):
    failures = [cause, *others] if cause is not None else others
    failure = classify(cause, failures, lost, SCRIPT)
    assert (failure.failure_class, failure.why) == (expected, why)
    assert (failure.signature is not None) == (expected is FailureClass.PROGRAM)


def test_signature_is_the_innermost_user_frame_of_the_last_exception():
    chained = "\n".join([
        _traceback("KeyError", 40, lib=False),
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        _traceback("mypkg.errors.ConfigError", 88),
    ])  # fmt: skip
    signature = signature_of(Failure(Kind.RANK, "exit code 1", traceback=chained), SCRIPT)
    assert signature.exception == "mypkg.errors.ConfigError"
    assert signature.frame == Frame("/home/u/train.py", 88, "main")
    only_library = '  File "/x/site-packages/torch/a.py", line 5, in f\n    g()\nRuntimeError: x'
    inner = signature_of(Failure(Kind.RANK, stderr_tail=tuple(only_library.splitlines())), SCRIPT)
    assert inner.frame == Frame("/x/site-packages/torch/a.py", 5, "f"), "the innermost of all"
    none = signature_of(Failure(Kind.RANK, "exit code 2", stderr_tail=("just a line",)), SCRIPT)
    assert (none.exception, none.frame, none.text()) == (None, None, "exit code 2 from train.py")


def test_the_attempt_record_and_verdict_carry_the_class():
    verdict = judge(0, *NODE_LOST, Budget(0, 1), replaceable=True)
    assert verdict.record["failure"] == {"class": "infrastructure", "why": "node 1 (n1) lost"}
    program = judge(0, *VALUE_88, Budget(1), script=SCRIPT)
    assert program.record["failure"] == {
        "class": "program",
        "why": "rank 1: ValueError at train.py:88",
        "signature": "ValueError at train.py:88",
    }
    assert "failure" not in judge(0, [OK], [], Budget()).record
