"""Text from files, the environment, the store or the network, made safe for a terminal.

A host name, a path or a message can hold escape sequences (`\\x1b[2J` clears the screen, others
retitle the window or rewrite what was printed). Everything the agent prints passes `printable`:
control characters (C0, DEL, C1), the bidirectional marks and overrides, line separators and lone
surrogates are shown escaped, never interpreted. Newlines and tabs stay in multi-line text unless
`one_line` is asked for. A rank's own output is not touched: it is the user's program, and its
colours are theirs.
"""

from __future__ import annotations

# Direction marks and overrides reorder a line; line separators split it; a lone surrogate
# (a file name's non-UTF-8 byte, as Python decodes it) cannot be written to a UTF-8 terminal.
_BIDI = [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_ESCAPES = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)]}
_ESCAPES |= {c: f"\\u{c:04x}" for c in [*_BIDI, 0x2028, 0x2029, *range(0xD800, 0xE000)]}
_MULTI_LINE = {k: v for k, v in _ESCAPES.items() if k not in (0x0A, 0x09)}
ESCAPED = frozenset(_ESCAPES)  # the code points `printable(..., one_line=True)` escapes


def printable(text: object, one_line: bool = False) -> str:
    """`text` with every control character shown as an escape (\\n and \\t kept unless
    `one_line`)."""
    shown = str(text)
    if shown.isprintable():  # no escaped code point is printable (a test checks each)
        return shown
    return shown.translate(_ESCAPES if one_line else _MULTI_LINE)
