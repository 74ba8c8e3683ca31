"""The download of one part: HTTP attempts with Range resume, retries with backoff, the body streamed to disk.

Standard library only. ``Transfer.run()`` brings the part from ``writer.offset`` to the pinned size: each attempt
asks for the rest (``Range: bytes=<offset>-``), a 200 answer or an unusable 206 restarts the part from byte 0, and
transient failures are retried with exponential backoff (``retries`` in a row without 1 MiB of progress, then
DownloadError). The body is received into the hasher's reused buffers (no new buffer per read), written at the
part's offset and hashed.
"""

from __future__ import annotations

import errno
import http.client
import re
import ssl
from collections.abc import Callable

from ansible.module_utils.fetch.errors import DownloadError, Restart, Transient, VerificationError
from ansible.module_utils.fetch.hash import ThreadedHasher
from ansible.module_utils.fetch.http import open_get, request_headers
from ansible.module_utils.fetch.pace import Pace
from ansible.module_utils.fetch.part import PartWriter
from ansible.module_utils.fetch.spec import CatalogEntry, FetchOptions, FetchResult
from ansible.module_utils.printable import printable

# An attempt that received at least this much (or finished) resets the count of consecutive failures; a server
# that dribbles a few bytes and stalls again still runs out of retries.
PROGRESS_BYTES = 1024 * 1024

# ASCII digits (\d also takes '٣'), at most 18 of them (int() refuses 4,300+); used with fullmatch
_CONTENT_RANGE_RE = re.compile(r"bytes ([0-9]{1,18})-([0-9]{1,18})/([0-9]{1,18}|\*)")


def size_mismatch(entry: CatalogEntry, actual: int, source: str) -> VerificationError:
    return VerificationError(
        f"size mismatch for {entry.where}: pinned {entry.size} bytes, {source} says {actual}. "
        "The pin or the revision is wrong; re-pin with `make pin`.",
        what="size",
        expected=entry.size,
        actual=actual,
    )


def _readinto1(resp: http.client.HTTPResponse, view: memoryview, *, first: bool) -> int:
    """Like ``resp.read1(len(view))`` (at most one system call) but into ``view``: no new buffer per read.

    The first read of a body goes through ``read1``: bytes that came with the headers sit in the response's
    buffer, and CPython's ``readinto1`` copies them out and then still makes a raw read, which loses them when
    that read times out (a server that stalls right after its first bytes). Later reads find that buffer empty
    and ``readinto1`` goes straight to the socket: a timeout there loses nothing.
    """
    if first or resp.chunked or resp.fp is None or resp.length is None:
        data = resp.read1(len(view))
        view[: len(data)] = data
        return len(data)
    if not resp.length:
        return 0
    n = resp.fp.readinto1(view[: min(len(view), resp.length)])
    if not n:
        resp.close()  # the server closed early: the caller sees a short part and retries with a Range
        return 0
    resp.length -= n
    return n


