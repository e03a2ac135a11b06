"""Plain data out of a pickle without unpickling it (pure): dicts, lists, tuples, sets,
strings, bytes, numbers, booleans and None, decoded opcode by opcode (pickletools.genops only
parses). Any opcode that would find a class, call something or build an object — GLOBAL,
STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, persistent ids, extensions — is refused, so a
file can never run code in the agent: torch's flight-recorder dumps are plain data
(agent.hang.nccl_dumps)."""

from __future__ import annotations

import pickletools
from typing import Any

VALUES = {
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
    "UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "STRING", "BINSTRING",
    "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "NONE",
}  # fmt: skip
CONSTANTS = {"NEWTRUE": True, "NEWFALSE": False}
MAX_ITEMS = 10_000_000  # opcodes decoded at most


class NotPlainData(ValueError):
    pass


def plain_data(data: bytes) -> Any:
    """The object a pickle of plain data holds; NotPlainData for anything else (or a stream
    that does not parse)."""
    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[int, Any] = {}

    def since_mark() -> list[Any]:
        at = marks.pop()
        items = stack[at:]
        del stack[at:]
        return items

    try:
        for count, (op, arg, _) in enumerate(pickletools.genops(data)):
            name = op.name
            if count > MAX_ITEMS:
                raise NotPlainData("too many opcodes")
            if name in ("PROTO", "FRAME"):
                continue
            if name == "STOP":
                return stack.pop()
            if name in VALUES:
                stack.append(arg)
            elif name in CONSTANTS:
                stack.append(CONSTANTS[name])
            elif name == "MARK":
                marks.append(len(stack))
            elif name == "EMPTY_DICT":
                stack.append({})
            elif name == "EMPTY_LIST":
                stack.append([])
            elif name == "EMPTY_TUPLE":
                stack.append(())
            elif name == "EMPTY_SET":
                stack.append(set())
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(name[-1])
                items = stack[-n:]
                del stack[-n:]
                stack.append(tuple(items))
            elif name == "TUPLE":
                stack.append(tuple(since_mark()))
            elif name == "FROZENSET":
                stack.append(frozenset(since_mark()))
            elif name == "LIST":
                stack.append(since_mark())
            elif name == "DICT":
                items = since_mark()
                stack.append(dict(zip(items[::2], items[1::2], strict=True)))
            elif name == "SETITEM":
                value, key = stack.pop(), stack.pop()
                _of(stack[-1], dict)[key] = value
            elif name == "SETITEMS":
                items = since_mark()
                _of(stack[-1], dict).update(zip(items[::2], items[1::2], strict=True))
            elif name == "APPEND":
                value = stack.pop()
                _of(stack[-1], list).append(value)
            elif name == "APPENDS":
                items = since_mark()
                _of(stack[-1], list).extend(items)
            elif name == "ADDITEMS":
                items = since_mark()
                _of(stack[-1], set).update(items)
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[_index(arg)] = stack[-1]
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo[_index(arg)])
            elif name == "POP":
                stack.pop()
            elif name == "POP_MARK":
                since_mark()
            elif name == "DUP":
                stack.append(stack[-1])
            else:
                raise NotPlainData(f"opcode {name} is not plain data")
    except NotPlainData:
        raise
    except Exception as exc:  # a stream that does not parse, an unhashable key, a bad memo
        raise NotPlainData(f"{type(exc).__name__}: {exc}"[:200]) from None
    raise NotPlainData("no STOP")


def _index(arg: object) -> int:
    """A memo opcode's argument: pickletools gives these an int, anything else is refused."""
    if not isinstance(arg, int):
        raise NotPlainData("a memo index that is not a number")
    return arg


def _of(value: Any, kind: type) -> Any:
    if type(value) is not kind:
        raise NotPlainData(f"an item added to a {type(value).__name__}")
    return value
