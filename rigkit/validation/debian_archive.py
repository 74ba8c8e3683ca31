"""Debian's archive as the controller reads it (``make plan``; never a rig): a suite's ``Packages`` index for one
component, fetched from the mirror the nvidia_driver role installs from and cached; dpkg's version order.

``Archive.index(mirror, suite, component)`` reads ``<mirror>/dists/<suite>/<component>/binary-amd64/Packages.xz``
(``Packages.gz`` where the mirror has no xz) through module_utils/http_client.py, over plain http as apt does, and
trusts it as apt does: the suite's ``InRelease`` must carry a good signature by a key of Debian's archive keyring
(``gpgv``, ``/usr/share/keyrings/debian-archive-keyring.gpg``; RIGKIT_DEBIAN_KEYRING names another), must not be
past its ``Valid-Until``, and must list the index with the sha256 and size of what was downloaded. The index is
decompressed with a bound on its output (MAX_TEXT_BYTES). The compressed index is kept
under ``<controller cache>/archive/`` (a directory private to this user) and reused for ``max_age_s`` (6 h); an
older copy is refetched. When the archive cannot be read (unreachable, an HTTP error, a truncated or corrupt
download) a cached copy stands in and the Index says how old it is; with no copy, ArchiveError ("cannot check").
A download that does not decompress never replaces the cached copy.

RIGKIT_DEBIAN_MIRROR / RIGKIT_DEBIAN_SECURITY_MIRROR point the plan at another archive (a local mirror, a test's
stand-in) instead of the inventory's nvidia_driver_debian_mirror / nvidia_driver_debian_security_mirror.
"""

from __future__ import annotations

import email.utils
import functools
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ansible.module_utils.atomic_file import write_atomic, write_bytes_atomic
from ansible.module_utils.http_client import HttpClientError, Response, UrlRefused, redact, request

from rigkit.paths import UnsafeDirectoryError, cache_dir, private_dir

MAX_AGE_S = 6 * 3600.0
TIMEOUT_S = 20.0
MAX_INDEX_BYTES = 64 * 1024 * 1024  # main's Packages.xz is ~9 MB; anything this large is not an index
MAX_TEXT_BYTES = 256 * 1024 * 1024  # bookworm main's Packages is ~50 MB decompressed
MAX_RELEASE_BYTES = 4 * 1024 * 1024  # an InRelease is ~150 KB
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
KEYRING_ENV = "RIGKIT_DEBIAN_KEYRING"
ARCH = "amd64"
USER_AGENT = "rigkit-plan/1"
MIRROR_ENV = {
    "nvidia_driver_debian_mirror": "RIGKIT_DEBIAN_MIRROR",
    "nvidia_driver_debian_security_mirror": "RIGKIT_DEBIAN_SECURITY_MIRROR",
}
COMPRESSIONS = ("xz", "gz")
_SAFE_NAME_RE = re.compile(r"[^A-Za-z0-9.+-]+")
_DIGITS = "0123456789"


class ArchiveError(Exception):
    """The index cannot be read and no cached copy stands in; the message says why and what to do."""


# ------------------------------------------------------------------------------------ dpkg's version order
def _order(char: str) -> int:
    """dpkg's weight of one non-digit character: ``~`` before the end, the end before letters, letters before
    everything else."""
    if not char:
        return 0
    if char == "~":
        return -1
    if char.isascii() and char.isalpha():
        return ord(char)
    return ord(char) + 256


def _compare_part(a: str, b: str) -> int:
    """dpkg's verrevcmp: alternate non-digit runs (by _order) and digit runs (by value)."""
    i = j = 0
    while i < len(a) or j < len(b):
        while (i < len(a) and a[i] not in _DIGITS) or (j < len(b) and b[j] not in _DIGITS):
            left = _order(a[i] if i < len(a) and a[i] not in _DIGITS else "")
            right = _order(b[j] if j < len(b) and b[j] not in _DIGITS else "")
            if left != right:
                return left - right
            i, j = i + 1, j + 1
        start_i, start_j = i, j
        while i < len(a) and a[i] in _DIGITS:
            i += 1
        while j < len(b) and b[j] in _DIGITS:
            j += 1
        left_number, right_number = int(a[start_i:i] or 0), int(b[start_j:j] or 0)
        if left_number != right_number:
            return -1 if left_number < right_number else 1
    return 0


def split_version(version: str) -> tuple[int, str, str]:
    """(epoch, upstream, revision) of a Debian version: ``1:2.0-3`` is (1, "2.0", "3")."""
    epoch, _, rest = version.partition(":") if ":" in version else ("0", "", version)
    upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "")
    return int(epoch) if re.fullmatch(r"[0-9]+", epoch) else 0, upstream, revision


