"""The Hugging Face Hub API, as far as pinning needs it: a ref's commit, a file's LFS sha256 and size at a commit,
a ref's commits (newest first). Controller only (``rigkit pin``); rigs download through the fetcher, not this.

Every request goes through module_utils/http_client.py, the fetcher's client: https only (plain http only for a
trusted local endpoint, never as a downgrade), the token (``HF_TOKEN``, optional) only to the endpoint's own origin,
bounded redirects. The endpoints are the ones huggingface_hub uses:

- ``GET  {endpoint}/api/models/{repo}/revision/{ref}``: the commit a branch or tag points at;
- ``POST {endpoint}/api/models/{repo}/paths-info/{commit}`` with ``paths=<filename>``: ``lfs.oid`` and ``size``;
- ``GET  {endpoint}/api/models/{repo}/commits/{ref}``: the commits, pages followed through the ``Link`` header;
- ``GET  {endpoint}/{repo}/resolve/{commit}/{filename}`` with ``Range: bytes=0-N``: the first bytes of a GGUF, its
  header (the memory model's `shape:` facts), never the whole file.

HTTPS_PROXY / NO_PROXY are honoured (http_client.open_connection). A 429 waits for the reset the server names
(``Retry-After`` or ``RateLimit: "api";r=0;t=SECONDS``, the Hub's form) and retries, up to ``rate_limit_wait``
seconds of waiting per HubApi in all; a reset beyond that fails with the wait the server asked for. The Hub's
answers for access, as the messages read them: without a token an unknown, private or gated repository answers
401 (RepoNotFound or GatedRepo); with one, an unknown or inaccessible private one 404 RepoNotFound, a gated one
whose terms the account has not accepted 403 GatedRepo, a token it does not accept 401.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ansible.module_utils.gguf_metadata import GgufError, GgufMetadata, read_gguf_metadata
from ansible.module_utils.http_client import (
    HttpClientError,
    Response,
    UrlRefused,
    redact,
    request,
    retry_wait,
    same_origin,
)
from ansible.module_utils.model_catalog import REVISION_RE
from ansible.module_utils.printable import printable

from rigkit.paths import CATALOG_FILE

DEFAULT_ENDPOINT = "https://huggingface.co"
USER_AGENT = "rigkit-pin/1"
MAX_COMMITS = 500  # commits walked looking for a trusted sha256 (one paths-info request each)
COMMITS_PER_PAGE = 100
MAX_COMMIT_PAGES = 50  # pages of the commit list followed at most (a page may hold fewer than it was asked for)
RATE_LIMIT_WAIT = 300.0  # seconds of 429 waits a pin sits through in all: the Hub's window is 5 minutes
UNSAID_WAIT = 10.0  # a 429 that names no reset: wait this long before asking again
MIN_WAIT = 1.0  # RateLimit's t= counts whole seconds: t=0 still means "not yet"
SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")
_LINK_NEXT_RE = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')
# Bytes read from a GGUF's start until its header parses: a Gemma tokenizer alone is megabytes of it.
HEADER_READS = (8 << 20, 32 << 20, 128 << 20)


class PinError(Exception):
    """The pin cannot be made; the message says what to do next."""


class NotInLfsError(PinError):
    """The file is in the repository but not stored with Git LFS: the API gives no sha256 for it."""


@dataclass(frozen=True)
class FileInfo:
    sha256: str
    size: int
    commit: str


@dataclass(frozen=True)
class CommitFile:
    """One commit of the walk and what the entry's file is there (``note`` when it is absent or not in LFS)."""

    commit: str
    date: str = ""
    title: str = ""
    sha256: str | None = None
    size: int | None = None
    note: str = ""


class _ApiError(Exception):
    """An HTTP error answer; its X-Error-Code and X-Error-Message are the server's text, kept printable."""

    def __init__(self, status: int, code: str, message: str, *, wait: float | None = None, waited: float = 0.0) -> None:
        code, message = printable(code, 100), printable(message, 300)
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.wait = wait  # a 429's reset in seconds (None: it named none)
        self.waited = waited  # seconds of 429 waits already spent


def _detail(exc: _ApiError) -> str:
    """`` (code: message)`` of the parts the server sent; empty when it sent neither."""
    said = ": ".join(part for part in (exc.code, exc.message) if part)
    return f" ({said})" if said else ""


