"""Put one model-catalog entry on disk, verified: download, resume, retry, check, then atomically install.

Standard library only (it runs on rigs). The flow for ``fetch_model(entry, dest, options)``:

1. The entry must be pinned (40-hex commit ``revision``, ``sha256``, ``size``); otherwise EntryError says how
   to pin it. The URL is ``{base_url}/{repo}/resolve/{revision}/{filename}``; plain ``http://`` (as base or as
   a redirect target) is refused unless ``allow_insecure_http`` marks a trusted LAN mirror.
2. An existing ``dest`` is accepted without reading it when its stat (size, mtime_ns, inode, device) matches
   the verification record written at install time and the record's sha256 is the entry's (``verify="fast"``);
   ``verify="full"`` (or a missing/stale record) re-hashes it. A bad file is replaced, never edited in place.
3. Otherwise the body streams into ``dest + ".part"``, hashed while written. An existing part from the same
   pin is re-hashed and resumed with a Range request; a 200 answer restarts it cleanly. Connection errors,
   timeouts, 429 and 5xx are retried with exponential backoff; 401/403/404 fail at once, naming repo,
   revision and file. Free disk space is checked first.
4. After the body: size, sha256, then the GGUF header (magic, version, general.architecture) are checked; only
   then is the part fsynced and ``os.replace``d onto ``dest``. Any mismatch deletes the part, leaves the
   previous ``dest`` byte-identical and raises VerificationError with expected vs actual.

Verification records and part descriptors live in ``<dest dir>/.rigkit-verified/``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import http.client
import json
import os
import re
import shutil
import ssl
import stat
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO

from ansible.module_utils.atomic_file import write_atomic
from ansible.module_utils.gguf_metadata import GgufError, read_gguf_metadata
from ansible.module_utils.http_client import MAX_REDIRECTS, REDIRECT_STATUSES, UrlRefused, check_url, next_hop
from ansible.module_utils.model_catalog import CatalogError, check_deployable

__all__ = [
    "DEFAULT_BASE_URL",
    "DEFAULT_MIN_RATE",
    "DEFAULT_RATE_WINDOW_S",
    "CatalogEntry",
    "DiskSpaceError",
    "DownloadError",
    "EntryError",
    "FetchError",
    "FetchOptions",
    "FetchResult",
    "HttpStatusError",
    "InsecureUrlError",
    "LockedError",
    "TlsError",
    "VerificationError",
    "build_url",
    "fetch_model",
    "part_path",
    "record_path",
    "sha256_file",
    "verified_record",
]

DEFAULT_BASE_URL = "https://huggingface.co"
DEFAULT_CHUNK_SIZE = 4 * 1024 * 1024
MIN_CHUNK_SIZE = 1024 * 1024
MAX_CHUNK_SIZE = 8 * 1024 * 1024
VERIFY_DIR = ".rigkit-verified"
RECORD_SCHEMA = 1
# An attempt that received at least this much (or finished) resets the count of consecutive failures; a server
# that dribbles a few bytes and stalls again still runs out of retries.
PROGRESS_BYTES = 1024 * 1024
USER_AGENT = "rigkit-gguf-fetch/1"
# 64 KiB/s over 10 minutes: a slow line (512 kbit/s) still finishes, a server that sends a little and stalls
# (1 MiB every read timeout, forever) is given up on with a clear message instead of retried for days.
DEFAULT_MIN_RATE = 64 * 1024
DEFAULT_RATE_WINDOW_S = 600.0

_CONTENT_RANGE_RE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


# ---------------------------------------------------------------------------------------------- errors
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


class _Transient(Exception):
    """A failure worth retrying (connection trouble, timeout, 429, 5xx)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class _Restart(Exception):
    """The server cannot continue the part: start over from byte 0."""


# ---------------------------------------------------------------------------------------------- inputs
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


