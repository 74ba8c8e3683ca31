"""Streamed sha256: of a file on disk, and of a download in a second thread (standard library only).

``sha256_file`` hashes a present file with one reused 1 MiB buffer (small enough to stay in the CPU's cache
between the read and the hash: faster here than 4 MiB reads). ``ThreadedHasher`` hashes a download while the
caller keeps receiving and writing: the caller takes a free buffer, fills it, and submits it; a worker thread
hashes it (hashlib releases the GIL on large buffers) and gives it back. The pool of buffers is the bounded
queue: the download never runs more than ``depth`` buffers ahead of the hash, and a worker that died (an error
in the hash, the thread gone) is reported by the next call instead of hanging the download.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from typing import Any, BinaryIO

from ansible.module_utils.fetch.errors import DownloadError

HASH_CHUNK_SIZE = 1024 * 1024
_POLL_S = 0.5  # how often a waiting caller checks that the worker is still alive


def hash_into(hasher: Any, handle: BinaryIO, length: int | None, chunk_size: int = HASH_CHUNK_SIZE) -> int:
    """Feed ``length`` bytes (None: to EOF) of ``handle`` to ``hasher``; returns the bytes read."""
    view = memoryview(bytearray(chunk_size))
    total = 0
    while length is None or total < length:
        want = chunk_size if length is None else min(chunk_size, length - total)
        n = handle.readinto(view[:want])
        if not n:
            break
        hasher.update(view[:n])
        total += n
    return total


def sha256_file(path: str, chunk_size: int = HASH_CHUNK_SIZE) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb", buffering=0) as handle:
        hash_into(hasher, handle, None, min(chunk_size, HASH_CHUNK_SIZE))
    return hasher.hexdigest()


class HasherError(DownloadError):
    """The hashing thread failed or is gone: the download cannot be verified, so it is not installed; what is
    in the part stays (a download error keeps it) and the next run re-hashes it from disk and resumes."""


class ThreadedHasher:
    """sha256 of a stream, computed by a worker thread fed through a bounded pool of reused buffers.

    Use: ``view = h.take()``; fill ``view[:n]``; ``h.submit(view, n)``; at the end ``h.hexdigest()``; always
    ``h.close()`` (or use it as a context manager). ``reset()`` starts over (the part restarted from byte 0).
    """

    def __init__(
        self, chunk_size: int, depth: int = 4, factory: Any = hashlib.sha256, *, threaded: bool = True
    ) -> None:
        self._factory = factory
        self._sha = factory()
        self._free: queue.Queue[memoryview] = queue.Queue()
        self._work: queue.Queue[tuple[memoryview, int] | None] = queue.Queue()
        for _ in range(max(2, depth)):
            self._free.put(memoryview(bytearray(chunk_size)))
        self._pending = 0
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(target=self._run, name="rigkit-sha256", daemon=True)
            self._thread.start()

    def __enter__(self) -> ThreadedHasher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the worker
    def _run(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            view, n = item
            try:
                self._sha.update(view[:n])
            except BaseException as exc:  # handed to the caller, who raises it
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()
                return
            self._free.put(view)
            with self._cond:
                self._pending -= 1
                self._cond.notify_all()

    def _check(self) -> None:
        if self._error is not None:
            raise HasherError(
                f"the sha256 thread failed ({self._error.__class__.__name__}: {self._error}); the download "
                "cannot be verified and was not installed: re-run (the partial file is re-hashed and resumed)"
            ) from self._error
        if self._thread is not None and not self._thread.is_alive():
            raise HasherError(
                "the sha256 thread is gone; the download cannot be verified and was not installed: re-run"
            )

    # ------------------------------------------------------------------ the caller's side
    def take(self) -> memoryview:
        """A free buffer of ``chunk_size`` bytes (waits while all are queued for hashing)."""
        while True:
            self._check()
            try:
                return self._free.get(timeout=_POLL_S)
            except queue.Empty:
                continue

    def submit(self, view: memoryview, n: int) -> None:
        """Queue the first ``n`` bytes of a buffer from ``take()``; the buffer is the hasher's until given back."""
        self._check()
        if self._thread is None:  # inline: hashed now, by the caller
            self._sha.update(view[:n])
            self._free.put(view)
            return
        with self._cond:
            self._pending += 1
        self._work.put((view, n))

    def give_back(self, view: memoryview) -> None:
        """Return a buffer from ``take()`` that is not submitted (nothing was read into it)."""
        self._free.put(view)

    def feed(self, handle: BinaryIO, length: int) -> int:
        """Hash ``length`` bytes of ``handle`` from where it stands (a part being resumed); returns bytes read."""
        total = 0
        while total < length:
            view = self.take()
            n = handle.readinto(view[: min(len(view), length - total)])
            if not n:
                self.give_back(view)
                break
            self.submit(view, n)
            total += n
        return total

    def wait(self) -> None:
        """Until every submitted buffer is hashed."""
        with self._cond:
            while self._pending:
                self._check()
                self._cond.wait(_POLL_S)
        self._check()

    def reset(self) -> None:
        self.wait()
        self._sha = self._factory()

    def hexdigest(self) -> str:
        self.wait()
        return str(self._sha.hexdigest())

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._work.put(None)
            self._thread.join()