class Transfer:
    """Brings the open part (``writer``, hashed by ``hasher``) to ``entry.size`` bytes from ``url``."""

    def __init__(
        self,
        entry: CatalogEntry,
        url: str,
        opts: FetchOptions,
        writer: PartWriter,
        hasher: ThreadedHasher,
        result: FetchResult,
        log: Callable[[str], None],
        sleep: Callable[[float], None],
    ) -> None:
        self.entry = entry
        self.url = url
        self.opts = opts
        self.writer = writer
        self.hasher = hasher
        self.result = result
        self.log = log
        self.sleep = sleep
        self.pace = Pace(entry, opts)

    @property
    def offset(self) -> int:
        return self.writer.offset

    def _check_pace(self) -> None:
        self.pace.check(self.offset, self.result.bytes_downloaded, self.result.attempts)

    def run(self) -> None:
        if self.offset == self.entry.size:
            self.log("the partial file is complete: verifying it, nothing to download")
            return
        failures = 0
        use_range = True
        while True:
            received = self.result.bytes_downloaded
            self.result.attempts += 1
            try:
                if self.offset and not use_range:
                    self._restart_part()
                self._attempt()
                if self.offset == self.entry.size:
                    return
                raise Transient(f"connection closed after {self.offset} of {self.entry.size} bytes")
            except Restart:
                self.log("the server cannot continue the partial file; starting over from byte 0")
                use_range = False
                failures += 1
                delay = 0.0
            except Transient as exc:
                failures = 0 if self.result.bytes_downloaded - received >= PROGRESS_BYTES else failures + 1
                delay = min(self.opts.backoff_max, self.opts.backoff_initial * 2 ** max(0, failures - 1))
                if exc.retry_after is not None:
                    delay = max(delay, min(exc.retry_after, self.opts.backoff_max))
                if failures > self.opts.retries:
                    kept = (
                        f"the partial file ({self.offset} bytes) is kept and resumed"
                        if self.offset
                        else "nothing was received"
                    )
                    raise DownloadError(
                        f"download of {self.entry.where} failed after {self.result.attempts} attempts "
                        f"({failures} in a row without 1 MiB of progress): {exc}. Check the network and re-run; {kept}."
                    ) from None
                self.log(f"attempt {self.result.attempts}: {exc}; retrying in {delay:.1f} s")
            if failures > self.opts.retries:
                raise DownloadError(f"download of {self.entry.where} kept restarting; giving up")
            if delay:
                self.sleep(delay)
            self._check_pace()

    def _attempt(self) -> None:
        conn, resp = open_get(self.url, request_headers(self.opts, self.offset, self.url), self.entry, self.opts)
        try:
            self._accept_response(resp)
            self._read_body(resp)
        finally:
            conn.close()

    def _accept_response(self, resp: http.client.HTTPResponse) -> None:
        size = self.entry.size
        if resp.status == 416:
            raise Restart()
        if resp.status == 206:
            match = _CONTENT_RANGE_RE.fullmatch(resp.getheader("Content-Range") or "")
            if not match or int(match[1]) != self.offset:
                raise Restart()
            if match[3] != "*" and int(match[3]) != size:
                raise size_mismatch(self.entry, int(match[3]), "the server's Content-Range")
            return
        # 200: the whole file
        if self.offset:
            self.log(f"the server ignored the Range request (HTTP 200); restarting from byte 0, not {self.offset}")
            self._restart_part()
        length = (resp.getheader("Content-Length") or "").strip()
        if re.fullmatch(r"[0-9]{1,18}", length) and int(length) != size:  # ASCII: str.isdigit() takes '²'
            raise size_mismatch(self.entry, int(length), "the server's Content-Length")

    def _restart_part(self) -> None:
        self.hasher.reset()
        self.writer.restart()
        self.result.restarted = True

    def _read_body(self, resp: http.client.HTTPResponse) -> None:
        """Each receive (at most one system call) lands in a reused buffer, is written at the part's offset and
        hashed while still in the CPU's cache (or handed to the hash thread); what arrived before an error is
        kept so the next attempt resumes after it."""
        first = True
        while True:
            view = self.hasher.take()
            try:
                n = _readinto1(resp, view, first=first)
                first = False
            except BaseException as exc:  # given back first, then raised (classified)
                self.hasher.give_back(view)
                raise self._classify(exc) from None
            if not n:
                self.hasher.give_back(view)
                return
            if self.offset + n > self.entry.size:
                self.hasher.give_back(view)
                raise size_mismatch(self.entry, self.offset + n, "the body received so far")
            self.writer.write(view[:n])
            self.hasher.submit(view, n)
            self.result.bytes_downloaded += n
            if self.opts.progress is not None:
                self.opts.progress(self.offset, self.entry.size)
            self._check_pace()

    def _classify(self, exc: BaseException) -> BaseException:
        if isinstance(exc, TimeoutError):
            return Transient(f"no data for {self.opts.read_timeout:g} s (read timeout) at byte {self.offset}")
        if isinstance(exc, (http.client.HTTPException, ConnectionError, ssl.SSLError)):
            return Transient(f"connection lost at byte {self.offset}: {exc.__class__.__name__}: {printable(exc, 300)}")
        if isinstance(exc, OSError) and exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            return Transient(f"connection error at byte {self.offset}: {exc}")
        return exc
