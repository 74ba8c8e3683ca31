"""Replace a file atomically: readers see the old bytes or the new ones, never half a write."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import TextIO


def write_atomic(path: str, write: Callable[[TextIO], object], mode: int = 0o644) -> None:
    """Write through `write(handle)` into a temporary file beside `path`, fsync it, then rename it over `path`."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp_path = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_path, mode)
        os.replace(tmp_path, path)
    except BaseException:
        if os.path.exists(tmp_path):
            os.unlink(tmp_path)
        raise
