"""What the fetcher is asked for and what it answers: the pinned entry, the options, the result, the URL.

Standard library only (it ships to rigs inside the gguf_fetch module).
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ansible.module_utils.fetch.errors import EntryError, FetchError
from ansible.module_utils.model_catalog import CatalogError, check_deployable

DEFAULT_BASE_URL = "https://huggingface.co"
DEFAULT_CHUNK_SIZE = 4 * 1024 * 1024
MIN_CHUNK_SIZE = 1024 * 1024
MAX_CHUNK_SIZE = 8 * 1024 * 1024
# 64 KiB/s over 10 minutes: a slow line (512 kbit/s) still finishes, a server that sends a little and stalls
# (1 MiB every read timeout, forever) is given up on with a clear message instead of retried for days.
DEFAULT_MIN_RATE = 64 * 1024
DEFAULT_RATE_WINDOW_S = 600.0


@dataclass(frozen=True)
class CatalogEntry:
    repo: str
    revision: str
    filename: str
    sha256: str
    size: int
    architecture: str | None = None
    name: str | None = None

    @property
    def label(self) -> str:
        return self.name or self.filename

    @property
    def where(self) -> str:
        """``repo @ revision : filename``, for messages."""
        return f"{self.repo} @ {self.revision} : {self.filename}"

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], name: str | None = None) -> CatalogEntry:
        """A deployable model_catalog entry (the catalog's own rules: well formed and fully pinned)."""
        label = name or data.get("name") or data.get("filename") or "<unnamed entry>"
        try:
            entry = check_deployable(str(label), dict(data))
        except CatalogError as exc:
            raise EntryError(str(exc)) from exc
        return cls(
            repo=str(entry["repo"]),
            revision=str(entry["revision"]),
            filename=str(entry["filename"]),
            sha256=str(entry["sha256"]),
            size=int(entry["size"]),
            architecture=str(entry["architecture"]),
            name=str(name or data.get("name") or "") or None,
        )


@dataclass
class FetchOptions:
    base_url: str = DEFAULT_BASE_URL
    # The controller mirror's per-run path secret: only in the request's path (``{base_url}/{secret}/...``), never
    # in what is returned, logged or written to disk (a part's metadata), so it never outlives the run on a rig.
    mirror_secret: str | None = None
    token: str | None = None
    allow_insecure_http: bool = False  # only for a trusted LAN mirror
    ca_file: str | None = None  # PEM bundle to trust instead of the system store (a LAN mirror's own CA)
    verify: str = "fast"  # "fast": trust a matching verification record; "full": always re-hash
    connect_timeout: float = 15.0
    read_timeout: float = 60.0  # longest stall allowed between two reads
    retries: int = 5  # consecutive failed attempts (each with < 1 MiB progress) tolerated before giving up
    # The rate rule: over every window of rate_window seconds the download must bring min_rate bytes/s on
    # average (retries and stalls included), or it stops with what it got; 0 turns the rule off.
    min_rate: float = DEFAULT_MIN_RATE
    rate_window: float = DEFAULT_RATE_WINDOW_S
    deadline: float = 0.0  # seconds for the whole download (retries included); 0: none
    backoff_initial: float = 1.0
    backoff_max: float = 60.0
    chunk_size: int = DEFAULT_CHUNK_SIZE
    check_mode: bool = False
    # Called as progress(bytes_in_part, total_bytes) after every chunk written (a terminal progress bar).
    progress: Callable[[int, int], None] | None = None

    def validate(self) -> None:
        scheme = urllib.parse.urlsplit(self.base_url).scheme.lower()
        if scheme not in ("http", "https") or not urllib.parse.urlsplit(self.base_url).netloc:
            raise FetchError(f"base_url {self.base_url!r} must be an https:// URL such as {DEFAULT_BASE_URL}")
        if self.verify not in ("fast", "full"):
            raise FetchError(f"verify must be 'fast' or 'full', not {self.verify!r}")
        if self.retries < 0:
            raise FetchError(f"retries must be 0 or more, not {self.retries}")
        if self.min_rate < 0 or self.rate_window <= 0 or self.deadline < 0:
            raise FetchError("min_rate and deadline must be 0 or more, rate_window a positive number of seconds")
        if self.connect_timeout <= 0 or self.read_timeout <= 0:
            raise FetchError("connect_timeout and read_timeout must be positive numbers of seconds")
        if not MIN_CHUNK_SIZE <= self.chunk_size <= MAX_CHUNK_SIZE:
            raise FetchError(f"chunk_size must be between {MIN_CHUNK_SIZE} and {MAX_CHUNK_SIZE} bytes")
        if self.token is not None and (not self.token.isascii() or not self.token.isprintable() or " " in self.token):
            raise FetchError("token contains whitespace or non-printable characters; paste the bare hf_... token")
        if self.ca_file is not None and not os.path.isfile(self.ca_file):
            raise FetchError(f"ca_file {self.ca_file} does not exist or is not a file")


@dataclass
class FetchResult:
    path: str
    changed: bool
    operation: str  # "none" | "download" | "resume" | "replace": what was (or, in check mode, would be) done
    verification: str  # "fast" (record) | "full" (re-hashed) | "download" (verified while fetched) | "none"
    sha256: str
    size: int
    url: str
    reason: str = ""  # why the operation was needed
    bytes_downloaded: int = 0
    resumed_from: int = 0
    restarted: bool = False  # the server ignored a Range request and the part started over
    attempts: int = 0
    check_mode: bool = False
    events: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_url(base_url: str, entry: CatalogEntry, secret: str | None = None) -> str:
    """``{base_url}[/{secret}]/{repo}/resolve/{revision}/{filename}``, each part quoted."""
    if secret:
        base_url = f"{base_url.rstrip('/')}/{urllib.parse.quote(secret, safe='')}"
    repo = urllib.parse.quote(entry.repo, safe="/")
    revision = urllib.parse.quote(entry.revision, safe="")
    filename = urllib.parse.quote(entry.filename, safe="/")
    return f"{base_url.rstrip('/')}/{repo}/resolve/{revision}/{filename}"


def redact(url: str) -> str:
    """The URL without query or fragment (CDN redirects carry signatures there)."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
