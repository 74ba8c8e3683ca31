"""Put one model-catalog entry on disk, verified: download, resume, retry, check, then atomically install.

Standard library only (it runs on rigs). The flow for ``fetch_model(entry, dest, options)``:

1. The entry must be pinned (40-hex commit ``revision``, ``sha256``, ``size``); otherwise EntryError says how
   to pin it. The URL is ``{base_url}/{repo}/resolve/{revision}/{filename}``; plain ``http://`` (as base or as
   a redirect target) is refused unless ``allow_insecure_http`` marks a trusted LAN mirror.
2. An existing ``dest`` is accepted without reading it when its stat (size, mtime_ns, inode, device) matches
   the verification record written at install time and the record's sha256 is the entry's (``verify="fast"``);
   ``verify="full"`` (or a missing/stale record) re-hashes it. A bad file is replaced, never edited in place.
3. Otherwise the body streams into ``dest + ".part"``, hashed while written (in a second thread where the
   machine has a second core: HASH_IN_THREAD) and flushed to disk while it arrives (part.py). An existing
   part from the same pin is re-hashed and resumed with a Range request; a 200 answer restarts it cleanly.
   Connection errors, timeouts, 429 and 5xx are retried with exponential backoff; 401/403/404 fail at once,
   naming repo, revision and file. Free disk space is checked first.
4. After the body: size, sha256, then the GGUF header (magic, version, general.architecture) are checked; only
   then is the part fsynced and ``os.replace``d onto ``dest``. Any mismatch deletes the part, leaves the
   previous ``dest`` byte-identical and raises VerificationError with expected vs actual.

Verification records and part descriptors live in ``<dest dir>/.rigkit-verified/``. This module is the entry
point and the order of those steps; each step has its own module in this package: spec (entry, options,
result), errors, store (paths, records, safe opens), hash (streamed and threaded sha256), part (writing and the
fsync), http (one GET), transfer (attempts, resume, retries), pace (deadline and minimum rate), verify (size,
sha256, GGUF).
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import time
from collections.abc import Callable, Mapping
from typing import Any

from ansible.module_utils.fetch.errors import (
    DiskSpaceError,
    DownloadError,
    EntryError,
    FetchError,
    HttpStatusError,
    InsecureUrlError,
    LockedError,
    TlsError,
    VerificationError,
)
from ansible.module_utils.fetch.hash import ThreadedHasher, sha256_file
from ansible.module_utils.fetch.http import check_scheme
from ansible.module_utils.fetch.part import PartWriter
from ansible.module_utils.fetch.spec import (
    DEFAULT_BASE_URL,
    DEFAULT_MIN_RATE,
    DEFAULT_RATE_WINDOW_S,
    CatalogEntry,
    FetchOptions,
    FetchResult,
    build_url,
    human,
    redact,
)
from ansible.module_utils.fetch.store import (
    discard_part,
    ensure_verify_dir,
    existing_dir,
    fsync_dir,
    lock_path,
    open_regular,
    part_meta_path,
    part_path,
    record_path,
    unlink_quietly,
    usable_part,
    verified_record,
    write_json_atomic,
    write_record,
)
from ansible.module_utils.fetch.transfer import Transfer
from ansible.module_utils.fetch.verify import check_gguf, check_size_and_sha256

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

HASH_DEPTH = 4  # buffers of chunk_size between the receiving thread and the hash thread
# Hash in a second thread wherever there is a second core: on the kit's quiet 2-core bench machine a 1 GiB
# loopback download took 1.21 s with the hash thread and the background flush (part.py) against 2.40 s hashing
# inline (medians of 7, interleaved, curl -o 1.24 s; reports/perf/README.md). Inline hashing won only with a load
# average of 15 on those 2 cores, where the hand-offs between threads cost more than the overlap gains.
HASH_IN_THREAD = (os.cpu_count() or 1) >= 2


def _free_bytes(directory: str) -> int:
    return shutil.disk_usage(directory).free


class _Fetcher:
    """The steps of the module docstring, in order, for one entry and one dest."""

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
        self.url = build_url(opts.base_url, entry, opts.mirror_secret)  # what is requested
        self.public_url = build_url(opts.base_url, entry)  # what is shown and recorded: never the secret
        self._log_cb = log
        self._sleep = sleep
        self.result = FetchResult(
            path=dest,
            changed=False,
            operation="none",
            verification="none",
            sha256=entry.sha256,
            size=entry.size,
            url=self.public_url,
            check_mode=opts.check_mode,
        )

    def log(self, message: str) -> None:
        self.result.events.append(message)
        if self._log_cb is not None:
            self._log_cb(message)

    def run(self) -> FetchResult:
        check_scheme(self.public_url, self.entry, self.opts)
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
        ensure_verify_dir(self.dest_dir)
        with open_regular(lock_path(self.dest), os.O_RDWR | os.O_CREAT, "lock file") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise LockedError(
                    f"another fetch is writing {self.dest} right now (lock {lock_path(self.dest)}); "
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
        if self.opts.verify == "fast" and verified_record(self.dest, self.entry.sha256, self.entry.size, st):
            self.result.verification = "fast"
            return True, ""
        if st.st_size != self.entry.size:
            return False, f"present with size {st.st_size}, pinned size is {self.entry.size}"
        actual = sha256_file(self.dest, self.opts.chunk_size)
        if actual != self.entry.sha256:
            return False, f"present but its sha256 is {actual}, pinned {self.entry.sha256} (corrupt or another file)"
        check_gguf(self.entry, self.dest, installed_as=self.dest)
        self.result.verification = "full"
        if not self.opts.check_mode:
            write_record(self.dest, self.entry, os.stat(self.dest))
        return True, ""

    def _usable_part(self) -> int:
        """Bytes of a resumable part from the same pin; a stale or foreign part is discarded."""
        have = usable_part(self.dest, self.entry)
        if have is not None:
            return have
        self.log(f"discarding {self.part}: it does not belong to this pin")
        if not self.opts.check_mode:
            discard_part(self.dest)
        return 0

    def _check_disk_space(self, have: int) -> None:
        need = self.entry.size - have
        directory = existing_dir(self.dest_dir)
        free = _free_bytes(directory)
        if free < need:
            raise DiskSpaceError(
                f"not enough free space in {directory} for {self.entry.label}: need {need} bytes "
                f"({human(need)}) more, only {free} ({human(free)}) free. Free some space or set dest to a bigger "
                "disk, then re-run."
            )

    # ------------------------------------------------------------------ download, verify, install
    def _download(self, resume_from: int) -> None:
        write_json_atomic(
            part_meta_path(self.dest),
            {"sha256": self.entry.sha256, "size": self.entry.size, "url": redact(self.public_url)},
        )
        discard = True  # a part that failed verification (or filled the disk) must go
        writer: PartWriter | None = None
        try:
            if not resume_from:
                unlink_quietly(self.part)  # a fresh part is created, never opened through what is there
            flags = os.O_RDWR if resume_from else os.O_RDWR | os.O_CREAT | os.O_EXCL
            with (
                open_regular(self.part, flags, "partial download") as fh,
                ThreadedHasher(self.opts.chunk_size, HASH_DEPTH, threaded=HASH_IN_THREAD) as hasher,
            ):
                if resume_from:
                    resume_from = hasher.feed(fh, resume_from)
                    self.log(f"resuming {self.part} from byte {resume_from} (re-hashed)")
                os.ftruncate(fh.fileno(), resume_from)
                with PartWriter(fh, resume_from) as writer:
                    Transfer(self.entry, self.url, self.opts, writer, hasher, self.result, self.log, self._sleep).run()
                    writer.durable()
                check_size_and_sha256(self.entry, os.fstat(fh.fileno()).st_size, hasher.hexdigest())
                check_gguf(self.entry, self.part)
            os.replace(self.part, self.dest)
            fsync_dir(self.dest_dir)
        except DownloadError:
            offset = writer.offset if writer is not None else 0
            discard = offset == 0
            if not discard:
                self.log(f"kept {self.part} ({offset} bytes); re-running resumes from there")
            raise
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                offset = writer.offset if writer is not None else 0
                raise DiskSpaceError(
                    f"disk full while writing {self.part} ({offset} of {self.entry.size} bytes written): "
                    "free some space, then re-run"
                ) from None
            raise
        except HttpStatusError as exc:
            # About access (an expired token, a license not accepted yet, a mirror gone), not the content: the
            # bytes already here still belong to this pin.
            offset = writer.offset if writer is not None else 0
            if exc.status in (401, 403, 404) and offset:
                discard = False
                raise HttpStatusError(
                    f"{exc} The partial file ({offset} of {self.entry.size} bytes) is kept: re-run once "
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
            if discard and os.path.lexists(self.part):
                discard_part(self.dest)
        unlink_quietly(part_meta_path(self.dest))
        self.result.verification = "download"
        write_record(self.dest, self.entry, os.stat(self.dest))


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
