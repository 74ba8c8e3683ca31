"""Where the fetcher keeps things next to ``dest``, and how it opens them (standard library only).

``dest + ".part"`` is the download in progress; ``<dest dir>/.rigkit-verified/`` holds the verification record
of each installed file (its stat and sha256 when hashed), the pin of the part in progress (so a part from another
pin is never resumed) and the lock that keeps two fetches of one file apart. Nothing here follows a symlink planted
at one of these names, and nothing is opened in a way that blocks on a FIFO.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import time
from collections.abc import Mapping
from typing import Any, BinaryIO

from ansible.module_utils.atomic_file import write_atomic
from ansible.module_utils.fetch.errors import FetchError
from ansible.module_utils.fetch.spec import CatalogEntry

VERIFY_DIR = ".rigkit-verified"
RECORD_SCHEMA = 1


def part_path(dest: str) -> str:
    return dest + ".part"


def record_path(dest: str) -> str:
    return os.path.join(os.path.dirname(dest), VERIFY_DIR, os.path.basename(dest) + ".json")


def part_meta_path(dest: str) -> str:
    return os.path.join(os.path.dirname(dest), VERIFY_DIR, os.path.basename(dest) + ".part.json")


def lock_path(dest: str) -> str:
    return os.path.join(os.path.dirname(dest), VERIFY_DIR, os.path.basename(dest) + ".lock")


def read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json_atomic(path: str, data: Mapping[str, Any]) -> None:
    write_atomic(path, lambda handle: json.dump(data, handle, indent=1, sort_keys=True))


def verified_record(dest: str, sha256: str, size: int, st: os.stat_result | None = None) -> dict[str, Any] | None:
    """The verification record of `dest` when it still describes the file as it is now (same sha256 pin, size,
    mtime, inode and device as when it was hashed), else None: the file would need hashing again."""
    record = read_json(record_path(dest))
    if record is None:
        return None
    if st is None:
        try:
            st = os.stat(dest)
        except OSError:
            return None
    matches = (
        record.get("schema") == RECORD_SCHEMA
        and record.get("sha256") == sha256
        and record.get("size") == st.st_size == size
        and record.get("mtime_ns") == st.st_mtime_ns
        and record.get("inode") == st.st_ino
        and record.get("device") == st.st_dev
    )
    return record if matches else None


def write_record(dest: str, entry: CatalogEntry, st: os.stat_result) -> None:
    write_json_atomic(
        record_path(dest),
        {
            "schema": RECORD_SCHEMA,
            "path": dest,
            "sha256": entry.sha256,
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "inode": st.st_ino,
            "device": st.st_dev,
            "repo": entry.repo,
            "revision": entry.revision,
            "filename": entry.filename,
            "verified_at": int(time.time()),
        },
    )


def ensure_verify_dir(dest_dir: str) -> str:
    verify_dir = os.path.join(dest_dir, VERIFY_DIR)
    os.makedirs(verify_dir, exist_ok=True)
    if os.path.islink(verify_dir) or not os.path.isdir(verify_dir):
        raise FetchError(f"{verify_dir} is not a plain directory (a symlink?): remove it and re-run")
    return verify_dir


def open_regular(path: str, flags: int, what: str) -> BinaryIO:
    """Open ``path`` read-write without following a symlink and without blocking; only a regular file."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EEXIST, errno.ENXIO):
            raise FetchError(f"{path} ({what}) is a symlink or not a regular file: remove it and re-run") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FetchError(f"{path} ({what}) is not a regular file: remove it and re-run")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "r+b", buffering=0)


def usable_part(dest: str, entry: CatalogEntry) -> int | None:
    """Bytes of a resumable part of ``dest`` from the same pin, 0 when there is none, None when the part there
    is stale or foreign (the caller discards it). A part that is not a regular file is refused."""
    part = part_path(dest)
    try:
        st = os.lstat(part)  # never follow a link planted at the part's name
    except FileNotFoundError:
        return 0
    if not stat.S_ISREG(st.st_mode):
        what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise FetchError(f"{part} is {what}, not a download of the kit's: remove it and re-run")
    meta = read_json(part_meta_path(dest)) or {}
    same_pin = meta.get("sha256") == entry.sha256 and meta.get("size") == entry.size
    return st.st_size if same_pin and st.st_size <= entry.size else None


def discard_part(dest: str) -> None:
    unlink_quietly(part_path(dest))
    unlink_quietly(part_meta_path(dest))


def unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def existing_dir(path: str) -> str:
    """``path`` or its nearest existing ancestor (where free space is measured)."""
    while path and not os.path.isdir(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path or "/"
