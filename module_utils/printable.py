"""Text from a server or a machine made safe to print (stdlib only; the controller and modules share it).

An error header, a commit title, a redirect's URL or a tool's message can carry terminal escape sequences
(``ESC [ 2 J``, a title that rewrites the window, OSC 8 links), a carriage return that overwrites the line before
it, or a right-to-left override that reorders what follows. ``printable`` keeps ordinary text, non-ASCII letters
included, and shows every control and format character as a visible escape instead:

    printable("bad\\x1b[2Jrepo")       # 'bad\\\\x1b[2Jrepo'
    printable("a" * 500, limit=10)    # 'aaaaaaaaaa...'
"""

from __future__ import annotations

import re
import unicodedata

# C0 controls (newline and tab included: one message, one line), DEL, C1 controls (0x9b is a one-byte CSI)
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def printable(text: object, limit: int | None = None) -> str:
    """``text`` (str() of it) with control characters and Unicode format characters (bidi overrides, zero-width
    characters: category Cf), surrogates and unassigned code points shown as ``\\xNN``/``\\uNNNN``; cut to
    ``limit`` characters (before escaping) with ``...`` when longer."""
    value = str(text)
    cut = limit is not None and len(value) > limit
    if cut:
        value = value[:limit]
    value = _CONTROL_RE.sub(lambda match: _escape(match[0]), value)
    if not value.isascii():
        value = "".join(
            _escape(char) if unicodedata.category(char) in ("Cf", "Cs", "Co", "Cn") else char for char in value
        )
    return value + ("..." if cut else "")
