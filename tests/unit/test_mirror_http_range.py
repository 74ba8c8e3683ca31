"""rigkit/mirror/http_range.py: the one Range implementation the model mirror and the Hugging Face stand-in share."""

from __future__ import annotations

import pytest

from rigkit.mirror.http_range import answer_range

SIZE = 1000


@pytest.mark.parametrize(
    ("header", "status", "start", "end", "content_range"),
    [
        (None, 200, 0, SIZE, None),
        ("bytes=0-", 206, 0, SIZE, "bytes 0-999/1000"),
        ("bytes=100-", 206, 100, SIZE, "bytes 100-999/1000"),
        ("bytes=100-199", 206, 100, 200, "bytes 100-199/1000"),
        ("bytes=900-5000", 206, 900, SIZE, "bytes 900-999/1000"),  # clipped to the file
        ("bytes=-10", 206, 990, SIZE, "bytes 990-999/1000"),  # the last 10 bytes
        ("bytes=-5000", 206, 0, SIZE, "bytes 0-999/1000"),
        ("bytes=1000-", 416, 0, 0, "bytes */1000"),  # resuming a complete file
        ("bytes=" + "9" * 20 + "-", 416, 0, 0, "bytes */1000"),  # never handed to int()
        ("bytes=5-3", 200, 0, SIZE, None),  # invalid: ignored
        ("bytes=0-1,5-9", 200, 0, SIZE, None),  # multi-range: the whole file
        ("items=0-5", 200, 0, SIZE, None),
        ("bytes=-", 200, 0, SIZE, None),
    ],
)
def test_answers(header: str | None, status: int, start: int, end: int, content_range: str | None) -> None:
    answer = answer_range(header, SIZE)
    assert (answer.status, answer.start, answer.end) == (status, start, end)
    assert answer.headers.get("Content-Range") == content_range
    if status != 416:
        assert answer.headers["Content-Length"] == str(end - start)
