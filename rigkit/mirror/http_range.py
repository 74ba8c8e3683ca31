"""Single byte ranges (RFC 9110 §14) for the file servers the kit runs on the controller: the model mirror
(rigkit/mirror/models.py) and, in the tests, the Hugging Face stand-in, which adds only its faults on top.

One range only, as the fetcher asks (``bytes=START-``); a multi-range or malformed header is ignored (the whole
file, 200), an unsatisfiable one is 416, and a number longer than any file size is never handed to ``int()``
(Python refuses very long digit strings with an exception).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_RANGE_DIGITS = 19  # more digits than any file size: answered 416
_RANGE_RE = re.compile(r"^bytes=([0-9]*)-([0-9]*)\Z")  # ASCII digits: \d also takes '٣', which int() reads as 3


@dataclass(frozen=True)
class RangeAnswer:
    """What to send for a file of ``size`` bytes: the status, bytes [start, end), and the range headers."""

    status: int  # 200 (whole file), 206 (a range) or 416 (unsatisfiable: send no body)
    start: int
    end: int
    headers: dict[str, str] = field(default_factory=dict)  # Content-Length and Content-Range where they apply

    @property
    def length(self) -> int:
        return self.end - self.start


def wanted_range(header: str | None, size: int) -> tuple[int, int] | bool | None:
    """(start, end_exclusive); None: no usable Range (send everything); False: unsatisfiable."""
    match = _RANGE_RE.fullmatch((header or "").strip())
    if not match or (not match[1] and not match[2]):
        return None
    if len(match[1]) > MAX_RANGE_DIGITS or len(match[2]) > MAX_RANGE_DIGITS:
        return False  # beyond any file
    if match[1]:
        start = int(match[1])
        end = min(size, int(match[2]) + 1) if match[2] else size
        if match[2] and int(match[2]) < start:
            return None  # syntactically invalid: ignore it (RFC 9110)
    else:
        start, end = max(0, size - int(match[2])), size
    if start >= size or start >= end:
        return False
    return start, end


def answer_range(header: str | None, size: int) -> RangeAnswer:
    """The answer to a GET or HEAD with this Range header (or none) for a file of ``size`` bytes."""
    wanted = wanted_range(header, size)
    if wanted is False:
        return RangeAnswer(416, 0, 0, {"Content-Range": f"bytes */{size}"})
    if wanted is None or wanted is True:
        return RangeAnswer(200, 0, size, {"Content-Length": str(size)})
    start, end = wanted
    return RangeAnswer(
        206, start, end, {"Content-Length": str(end - start), "Content-Range": f"bytes {start}-{end - 1}/{size}"}
    )