def _explain_401(exc: _ApiError, repo: str, token: str | None) -> PinError:
    if token:
        hint = "the token in HF_TOKEN was not accepted: check it (huggingface.co/settings/tokens)"
    elif exc.code == "GatedRepo":
        hint = (
            f"the repository is gated: accept its terms on https://huggingface.co/{repo} and set HF_TOKEN to a read "
            "token of that account"
        )
    else:
        hint = (
            f"no such repository, or it is private or gated: check the repo name in the catalog ({CATALOG_FILE}), or "
            "set HF_TOKEN to a read token of an account with access"
        )
    return PinError(f"HTTP 401 for {repo}{_detail(exc)}: {hint}, then re-run the pin.")


def _explain_404(exc: _ApiError, repo: str, revision: str, token: str | None) -> PinError:
    detail = _detail(exc)
    if exc.code == "RevisionNotFound":
        return PinError(f"revision {revision} not found in {repo}{detail}: give a branch, tag or commit of it.")
    if token:
        return PinError(
            f"repository {repo} not found, or the account of HF_TOKEN has no access to it{detail}: check the repo "
            f"name in the catalog ({CATALOG_FILE}), or use a token of an account with access."
        )
    return PinError(f"repository {repo} not found{detail}: fix the entry's repo in the catalog ({CATALOG_FILE}).")


def _explain_429(exc: _ApiError, repo: str, bound: float) -> PinError:
    asked = f"its quota resets in {exc.wait:.0f} s" if exc.wait is not None else "it names no reset"
    spent = (
        f"this pin has already waited {exc.waited:.0f} s of the {bound:g} s it waits in all"
        if exc.waited
        else f"beyond the {bound:g} s this pin waits in all"
    )
    return PinError(
        f"HTTP 429 for {repo}{_detail(exc)}: the Hugging Face API's rate limit; {asked}, {spent}. Re-run the pin "
        "after that; with HF_TOKEN set the quota is an account's, larger than an anonymous one."
    )


def _explain(exc: _ApiError, repo: str, revision: str, token: str | None, bound: float = RATE_LIMIT_WAIT) -> PinError:
    if exc.status == 401:
        return _explain_401(exc, repo, token)
    if exc.status == 403:
        return PinError(
            f"HTTP 403 for {repo}{_detail(exc)}: accept the model's license on https://huggingface.co/{repo} with "
            "the account of HF_TOKEN, or use a token with read access, then re-run the pin."
        )
    if exc.status == 404:
        return _explain_404(exc, repo, revision, token)
    if exc.status == 429:
        return _explain_429(exc, repo, bound)
    return PinError(f"HTTP {exc.status} from the Hugging Face API for {repo}{_detail(exc)}; try again later.")


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


class _Waited:
    """Seconds of 429 waits spent so far (the one mutable part of a HubApi)."""

    def __init__(self) -> None:
        self.seconds = 0.0


