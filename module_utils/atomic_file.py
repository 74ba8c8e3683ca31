"""Replace a file atomically: readers see the old bytes or the new ones, never half a write."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import IO, Any, TextIO


def write_atomic(path: str, write: Callable[[TextIO], object], mode: int = 0o644) -> None:
    """Write text through `write(handle)` into a temporary file beside `path`, fsync it, then rename it over `path`."""
    _replace(path, mode, lambda fd: _fill(os.fdopen(fd, "w", encoding="utf-8"), write))


def write_bytes_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    """The same for bytes (a repository signing key apt reads)."""
    _replace(path, mode, lambda fd: _fill(os.fdopen(fd, "wb"), lambda handle: handle.write(data)))


def _fill(handle: IO[Any], write: Callable[[Any], object]) -> None:
    with handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())


def _replace(path: str, mode: int, fill: Callable[[int], None]) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp_path = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        fill(fd)
        os.chmod(tmp_path, mode)
        os.replace(tmp_path, path)
    except BaseException:
        if os.path.exists(tmp_path):
            os.unlink(tmp_path)
        raise