# ---------------------------------------------------------------------------------------------- helpers
def build_url(base_url: str, entry: CatalogEntry) -> str:
    repo = urllib.parse.quote(entry.repo, safe="/")
    revision = urllib.parse.quote(entry.revision, safe="")
    filename = urllib.parse.quote(entry.filename, safe="/")
    return f"{base_url.rstrip('/')}/{repo}/resolve/{revision}/{filename}"


def verified_record(dest: str, sha256: str, size: int, st: os.stat_result | None = None) -> dict[str, Any] | None:
    """The verification record of `dest` when it still describes the file as it is now (same sha256 pin, size,
    mtime, inode and device as when it was hashed), else None: the file would need hashing again."""
    record = _read_json(record_path(dest))
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


def part_path(dest: str) -> str:
    return dest + ".part"


def record_path(dest: str) -> str:
    return os.path.join(os.path.dirname(dest), VERIFY_DIR, os.path.basename(dest) + ".json")


def _part_meta_path(dest: str) -> str:
    return os.path.join(os.path.dirname(dest), VERIFY_DIR, os.path.basename(dest) + ".part.json")


def _lock_path(dest: str) -> str:
    return os.path.join(os.path.dirname(dest), VERIFY_DIR, os.path.basename(dest) + ".lock")


def _hash_into(hasher: Any, handle: BinaryIO, length: int | None, chunk_size: int) -> int:
    """Feed ``length`` bytes (None: to EOF) of ``handle`` to ``hasher``; returns the bytes read."""
    buf = bytearray(chunk_size)
    view = memoryview(buf)
    total = 0
    while length is None or total < length:
        want = chunk_size if length is None else min(chunk_size, length - total)
        n = handle.readinto(view[:want])
        if not n:
            break
        hasher.update(view[:n])
        total += n
    return total


def sha256_file(path: str, chunk_size: int = DEFAULT_CHUNK_SIZE) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb", buffering=0) as handle:
        _hash_into(hasher, handle, None, chunk_size)
    return hasher.hexdigest()


def _free_bytes(directory: str) -> int:
    return shutil.disk_usage(directory).free