@dataclass(frozen=True)
class HubApi:
    """One endpoint, one token, one policy: every call below goes through ``_call``."""

    endpoint: str = DEFAULT_ENDPOINT
    token: str | None = None
    timeout: float = 30.0
    allow_insecure_http: bool = False
    rate_limit_wait: float = RATE_LIMIT_WAIT  # seconds of 429 waits in all before a 429 fails
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)
    notice: Callable[[str], None] = field(default=_to_stderr, repr=False, compare=False)
    _waited: _Waited = field(default_factory=_Waited, init=False, repr=False, compare=False)

    def _base(self, repo: str) -> str:
        return f"{self.endpoint.rstrip('/')}/api/models/{urllib.parse.quote(repo, safe='/')}"

    def _wait_for_quota(self, answer: Response) -> None:
        """Sleep until the reset a 429 names, or raise its _ApiError when that would pass ``rate_limit_wait``."""
        asked = retry_wait(answer.header("Retry-After") or None, answer.header("RateLimit") or None)
        wait = max(MIN_WAIT, UNSAID_WAIT if asked is None else asked)
        if self._waited.seconds + wait > self.rate_limit_wait:
            code, message = answer.header("X-Error-Code"), answer.header("X-Error-Message")
            raise _ApiError(429, code, message, wait=asked, waited=self._waited.seconds)
        self.notice(
            f"rigkit pin: {redact(answer.url)} answered HTTP 429 (rate limit); waiting {wait:.0f} s for the quota "
            "to reset"
        )
        self.sleep(wait)
        self._waited.seconds += wait

    def _answer(self, url: str, data: bytes | None = None, *, head_bytes: int = 0) -> Response:
        """The answer once no 429 stands in the way; an HTTP error is an _ApiError."""
        answer = self._send(url, data, head_bytes=head_bytes)
        while answer.status == 429:
            self._wait_for_quota(answer)
            answer = self._send(url, data, head_bytes=head_bytes)
        if answer.status >= 400:
            raise _ApiError(answer.status, answer.header("X-Error-Code"), answer.header("X-Error-Message"))
        return answer

    def _call(self, url: str, *, data: bytes | None = None) -> tuple[Any, Response]:
        answer = self._answer(url, data)
        if not 200 <= answer.status < 300:
            raise PinError(f"{printable(url)} answered HTTP {answer.status}; is --endpoint a Hugging Face API?")
        try:
            return json.loads(answer.body or b"null"), answer
        except ValueError:
            raise PinError(f"{printable(url)} did not answer JSON; is --endpoint a Hugging Face API?") from None

    def _send(self, url: str, data: bytes | None, *, head_bytes: int = 0) -> Response:
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        if head_bytes:  # a file's first bytes, not an API answer
            headers.update({"Accept": "*/*", "Range": f"bytes=0-{head_bytes - 1}"})
        endpoint = self.endpoint.rstrip("/")
        try:
            return request(
                "POST" if data is not None else "GET",
                url,
                headers=headers,
                body=data,
                token=self.token,
                timeout=self.timeout,
                allow_insecure_http=self.allow_insecure_http,
                **({"max_body": head_bytes} if head_bytes else {}),
            )
        except UrlRefused as exc:
            raise PinError(f"{exc}") from None
        except HttpClientError as exc:
            raise PinError(
                f"cannot reach {endpoint}: {exc}; check the network, --endpoint, or HTTPS_PROXY / NO_PROXY"
            ) from None

    def _get(self, url: str, repo: str, revision: str, *, data: bytes | None = None) -> tuple[Any, Response]:
        try:
            return self._call(url, data=data)
        except _ApiError as exc:
            raise _explain(exc, repo, revision, self.token, self.rate_limit_wait) from None

    def resolve_revision(self, repo: str, ref: str) -> str:
        """The commit a branch or tag points at now."""
        body, _ = self._get(f"{self._base(repo)}/revision/{urllib.parse.quote(ref, safe='')}", repo, ref)
        commit = body.get("sha") if isinstance(body, dict) else None
        if not isinstance(commit, str) or not REVISION_RE.fullmatch(commit):
            raise PinError(f"the API did not give a commit for {repo} @ {ref}; pass the full 40-character commit")
        return commit

    def file_at(self, repo: str, revision: str, filename: str) -> FileInfo | None:
        """The file's LFS sha256 and size at ``revision`` (paths-info API); None when the file is not there.

        Give a commit: the Hub's paths-info answer names none (no X-Repo-Commit), so the result's commit is
        ``revision`` as given.
        """
        data = urllib.parse.urlencode({"paths": filename, "expand": "false"}).encode()
        url = f"{self._base(repo)}/paths-info/{urllib.parse.quote(revision, safe='')}"
        body, _ = self._get(url, repo, revision, data=data)
        found = [item for item in body or [] if isinstance(item, dict) and item.get("path") == filename]
        if not found or found[0].get("type") != "file":
            return None
        item = found[0]
        lfs = item.get("lfs")
        if not isinstance(lfs, dict) or not SHA256_RE.fullmatch(str(lfs.get("oid", ""))):
            raise NotInLfsError(
                f"{repo} : {filename} is not stored with Git LFS, so the API gives no sha256 for it; pin it by hand "
                "(sha256sum of the file at that revision) in the catalog."
            )
        size = lfs.get("size", item.get("size"))
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise PinError(f"the API gave no usable size for {repo} : {filename} ({size!r})")
        return FileInfo(sha256=str(lfs["oid"]), size=size, commit=revision)

    def _head(self, repo: str, revision: str, filename: str, count: int) -> bytes:
        """The first ``count`` bytes of the file at ``revision`` (a Range request on its resolve URL)."""
        quoted = "/".join(urllib.parse.quote(part, safe="") for part in filename.split("/"))
        url = (
            f"{self.endpoint.rstrip('/')}/{urllib.parse.quote(repo, safe='/')}/resolve/"
            f"{urllib.parse.quote(revision, safe='')}/{quoted}"
        )
        try:
            answer = self._answer(url, head_bytes=count)
        except _ApiError as exc:
            raise _explain(exc, repo, revision, self.token, self.rate_limit_wait) from None
        if answer.status not in (200, 206):
            raise PinError(f"{redact(answer.url)} answered HTTP {answer.status} to a Range request for its first bytes")
        return answer.body[:count]

    def gguf_header(self, repo: str, revision: str, filename: str, size: int) -> GgufMetadata:
        """The GGUF header of the file at ``revision``, read from its first bytes (more of them while it is cut)."""
        for limit in HEADER_READS:
            count = min(limit, size)
            with tempfile.NamedTemporaryFile(prefix="rigkit-gguf-head-", suffix=".gguf") as head:
                head.write(self._head(repo, revision, filename, count))
                head.flush()
                try:
                    meta = read_gguf_metadata(head.name)
                except GgufError as exc:
                    if "truncated GGUF header" in str(exc) and count < size:
                        continue
                    raise PinError(f"{repo} : {filename} at {revision}: {printable(exc, 300)}") from None
            return dataclasses.replace(meta, path=filename, file_size=size)
        raise PinError(f"{repo} : {filename}: its GGUF header is larger than {HEADER_READS[-1] >> 20} MiB")

    def lookup_file(self, repo: str, revision: str, filename: str) -> FileInfo:
        """Like file_at, but a missing file is an error that says what to check."""
        info = self.file_at(repo, revision, filename)
        if info is None:
            raise PinError(
                f"{filename} does not exist in {repo} at {revision}: check the entry's filename (paths inside the "
                "repository, e.g. MTP/x.gguf) and the revision."
            )
        return info

    def commits(self, repo: str, ref: str, limit: int = MAX_COMMITS) -> Iterator[dict[str, str]]:
        """The commits of ``ref``, newest first: ``{"id", "date", "title"}`` (``/commits/{ref}``, Link pagination).

        A ``next`` page on another origin than the endpoint is refused (the token would follow it), and so is one
        already fetched (a page pointing at itself, or any cycle) and a walk longer than ``MAX_COMMIT_PAGES``.
        Titles and dates are the server's text, made printable.
        """
        url: str | None = f"{self._base(repo)}/commits/{urllib.parse.quote(ref, safe='')}?limit={COMMITS_PER_PAGE}"
        given = 0
        fetched: set[str] = set()
        while url is not None and given < limit:
            if url in fetched:
                raise PinError(
                    f"the commit list of {repo} @ {ref} points its next page back at a page already read "
                    f"({printable(url, 300)}): the endpoint's pagination loops. Pin a commit directly "
                    "(revision=COMMIT) or check --endpoint"
                )
            if len(fetched) >= MAX_COMMIT_PAGES:
                raise PinError(
                    f"the commit list of {repo} @ {ref} still has a next page after {MAX_COMMIT_PAGES} pages "
                    f"({given} commits; next {printable(url, 300)}): stopping. Pin a commit directly (revision=COMMIT)"
                )
            fetched.add(url)
            body, answer = self._get(url, repo, ref)
            if not isinstance(body, list):
                raise PinError(f"the commit list of {repo} @ {ref} is not a list; is --endpoint a Hugging Face API?")
            for item in body:
                commit = item.get("id") if isinstance(item, dict) else None
                if not isinstance(commit, str) or not REVISION_RE.fullmatch(commit):
                    raise PinError(
                        f"the commit list of {repo} @ {ref} holds an entry without a commit id: "
                        f"{printable(repr(item), 200)}"
                    )
                yield {
                    "id": commit,
                    "date": printable(item.get("date") or "", 40),
                    "title": printable(item.get("title") or "", 200),
                }
                given += 1
                if given >= limit:
                    return
            link = _LINK_NEXT_RE.search(answer.header("Link"))
            url = urllib.parse.urljoin(answer.url, link[1]) if link else None
            if url is not None and not same_origin(url, self.endpoint):
                raise PinError(
                    f"the commit list of {repo} points its next page at another host ({printable(url, 300)}); "
                    "refusing it (the token would follow it): check --endpoint"
                )

    def find_commit_with(
        self, repo: str, ref: str, filename: str, sha256: str, limit: int = MAX_COMMITS
    ) -> tuple[CommitFile | None, list[CommitFile]]:
        """Walk ``ref``'s commits newest first; (the first whose file has ``sha256`` or None, every commit seen)."""
        seen: list[CommitFile] = []
        for commit in self.commits(repo, ref, limit):
            try:
                info = self.file_at(repo, commit["id"], filename)
            except NotInLfsError:
                seen.append(CommitFile(commit["id"], commit["date"], commit["title"], note="not stored with Git LFS"))
                continue
            if info is None:
                seen.append(CommitFile(commit["id"], commit["date"], commit["title"], note="file absent"))
                continue
            row = CommitFile(commit["id"], commit["date"], commit["title"], sha256=info.sha256, size=info.size)
            seen.append(row)
            if info.sha256 == sha256:
                return row, seen
        return None, seen