def dpkg_compare(a: str, b: str) -> int:
    """<0, 0 or >0 as dpkg --compare-versions orders ``a`` against ``b`` (epoch, then upstream, then revision)."""
    left, right = split_version(a), split_version(b)
    if left[0] != right[0]:
        return -1 if left[0] < right[0] else 1
    return _compare_part(left[1], right[1]) or _compare_part(left[2], right[2])


dpkg_key = functools.cmp_to_key(dpkg_compare)


def newest(versions: Iterable[str]) -> str | None:
    """The highest of ``versions`` in dpkg's order (None when there are none)."""
    return max(versions, key=dpkg_key, default=None)


# ------------------------------------------------------------------------------------ the Packages index
@dataclass(frozen=True)
class Stanza:
    """One binary package of an index: the fields the plan reads."""

    package: str
    version: str
    depends: str = ""

    def depends_on(self) -> list[str]:
        """The package names of Depends, alternatives included, without versions or architectures."""
        names = []
        for clause in self.depends.split(","):
            for alternative in clause.split("|"):
                name = alternative.strip().split(" ", 1)[0].split("(", 1)[0].split(":", 1)[0]
                if name:
                    names.append(name)
        return names


def parse_packages(text: str) -> dict[str, list[Stanza]]:
    """{package: its stanzas} of a Packages file (stanzas separated by blank lines; continuation lines start with
    white space and belong to the field above)."""
    found: dict[str, list[Stanza]] = {}
    for block in re.split(r"\n[ \t]*\n", text):
        fields: dict[str, str] = {}
        last = ""
        for line in block.splitlines():
            if line[:1] in (" ", "\t"):
                if last:
                    fields[last] += " " + line.strip()
                continue
            name, colon, value = line.partition(":")
            if colon:
                last = name.strip().lower()
                fields[last] = value.strip()
        if fields.get("package") and fields.get("version"):
            stanza = Stanza(fields["package"], fields["version"], fields.get("depends", ""))
            found.setdefault(stanza.package, []).append(stanza)
    return found


def kernel_abi(stanza: Stanza) -> str | None:
    """The kernel a flavour metapackage pulls: ``linux-image-amd64`` depending on ``linux-image-6.1.0-57-amd64``
    is ``6.1.0-57-amd64``."""
    for name in stanza.depends_on():
        if name.startswith("linux-image-") and name != stanza.package and name[len("linux-image-") :][:1] in _DIGITS:
            return name[len("linux-image-") :]
    return None


@dataclass(frozen=True)
class Index:
    """One suite/component's index, as fetched or cached (its text: stanzas are parsed for the packages asked)."""

    url: str
    suite: str
    component: str
    text: str = field(repr=False)
    age_s: float
    # Why a cached copy older than the freshness window stands in, or why a download was not kept (None: neither).
    note: str | None = None

    @property
    def where(self) -> str:
        return f"{self.suite}/{self.component}"

    def stanzas(self, package: str) -> list[Stanza]:
        """Every stanza of ``package`` (one per version the index carries)."""
        found: list[Stanza] = []
        for match in re.finditer(rf"^Package:[ \t]*{re.escape(package)}[ \t]*$", self.text, re.MULTILINE):
            start = self.text.rfind("\n\n", 0, match.start()) + 1
            end = self.text.find("\n\n", match.end())
            found += parse_packages(self.text[start : end if end >= 0 else None]).get(package, [])
        return found

    def versions(self, package: str) -> list[str]:
        return [stanza.version for stanza in self.stanzas(package)]


def shown_age(seconds: float) -> str:
    """An age as people say it: 40 s, 25 min, 7 h, 3 d."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return f"{max(int(seconds), 0)} s"


def mirrors(values: Mapping[str, Any]) -> dict[str, str]:
    """The role's mirror variables as the plan reads them: the environment's override, else the inventory's."""
    return {variable: os.environ.get(env) or str(values.get(variable) or "") for variable, env in MIRROR_ENV.items()}


def index_base(mirror: str, suite: str, component: str) -> str:
    """The index's URL without its compression suffix."""
    return f"{mirror.rstrip('/')}/dists/{suite}/{component}/binary-{ARCH}/Packages"


