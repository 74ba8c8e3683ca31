"""The fetcher's errors: each message says what went wrong and what to do next (standard library only)."""

from __future__ import annotations

from typing import Any


class FetchError(Exception):
    """Base class: the message says what went wrong and what to do next."""

    kind = "error"


class EntryError(FetchError):
    kind = "entry"


class InsecureUrlError(FetchError):
    kind = "insecure_url"


class TlsError(FetchError):
    kind = "tls"


class HttpStatusError(FetchError):
    kind = "http"

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class DownloadError(FetchError):
    """Retries exhausted on transient failures; a partial file may be kept for the next run to resume."""

    kind = "download"


class VerificationError(FetchError):
    kind = "verification"

    def __init__(self, message: str, *, what: str, expected: Any, actual: Any) -> None:
        super().__init__(message)
        self.what = what
        self.expected = expected
        self.actual = actual


class DiskSpaceError(FetchError):
    kind = "disk_space"


class LockedError(FetchError):
    kind = "locked"


class Transient(Exception):
    """A failure worth retrying (connection trouble, timeout, 429, 5xx); internal to the fetcher."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Restart(Exception):
    """The server cannot continue the part: start over from byte 0; internal to the fetcher."""
