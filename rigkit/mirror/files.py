"""Which file a mirror request may read, and opening it safely: the URL must name
``/<owner>/<repo>/resolve/<revision>/<file>`` with no hidden component (``.rigkit-verified``, ``..``) and no
``.part``; the file is opened component by component with ``O_NOFOLLOW`` (no symlink under the root is followed)
and ``O_NONBLOCK`` (a FIFO never hangs a handler), and only a regular file, checked on the open descriptor, is
served. Used by rigkit/mirror/models.py.
"""

from __future__ import annotations

import os
import re
import stat
import urllib.parse

_RESOLVE_RE = re.compile(r"^/[^/]+/[^/]+/resolve/[^/]+/.+\Z")


def url_parts(url_path: str) -> list[str] | None:
    """The components of a servable ``/<owner>/<repo>/resolve/<revision>/<file>`` path, or None."""
    path = urllib.parse.unquote(url_path)
    if "\x00" in path or "\\" in path or not _RESOLVE_RE.fullmatch(path):
        return None
    parts = path[1:].split("/")
    if any(part in ("", ".", "..") or part.startswith(".") for part in parts) or parts[-1].endswith(".part"):
        return None
    return parts


def open_served_file(root: str, parts: list[str]) -> tuple[int, os.stat_result] | None:
    """Open ``root/<parts>`` without following any symlink, without blocking; only a regular file."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = child
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        file_fd = os.open(parts[-1], flags, dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    st = os.fstat(file_fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(file_fd)
        return None
    os.set_blocking(file_fd, True)  # sendfile() from an O_NONBLOCK file would not wait for the socket
    return file_fd, st