def decompress(compression: str, data: bytes, limit: int = MAX_TEXT_BYTES) -> str:
    """The text of a compressed index, at most ``limit`` bytes of it; ArchiveError when it is truncated, corrupt
    or larger (a small download that inflates to gigabytes is not an index)."""
    try:
        if compression == "xz":
            inflate: Any = lzma.LZMADecompressor()
            raw = inflate.decompress(data, max_length=limit)
            whole = inflate.eof
            larger = not whole and not inflate.needs_input
        else:
            inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)  # the gzip wrapper
            raw = inflate.decompress(data, limit)
            whole = inflate.eof
            larger = bool(inflate.unconsumed_tail)
    except (lzma.LZMAError, EOFError, OSError, zlib.error) as exc:
        raise ArchiveError(f"the {compression} download is truncated or corrupt ({exc})") from None
    if larger:
        raise ArchiveError(f"the {compression} download decompresses to more than {limit >> 20} MiB: not an index")
    if not whole:
        raise ArchiveError(f"the {compression} download is truncated or corrupt (it ends before its stream does)")
    return raw.decode("utf-8", errors="replace")


def keyring() -> str:
    return os.environ.get(KEYRING_ENV) or KEYRING


def verified_release(signed: bytes, ring: str | None = None) -> str:
    """The text of an ``InRelease`` that gpgv finds well signed by a key of ``ring``; ArchiveError otherwise.

    gpgv writes out only what the signature covers, so nothing outside it can be read as part of the file."""
    ring = ring or keyring()
    found = shutil.which("gpgv")
    if found is None:
        raise ArchiveError("cannot verify the archive's signature: gpgv is not installed (apt-get install gpgv)")
    if not os.path.isfile(ring):
        raise ArchiveError(
            f"cannot verify the archive's signature: no keyring {ring} (apt-get install debian-archive-keyring)"
        )
    done = subprocess.run(
        [found, "--quiet", "--keyring", ring, "--output", "-", "-"],
        input=signed,
        capture_output=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0 or not done.stdout:
        why = done.stderr.decode("utf-8", errors="replace").strip().splitlines()
        raise ArchiveError(
            f"InRelease is not signed by a key of {ring} (gpgv: {why[-1][:200] if why else 'no output'})"
        )
    return done.stdout.decode("utf-8", errors="replace")


def release_entry(release: str, path: str, now: float) -> tuple[str, int]:
    """(sha256, size) the verified ``release`` lists for ``path`` (relative to the suite); ArchiveError when it is
    past its Valid-Until or does not list the file."""
    fields = dict(re.findall(r"^([A-Za-z-]+):[ \t]*(.*)$", release, re.MULTILINE))
    valid_until = fields.get("Valid-Until")
    if valid_until:
        try:
            until = email.utils.parsedate_to_datetime(valid_until).timestamp()
        except (TypeError, ValueError):
            raise ArchiveError(f"InRelease has an unreadable Valid-Until ({valid_until[:60]!r})") from None
        if now > until:
            raise ArchiveError(f"InRelease expired on {valid_until} (a stale or replayed copy of the archive)")
    section = re.search(r"^SHA256:[ \t]*\n((?:[ \t]+.*\n?)*)", release, re.MULTILINE)
    for line in (section.group(1) if section else "").splitlines():
        parts = line.split()
        if (
            len(parts) == 3
            and parts[2] == path
            and re.fullmatch(r"[0-9a-f]{64}", parts[0])
            and re.fullmatch(r"[0-9]+", parts[1])
        ):
            return parts[0], int(parts[1])
    raise ArchiveError(f"InRelease does not list {path} in its SHA256 section")


# ------------------------------------------------------------------------------------ fetching and the cache
@dataclass(frozen=True)
class _Cached:
    compression: str
    data: bytes
    fetched: float

    def text(self) -> str | None:
        """The cached index's text; None when the copy on disk no longer decompresses (it is refetched)."""
        try:
            return decompress(self.compression, self.data)
        except ArchiveError:
            return None


class Archive:
    """Debian indexes for one plan run: cached on disk for ``max_age_s``, each read at most once per run, and no
    second attempt at a mirror host that already failed to answer in this run."""

    def __init__(
        self,
        cache: Path | None = None,
        *,
        max_age_s: float = MAX_AGE_S,
        timeout: float = TIMEOUT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._cache = cache
        self._max_age_s = max_age_s
        self._timeout = timeout
        self._clock = clock
        self._seen: dict[tuple[str, str, str], Index] = {}
        self._down: dict[str, str] = {}
        self._releases: dict[str, str] = {}  # each suite's verified InRelease, read once per run

    def index(self, mirror: str, suite: str, component: str) -> Index:
        """The suite/component's index; ArchiveError ("cannot check: ...") when neither archive nor cache has it."""
        key = (mirror.rstrip("/"), suite, component)
        if key not in self._seen:
            self._seen[key] = self._load(*key)
        return self._seen[key]

    def _load(self, mirror: str, suite: str, component: str) -> Index:
        base = index_base(mirror, suite, component)
        name = _SAFE_NAME_RE.sub("_", base.split("://", 1)[-1]).strip("_")
        cached = self._read(name)
        age = self._clock() - cached.fetched if cached else 0.0

        def index(text: str, age: float, note: str | None) -> Index:
            return Index(redact(base), suite, component, text, age, note)

        if cached and 0 <= age < self._max_age_s and (text := cached.text()) is not None:
            return index(text, age, None)
        try:
            compression, data = self._download(mirror, suite, component)
            text = decompress(compression, data)
        except ArchiveError as exc:
            if cached is None or (old := cached.text()) is None:
                raise ArchiveError(f"cannot check {suite}/{component}: {exc}") from None
            return index(old, age, f"{exc}; using the copy fetched {shown_age(age)} ago")
        return index(text, 0.0, self._store(name, compression, data, base))

    def _download(self, mirror: str, suite: str, component: str) -> tuple[str, bytes]:
        host = urllib.parse.urlsplit(mirror).netloc
        if host in self._down:
            raise ArchiveError(self._down[host])
        for compression in COMPRESSIONS:
            url = f"{index_base(mirror, suite, component)}.{compression}"
            try:
                answer = self._get(url, MAX_INDEX_BYTES)
            except (HttpClientError, UrlRefused) as exc:
                self._down[host] = f"the archive is unreachable ({exc})"
                raise ArchiveError(self._down[host]) from None
            if answer.status == 200:
                self._check(mirror, suite, f"{component}/binary-{ARCH}/Packages.{compression}", answer.body)
                return compression, answer.body
            if answer.status != 404:
                raise ArchiveError(f"{redact(url)} answered HTTP {answer.status}")
        raise ArchiveError(
            f"{redact(index_base(mirror, suite, component))}.xz (nor .gz) is not on the mirror: check the suite, "
            "the component and nvidia_driver_debian_mirror / nvidia_driver_debian_security_mirror"
        )

    def _check(self, mirror: str, suite: str, path: str, data: bytes) -> None:
        """The download is what the suite's signed InRelease lists, or ArchiveError says why not."""
        url = f"{mirror.rstrip('/')}/dists/{suite}/InRelease"
        if url not in self._releases:
            self._releases[url] = self._release(url)
        try:
            sha256, size = release_entry(self._releases[url], path, self._clock())
        except ArchiveError as exc:
            raise ArchiveError(f"{redact(url)}: {exc}") from None
        if (hashlib.sha256(data).hexdigest(), len(data)) != (sha256, size):
            raise ArchiveError(
                f"{redact(url)} lists {path} with sha256 {sha256} ({size} bytes) but the download has "
                f"{hashlib.sha256(data).hexdigest()} ({len(data)} bytes): a changed or corrupt copy"
            )

    def _get(self, url: str, max_body: int) -> Response:
        # Plain http as the role's apt sources use it, trusted as apt trusts it: through the signed InRelease.
        return request(
            "GET",
            url,
            headers={"User-Agent": USER_AGENT},
            timeout=self._timeout,
            allow_insecure_http=True,
            max_body=max_body,
        )

    def _release(self, url: str) -> str:
        try:
            answer = self._get(url, MAX_RELEASE_BYTES)
        except (HttpClientError, UrlRefused) as exc:
            raise ArchiveError(f"cannot read {redact(url)} ({exc})") from None
        if answer.status != 200:
            raise ArchiveError(f"{redact(url)} answered HTTP {answer.status}: the index cannot be verified")
        try:
            return verified_release(answer.body)
        except ArchiveError as exc:
            raise ArchiveError(f"{redact(url)}: {exc}") from None

    def _root(self) -> Path:
        return private_dir(self._cache or cache_dir() / "archive")

    def _read(self, name: str) -> _Cached | None:
        try:
            if not (self._cache or cache_dir() / "archive").is_dir():  # nothing cached: create nothing either
                return None
            root = self._root()
            meta = json.loads((root / f"{name}.json").read_text())
            compression = str(meta["compression"])
            if compression not in COMPRESSIONS:
                return None
            return _Cached(compression, (root / f"{name}.{compression}").read_bytes(), float(meta["fetched"]))
        except (OSError, UnsafeDirectoryError, ValueError, KeyError, TypeError):
            return None

    def _store(self, name: str, compression: str, data: bytes, url: str) -> str | None:
        """Keep the download (None), or say why it could not be kept."""
        meta = {"url": redact(url), "compression": compression, "fetched": self._clock()}
        try:
            root = self._root()
            write_bytes_atomic(str(root / f"{name}.{compression}"), data, mode=0o600)
            write_atomic(str(root / f"{name}.json"), lambda handle: json.dump(meta, handle), mode=0o600)
        except (OSError, UnsafeDirectoryError) as exc:
            return f"not cached ({exc}): set RIGKIT_CACHE_DIR to a directory of your own"
        return None