def _existing_dir(path: str) -> str:
    while path and not os.path.isdir(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path or "/"


def _redact(url: str) -> str:
    """The URL without query or fragment (CDN redirects carry signatures there)."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json_atomic(path: str, data: Mapping[str, Any]) -> None:
    write_atomic(path, lambda handle: json.dump(data, handle, indent=1, sort_keys=True))


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _open_regular(path: str, flags: int, what: str) -> BinaryIO:
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
    return os.fdopen(fd, "r+b")


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


# ---------------------------------------------------------------------------------------------- the fetcher
class _Fetcher:
    def __init__(
        self,
        entry: CatalogEntry,
        dest: str,
        opts: FetchOptions,
        log: Callable[[str], None] | None,
        sleep: Callable[[float], None],
    ) -> None:
        self.entry = entry
        self.dest = dest
        self.dest_dir = os.path.dirname(dest)
        self.part = part_path(dest)
        self.opts = opts
        self.url = build_url(opts.base_url, entry)
        self._log_cb = log
        self._sleep = sleep
        self.result = FetchResult(
            path=dest,
            changed=False,
            operation="none",
            verification="none",
            sha256=entry.sha256,
            size=entry.size,
            url=self.url,
            check_mode=opts.check_mode,
        )
        self._fh: BinaryIO | None = None
        self._hasher: Any = None
        self._offset = 0
        self._clock = time.monotonic
        self._started = 0.0
        self._window = (0.0, 0)  # (start, bytes_downloaded then) of the current rate window

    def log(self, message: str) -> None:
        self.result.events.append(message)
        if self._log_cb is not None:
            self._log_cb(message)

    # ------------------------------------------------------------------ entry point
    def run(self) -> FetchResult:
        self._check_scheme(self.url)
        if not os.path.isdir(self.dest_dir):
            if not self.opts.check_mode:
                raise FetchError(
                    f"destination directory {self.dest_dir} does not exist: create it first "
                    "(ansible.builtin.file state=directory) with the owner that should hold the models"
                )
            self._plan_download("destination directory does not exist yet", 0)
            return self.result
        if self.opts.check_mode:
            return self._run_locked()
        verify_dir = os.path.join(self.dest_dir, VERIFY_DIR)
        os.makedirs(verify_dir, exist_ok=True)
        if os.path.islink(verify_dir) or not os.path.isdir(verify_dir):
            raise FetchError(f"{verify_dir} is not a plain directory (a symlink?): remove it and re-run")
        with _open_regular(_lock_path(self.dest), os.O_RDWR | os.O_CREAT, "lock file") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise LockedError(
                    f"another fetch is writing {self.dest} right now (lock {_lock_path(self.dest)}); "
                    "wait for it to finish and re-run"
                ) from None
            return self._run_locked()

    def _run_locked(self) -> FetchResult:
        ok, reason = self._inspect_existing()
        if ok:
            return self.result
        resume_from = self._usable_part()
        self._plan_download(reason, resume_from)
        if self.opts.check_mode:
            return self.result
        self._download(resume_from)
        return self.result

    def _plan_download(self, reason: str, resume_from: int) -> None:
        existing = os.path.lexists(self.dest)
        self.result.reason = reason
        self.result.changed = True
        self.result.resumed_from = resume_from
        self.result.operation = "resume" if resume_from else ("replace" if existing else "download")
        self._check_disk_space(resume_from)

    # ------------------------------------------------------------------ existing file
    def _inspect_existing(self) -> tuple[bool, str]:
        try:
            st = os.lstat(self.dest)  # a symlink is not the kit's file, whatever it points to
        except FileNotFoundError:
            return False, "not present"
        if not stat.S_ISREG(st.st_mode):
            what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise FetchError(f"{self.dest} exists but is {what}: move it away and re-run")
        if self.opts.verify == "fast" and self._record_matches(st):
            self.result.verification = "fast"
            return True, ""
        if st.st_size != self.entry.size:
            return False, f"present with size {st.st_size}, pinned size is {self.entry.size}"
        actual = sha256_file(self.dest, self.opts.chunk_size)
        if actual != self.entry.sha256:
            return False, f"present but its sha256 is {actual}, pinned {self.entry.sha256} (corrupt or another file)"
        self._check_gguf(self.dest, installed=True)
        self.result.verification = "full"
        if not self.opts.check_mode:
            self._write_record(os.stat(self.dest))
        return True, ""

    def _record_matches(self, st: os.stat_result) -> bool:
        return verified_record(self.dest, self.entry.sha256, self.entry.size, st) is not None

    def _write_record(self, st: os.stat_result) -> None:
        _write_json_atomic(
            record_path(self.dest),
            {
                "schema": RECORD_SCHEMA,
                "path": self.dest,
                "sha256": self.entry.sha256,
                "size": st.st_size,
                "mtime_ns": st.st_mtime_ns,
                "inode": st.st_ino,
                "device": st.st_dev,
                "repo": self.entry.repo,
                "revision": self.entry.revision,
                "filename": self.entry.filename,
                "verified_at": int(time.time()),
            },
        )

    # ------------------------------------------------------------------ part file
    def _usable_part(self) -> int:
        """Bytes of a resumable part from the same pin; a stale or foreign part is discarded."""
        try:
            st = os.lstat(self.part)  # never follow a link planted at the part's name
        except FileNotFoundError:
            return 0
        if not stat.S_ISREG(st.st_mode):
            what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise FetchError(f"{self.part} is {what}, not a download of the kit's: remove it and re-run")
        meta = _read_json(_part_meta_path(self.dest)) or {}
        same_pin = meta.get("sha256") == self.entry.sha256 and meta.get("size") == self.entry.size
        if stat.S_ISREG(st.st_mode) and same_pin and st.st_size <= self.entry.size:
            return st.st_size
        self.log(f"discarding {self.part}: it does not belong to this pin")
        if not self.opts.check_mode:
            self._discard_part()
        return 0

    def _discard_part(self) -> None:
        _unlink_quietly(self.part)
        _unlink_quietly(_part_meta_path(self.dest))

    def _check_disk_space(self, have: int) -> None:
        need = self.entry.size - have
        directory = _existing_dir(self.dest_dir)
        free = _free_bytes(directory)
        if free < need:
            raise DiskSpaceError(
                f"not enough free space in {directory} for {self.entry.label}: need {need} bytes "
                f"({_human(need)}) more, only {free} ({_human(free)}) free. Free some space or set dest to a bigger "
                "disk, then re-run."
            )

    # ------------------------------------------------------------------ download
    def _download(self, resume_from: int) -> None:
        _write_json_atomic(
            _part_meta_path(self.dest),
            {"sha256": self.entry.sha256, "size": self.entry.size, "url": _redact(self.url)},
        )
        discard = True  # a part that failed verification (or filled the disk) must go
        try:
            if not resume_from:
                _unlink_quietly(self.part)  # a fresh part is created, never opened through what is there
            flags = os.O_RDWR if resume_from else os.O_RDWR | os.O_CREAT | os.O_EXCL
            with _open_regular(self.part, flags, "partial download") as fh:
                self._fh = fh
                self._hasher = hashlib.sha256()
                if resume_from:
                    resume_from = _hash_into(self._hasher, fh, resume_from, self.opts.chunk_size)
                    self.log(f"resuming {self.part} from byte {resume_from} (re-hashed)")
                fh.seek(resume_from)
                fh.truncate()
                self._offset = resume_from
                self._transfer()
                fh.flush()
                os.fsync(fh.fileno())
                self._verify_part(fh)
            os.replace(self.part, self.dest)
            _fsync_dir(self.dest_dir)
        except DownloadError:
            discard = self._offset == 0
            if not discard:
                self.log(f"kept {self.part} ({self._offset} bytes); re-running resumes from there")
            raise
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskSpaceError(
                    f"disk full while writing {self.part} ({self._offset} of {self.entry.size} bytes written): "
                    "free some space, then re-run"
                ) from None
            raise
        except HttpStatusError as exc:
            # About access (an expired token, a license not accepted yet, a mirror gone), not the content: the
            # bytes already here still belong to this pin.
            if exc.status in (401, 403, 404) and self._offset:
                discard = False
                raise HttpStatusError(
                    f"{exc} The partial file ({self._offset} of {self.entry.size} bytes) is kept: re-run once "
                    "access is fixed and the download resumes from there.",
                    exc.status,
                ) from None
            raise
        except FetchError:
            raise
        except BaseException:  # interrupted (or a bug): the part stays resumable, its pin is recorded
            discard = False
            raise
        finally:
            self._fh = None
            if discard and os.path.lexists(self.part):
                self._discard_part()
        _unlink_quietly(_part_meta_path(self.dest))
        self.result.verification = "download"
        self._write_record(os.stat(self.dest))

    def _restart_part(self) -> None:
        assert self._fh is not None
        self._fh.seek(0)
        self._fh.truncate()
        self._hasher = hashlib.sha256()
        self._offset = 0
        self.result.restarted = True

    def _progress_note(self) -> str:
        elapsed = self._clock() - self._started
        share = 100.0 * self._offset / self.entry.size if self.entry.size else 100.0
        return (
            f"got {self._offset} of {self.entry.size} bytes ({share:.1f} %, {_human(self._offset)}), "
            f"{_human(self.result.bytes_downloaded)} in {elapsed:.0f} s over {self.result.attempts} attempts"
        )

    def _check_pace(self) -> None:
        """The deadline and the minimum-rate rule (see FetchOptions); raises DownloadError with how far it got."""
        now = self._clock()
        kept = "the partial file is kept and resumed on the next run" if self._offset else "nothing was kept"
        if self.opts.deadline and now - self._started > self.opts.deadline:
            raise DownloadError(
                f"download of {self.entry.where} passed its deadline of {self.opts.deadline:g} s: "
                f"{self._progress_note()}. Check the network or the mirror (or raise the deadline); {kept}."
            )
        start, bytes_then = self._window
        if self.opts.min_rate and now - start >= self.opts.rate_window:
            got = self.result.bytes_downloaded - bytes_then
            if got < self.opts.min_rate * self.opts.rate_window:
                raise DownloadError(
                    f"download of {self.entry.where} is too slow: {_human(got)} in the last {now - start:.0f} s, "
                    f"below the minimum of {_human(self.opts.min_rate)}/s; {self._progress_note()}. Check the "
                    f"network or the mirror (or lower the minimum rate); {kept}."
                )
            self._window = (now, self.result.bytes_downloaded)

    def _transfer(self) -> None:
        failures = 0
        use_range = True
        self._started = self._clock()
        self._window = (self._started, 0)
        if self._offset == self.entry.size:
            self.log(f"{self.part} is complete: verifying it, nothing to download")
            return
        while True:
            received = self.result.bytes_downloaded
            self.result.attempts += 1
            try:
                if self._offset and not use_range:
                    self._restart_part()
                self._attempt()
                if self._offset == self.entry.size:
                    return
                raise _Transient(f"connection closed after {self._offset} of {self.entry.size} bytes")
            except _Restart:
                self.log("the server cannot continue the partial file; starting over from byte 0")
                use_range = False
                failures += 1
                delay = 0.0
            except _Transient as exc:
                failures = 0 if self.result.bytes_downloaded - received >= PROGRESS_BYTES else failures + 1
                delay = min(self.opts.backoff_max, self.opts.backoff_initial * 2 ** max(0, failures - 1))
                if exc.retry_after is not None:
                    delay = max(delay, min(exc.retry_after, self.opts.backoff_max))
                if failures > self.opts.retries:
                    kept = (
                        f"the partial file ({self._offset} bytes) is kept and resumed"
                        if self._offset
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
                self._sleep(delay)
            self._check_pace()

    def _attempt(self) -> None:
        headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        if self.opts.token:
            headers["Authorization"] = f"Bearer {self.opts.token}"
        if self._offset:
            headers["Range"] = f"bytes={self._offset}-"
        conn, resp = self._open(headers)
        try:
            self._accept_response(resp)
            self._read_body(resp)
        finally:
            conn.close()

    def _accept_response(self, resp: http.client.HTTPResponse) -> None:
        size = self.entry.size
        if resp.status == 416:
            raise _Restart()
        if resp.status == 206:
            match = _CONTENT_RANGE_RE.match(resp.getheader("Content-Range") or "")
            if not match or int(match[1]) != self._offset:
                raise _Restart()
            if match[3] != "*" and int(match[3]) != size:
                self._size_mismatch(int(match[3]), "the server's Content-Range")
            return
        # 200: the whole file
        if self._offset:
            self.log(f"the server ignored the Range request (HTTP 200); restarting from byte 0, not {self._offset}")
            self._restart_part()
        length = resp.getheader("Content-Length")
        if length is not None and length.isdigit() and int(length) != size:
            self._size_mismatch(int(length), "the server's Content-Length")

    def _size_mismatch(self, actual: int, source: str) -> None:
        raise VerificationError(
            f"size mismatch for {self.entry.where}: pinned {self.entry.size} bytes, {source} says {actual}. "
            "The pin or the revision is wrong; re-pin with `make pin`.",
            what="size",
            expected=self.entry.size,
            actual=actual,
        )

    def _read_body(self, resp: http.client.HTTPResponse) -> None:
        assert self._fh is not None
        fh, hasher = self._fh, self._hasher
        chunk = self.opts.chunk_size
        try:
            while True:
                data = resp.read1(chunk)
                if not data:
                    return
                if self._offset + len(data) > self.entry.size:
                    self._size_mismatch(self._offset + len(data), "the body received so far")
                fh.write(data)
                hasher.update(data)
                self._offset += len(data)
                self.result.bytes_downloaded += len(data)
                if self.opts.progress is not None:
                    self.opts.progress(self._offset, self.entry.size)
                self._check_pace()
        except TimeoutError:
            raise _Transient(
                f"no data for {self.opts.read_timeout:g} s (read timeout) at byte {self._offset}"
            ) from None
        except (http.client.HTTPException, ConnectionError, ssl.SSLError) as exc:
            raise _Transient(f"connection lost at byte {self._offset}: {exc.__class__.__name__}: {exc}") from None
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise _Transient(f"connection error at byte {self._offset}: {exc}") from None

    # ------------------------------------------------------------------ HTTP
    def _check_scheme(self, url: str, *, redirect_from: str | None = None) -> None:
        try:
            check_url(url, allow_insecure_http=self.opts.allow_insecure_http, redirect_from=redirect_from)
        except UrlRefused as exc:
            raise InsecureUrlError(f"{exc} ({self.entry.where})") from None

    def _ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.opts.ca_file)

    def _connect(self, parts: urllib.parse.SplitResult) -> http.client.HTTPConnection:
        host = parts.hostname or ""
        port = parts.port
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(
                host, port, timeout=self.opts.connect_timeout, context=self._ssl_context()
            )
        else:
            conn = http.client.HTTPConnection(host, port, timeout=self.opts.connect_timeout)
        try:
            conn.connect()
        except ssl.SSLCertVerificationError as exc:
            conn.close()
            raise TlsError(
                f"TLS certificate of {host} not trusted ({exc.verify_message}). For a LAN mirror with its own CA "
                "set ca_file to that CA's PEM; never disable verification."
            ) from None
        except TimeoutError:
            conn.close()
            raise _Transient(f"connecting to {host} timed out after {self.opts.connect_timeout:g} s") from None
        except (OSError, ssl.SSLError) as exc:
            conn.close()
            raise _Transient(f"cannot connect to {host}: {exc}") from None
        assert conn.sock is not None
        conn.sock.settimeout(self.opts.read_timeout)
        return conn

    def _open(self, headers: dict[str, str]) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        url = self.url
        for _ in range(MAX_REDIRECTS + 1):
            parts = urllib.parse.urlsplit(url)
            conn = self._connect(parts)
            target = parts.path + (f"?{parts.query}" if parts.query else "")
            try:
                conn.request("GET", target, headers=headers)
                resp = conn.getresponse()
            except TimeoutError:
                conn.close()
                raise _Transient(f"no response within {self.opts.read_timeout:g} s (read timeout)") from None
            except (http.client.HTTPException, OSError) as exc:
                conn.close()
                raise _Transient(f"request failed: {exc.__class__.__name__}: {exc}") from None
            if resp.status in REDIRECT_STATUSES:
                location = resp.getheader("Location")
                conn.close()
                if not location:
                    raise HttpStatusError(f"HTTP {resp.status} without a Location for {self.entry.where}", resp.status)
                try:  # the shared policy (module_utils/http_client.py): no downgrade, token kept to the origin
                    hop = next_hop(
                        current_url=url,
                        origin_url=self.url,
                        status=resp.status,
                        location=location,
                        method="GET",
                        headers=headers,
                        body=None,
                        allow_insecure_http=self.opts.allow_insecure_http,
                    )
                except UrlRefused as exc:
                    raise InsecureUrlError(f"{exc} ({self.entry.where})") from None
                url, headers = hop.url, hop.headers
                continue
            if resp.status in (200, 206, 416):
                return conn, resp
            body = self._error_detail(resp)
            conn.close()
            self._raise_for_status(resp, body)
        raise HttpStatusError(f"more than {MAX_REDIRECTS} redirects for {self.entry.where}", 310)

    @staticmethod
    def _error_detail(resp: http.client.HTTPResponse) -> str:
        detail = resp.getheader("X-Error-Message") or ""
        code = resp.getheader("X-Error-Code") or ""
        with contextlib.suppress(OSError, http.client.HTTPException):
            resp.read(4096)
        return f"{code}: {detail}" if code and detail else code or detail

    def _raise_for_status(self, resp: http.client.HTTPResponse, detail: str) -> None:
        status = resp.status
        where = self.entry.where
        extra = f" (server says {detail})" if detail else ""
        if status == 401:
            hint = (
                "the token was not accepted: check it is a valid Hugging Face token"
                if self.opts.token
                else "the repository is gated or private: accept its terms on the model page and pass an HF token"
            )
            raise HttpStatusError(f"HTTP 401 for {where}{extra}: {hint}.", status)
        if status == 403:
            raise HttpStatusError(
                f"HTTP 403 for {where}{extra}: access denied. Accept the model's license on huggingface.co with the "
                "account that owns the token, or use a token with read access to this repository.",
                status,
            )
        if status == 404:
            raise HttpStatusError(
                f"HTTP 404 for {where}{extra}: no such file at that revision. Check repo, filename and the pinned "
                "commit in model_catalog (a private repository also answers 404 without a token).",
                status,
            )
        if status == 429 or status >= 500:
            retry_after = resp.getheader("Retry-After")
            seconds = float(retry_after) if retry_after and retry_after.isdigit() else None
            raise _Transient(f"HTTP {status} from {urllib.parse.urlsplit(self.url).netloc}{extra}", seconds)
        raise HttpStatusError(f"HTTP {status} for {where}{extra}", status)

    # ------------------------------------------------------------------ verification
    def _verify_part(self, fh: BinaryIO) -> None:
        actual_size = os.fstat(fh.fileno()).st_size
        if actual_size != self.entry.size or self._offset != self.entry.size:
            raise VerificationError(
                f"size mismatch for {self.entry.where}: expected {self.entry.size} bytes, got {actual_size}",
                what="size",
                expected=self.entry.size,
                actual=actual_size,
            )
        actual = self._hasher.hexdigest()
        if actual != self.entry.sha256:
            raise VerificationError(
                f"sha256 mismatch for {self.entry.where}: expected {self.entry.sha256}, got {actual}. The download "
                "was discarded; if it repeats, the pin is wrong (re-pin with `make pin`).",
                what="sha256",
                expected=self.entry.sha256,
                actual=actual,
            )
        self._check_gguf(self.part, installed=False)

    def _check_gguf(self, path: str, *, installed: bool) -> None:
        try:
            meta = read_gguf_metadata(path, read_tensors=True)
        except GgufError as exc:
            raise VerificationError(
                f"{self.entry.where} matches its pinned sha256 but is not a usable GGUF ({exc.problem}); the pin "
                "points at the wrong file: re-pin with `make pin`.",
                what="gguf",
                expected="GGUF v2/v3",
                actual=exc.problem,
            ) from None
        expected = self.entry.architecture
        if expected and meta.architecture != expected:
            where = f"{self.dest} (installed)" if installed else self.entry.where
            raise VerificationError(
                f"architecture mismatch for {where}: model_catalog says {expected!r}, the file's "
                f"general.architecture is {meta.architecture!r}. Fix the entry's architecture or its pin.",
                what="architecture",
                expected=expected,
                actual=meta.architecture,
            )
        end = meta.tensor_data_end()
        if end is not None and end > meta.file_size:
            raise VerificationError(
                f"{self.entry.where}: tensor data needs {end} bytes but the file has {meta.file_size}",
                what="gguf",
                expected=end,
                actual=meta.file_size,
            )


def fetch_model(
    entry: CatalogEntry | Mapping[str, Any],
    dest: str | os.PathLike[str],
    options: FetchOptions | None = None,
    *,
    name: str | None = None,
    log: Callable[[str], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> FetchResult:
    """Make ``dest`` hold the entry's verified bytes. See the module docstring; raises FetchError subclasses."""
    opts = options or FetchOptions()
    opts.validate()
    if not isinstance(entry, CatalogEntry):
        entry = CatalogEntry.from_mapping(entry, name)
    dest_path = os.path.abspath(os.fspath(dest))
    if os.path.basename(dest_path) in ("", ".", ".."):
        raise FetchError(f"dest {dest!r} must name the file to create, e.g. /srv/models/{entry.filename}")
    return _Fetcher(entry, dest_path, opts, log, sleep).run()
