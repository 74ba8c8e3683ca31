"""Pin a model-catalog entry: find its file's commit, LFS sha256 and size through the Hugging Face API, record them.

Used by ``rigkit pin`` / ``make pin model=NAME [revision=REF]`` and ``make pin host=RIG`` on the controller
(never on rigs).

1. The entry must exist in the catalog file and name its ``repo`` and ``filename``.
2. With a trusted sha256 already in the entry (from the seed or a public record), that sha256 is the anchor:
   the commits of ``REF`` (default ``main``) are walked newest first
   (``GET {endpoint}/api/models/{repo}/commits/{ref}``, pages followed through the ``Link`` header) and the
   file is looked up at each (step 4) until one holds exactly that sha256: the NEWEST such commit is pinned
   with its size. When no commit holds it, the pin is refused, listing what each commit holds. ``force``
   drops the anchor: what ``REF`` holds is pinned over the recorded values (a new build you checked).
3. Without one, what ``REF`` holds is pinned: a ref that is not a full 40-hex commit (``main``, a tag) is
   resolved once through ``GET {endpoint}/api/models/{repo}/revision/{ref}``.
4. ``POST {endpoint}/api/models/{repo}/paths-info/{commit}`` with ``paths=<filename>`` (the API
   huggingface_hub's ``get_paths_info`` uses) gives the file's ``lfs.oid`` (its sha256) and ``size``.
5. ``revision`` (double-quoted), ``sha256`` and ``size`` are written into the catalog with ruamel.yaml's
   round-trip mode: comments, order and the other entries stay as they are. An existing, different value is
   never replaced silently: without ``force`` the pin is refused, listing old and new.

``pin_host`` pins, in one go, every entry a rig needs (target and drafter) that is not fully pinned yet.

The token (``HF_TOKEN``) is optional, sent as a bearer token for gated or private repositories. All requests go
through module_utils/http_client.py, the fetcher's client: https only (plain http only for a trusted local
endpoint, never as a downgrade), the token only to the endpoint's own origin, bounded redirects.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ansible.module_utils.atomic_file import write_atomic
from ansible.module_utils.http_client import HttpClientError, Response, UrlRefused, request, same_origin
from ansible.module_utils.model_catalog import (
    CATALOG_PATH,
    REVISION_RE,
    CatalogError,
    check_deployable,
    unpinned_fields,
)

__all__ = [
    "DEFAULT_ENDPOINT",
    "DEFAULT_REVISION",
    "CommitFile",
    "FileInfo",
    "NotInLfsError",
    "PinError",
    "PinResult",
    "file_at",
    "find_commit_with",
    "list_commits",
    "lookup_file",
    "pin_entry",
    "pin_host",
    "resolve_revision",
]

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_REVISION = "main"
PIN_FIELDS = ("revision", "sha256", "size")
USER_AGENT = "rigkit-pin/1"
MAX_COMMITS = 500  # commits walked looking for a trusted sha256 (one paths-info request each)
COMMITS_PER_PAGE = 100
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_LINK_NEXT_RE = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')


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


@dataclass
class PinResult:
    name: str
    catalog: str
    repo: str
    filename: str
    revision: str
    sha256: str
    size: int
    changed: bool
    resolved_from: str | None = None  # the ref the caller gave, when it was not a commit
    previous: dict[str, Any] = field(default_factory=dict)
    anchored: bool = False  # found by walking the commits for the entry's trusted sha256
    walked: int = 0  # commits looked at


# ---------------------------------------------------------------------------------------------- the API
@dataclass(frozen=True)
class _Api:
    endpoint: str
    token: str | None
    timeout: float
    allow_insecure_http: bool

    def base(self, repo: str) -> str:
        return f"{self.endpoint.rstrip('/')}/api/models/{urllib.parse.quote(repo, safe='/')}"

    def call(self, url: str, *, data: bytes | None = None) -> tuple[Any, Response]:
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        endpoint = self.endpoint.rstrip("/")
        try:
            answer = request(
                "POST" if data is not None else "GET",
                url,
                headers=headers,
                body=data,
                token=self.token,
                timeout=self.timeout,
                allow_insecure_http=self.allow_insecure_http,
            )
        except UrlRefused as exc:
            raise PinError(f"{exc}") from None
        except HttpClientError as exc:
            raise PinError(f"cannot reach {endpoint}: {exc}; check the network or --endpoint") from None
        if answer.status >= 400:
            raise _ApiError(answer.status, answer.header("X-Error-Code"), answer.header("X-Error-Message"))
        if not 200 <= answer.status < 300:
            raise PinError(f"{url} answered HTTP {answer.status}; is --endpoint a Hugging Face API?")
        try:
            return json.loads(answer.body or b"null"), answer
        except ValueError:
            raise PinError(f"{url} did not answer JSON; is --endpoint a Hugging Face API?") from None


class _ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


def _explain(exc: _ApiError, repo: str, revision: str, token: str | None) -> PinError:
    detail = f" ({exc.code}: {exc.message})" if exc.code or exc.message else ""
    if exc.status == 401:
        hint = (
            "the token in HF_TOKEN was not accepted: check it (huggingface.co/settings/tokens)"
            if token
            else "the repository is gated or private: set HF_TOKEN to a read token of an account that has access"
        )
        return PinError(f"HTTP 401 for {repo}{detail}: {hint}, then re-run the pin.")
    if exc.status == 403:
        return PinError(
            f"HTTP 403 for {repo}{detail}: accept the model's license on https://huggingface.co/{repo} with the "
            "account of HF_TOKEN, or use a token with read access, then re-run the pin."
        )
    if exc.status == 404 and exc.code == "RevisionNotFound":
        return PinError(f"revision {revision} not found in {repo}{detail}: give a branch, tag or commit of it.")
    if exc.status == 404:
        token_hint = "" if token else " (a private or gated repository also answers 404 without HF_TOKEN)"
        return PinError(f"repository {repo} not found{detail}: fix the entry's repo in the catalog{token_hint}.")
    return PinError(f"HTTP {exc.status} from the Hugging Face API for {repo}{detail}; try again later.")


def _api(endpoint: str, token: str | None, timeout: float, allow_insecure_http: bool) -> _Api:
    return _Api(endpoint=endpoint, token=token, timeout=timeout, allow_insecure_http=allow_insecure_http)


def resolve_revision(
    endpoint: str,
    repo: str,
    ref: str,
    *,
    token: str | None = None,
    timeout: float = 30.0,
    allow_insecure_http: bool = False,
) -> str:
    """The commit a branch or tag points at now."""
    api = _api(endpoint, token, timeout, allow_insecure_http)
    try:
        body, _ = api.call(f"{api.base(repo)}/revision/{urllib.parse.quote(ref, safe='')}")
    except _ApiError as exc:
        raise _explain(exc, repo, ref, token) from None
    commit = body.get("sha") if isinstance(body, dict) else None
    if not isinstance(commit, str) or not REVISION_RE.match(commit):
        raise PinError(f"the API did not give a commit for {repo} @ {ref}; pass the full 40-character commit")
    return commit


def file_at(
    endpoint: str,
    repo: str,
    revision: str,
    filename: str,
    *,
    token: str | None = None,
    timeout: float = 30.0,
    allow_insecure_http: bool = False,
) -> FileInfo | None:
    """The file's LFS sha256 and size at ``revision`` (paths-info API); None when the file is not there."""
    api = _api(endpoint, token, timeout, allow_insecure_http)
    data = urllib.parse.urlencode({"paths": filename, "expand": "false"}).encode()
    try:
        body, answer = api.call(f"{api.base(repo)}/paths-info/{urllib.parse.quote(revision, safe='')}", data=data)
    except _ApiError as exc:
        raise _explain(exc, repo, revision, token) from None
    found = [item for item in body or [] if isinstance(item, dict) and item.get("path") == filename]
    if not found or found[0].get("type") != "file":
        return None
    item = found[0]
    lfs = item.get("lfs")
    if not isinstance(lfs, dict) or not _SHA256_RE.match(str(lfs.get("oid", ""))):
        raise NotInLfsError(
            f"{repo} : {filename} is not stored with Git LFS, so the API gives no sha256 for it; pin it by hand "
            "(sha256sum of the file at that revision) in the catalog."
        )
    size = lfs.get("size", item.get("size"))
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise PinError(f"the API gave no usable size for {repo} : {filename} ({size!r})")
    commit = answer.header("X-Repo-Commit") or revision
    return FileInfo(sha256=str(lfs["oid"]), size=size, commit=commit if REVISION_RE.match(commit) else revision)


def lookup_file(
    endpoint: str,
    repo: str,
    revision: str,
    filename: str,
    *,
    token: str | None = None,
    timeout: float = 30.0,
    allow_insecure_http: bool = False,
) -> FileInfo:
    """Like file_at, but a missing file is an error that says what to check."""
    info = file_at(
        endpoint, repo, revision, filename, token=token, timeout=timeout, allow_insecure_http=allow_insecure_http
    )
    if info is None:
        raise PinError(
            f"{filename} does not exist in {repo} at {revision}: check the entry's filename (paths inside the "
            "repository, e.g. MTP/x.gguf) and the revision."
        )
    return info


def list_commits(
    endpoint: str,
    repo: str,
    ref: str,
    *,
    token: str | None = None,
    timeout: float = 30.0,
    allow_insecure_http: bool = False,
    limit: int = MAX_COMMITS,
) -> Iterator[dict[str, str]]:
    """The commits of ``ref``, newest first: ``{"id", "date", "title"}`` (``/commits/{ref}``, Link pagination).

    A ``next`` page on another origin than the endpoint is refused (the token would follow it).
    """
    api = _api(endpoint, token, timeout, allow_insecure_http)
    url: str | None = f"{api.base(repo)}/commits/{urllib.parse.quote(ref, safe='')}?limit={COMMITS_PER_PAGE}"
    given = 0
    while url is not None and given < limit:
        try:
            body, answer = api.call(url)
        except _ApiError as exc:
            raise _explain(exc, repo, ref, token) from None
        if not isinstance(body, list):
            raise PinError(f"the commit list of {repo} @ {ref} is not a list; is --endpoint a Hugging Face API?")
        for item in body:
            commit = item.get("id") if isinstance(item, dict) else None
            if not isinstance(commit, str) or not REVISION_RE.match(commit):
                raise PinError(f"the commit list of {repo} @ {ref} holds an entry without a commit id: {item!r:.200}")
            yield {"id": commit, "date": str(item.get("date") or ""), "title": str(item.get("title") or "")}
            given += 1
            if given >= limit:
                return
        link = _LINK_NEXT_RE.search(answer.header("Link"))
        url = urllib.parse.urljoin(answer.url, link[1]) if link else None
        if url is not None and not same_origin(url, endpoint):
            raise PinError(f"the commit list of {repo} points its next page at another host ({url}); refusing it")


def find_commit_with(
    endpoint: str,
    repo: str,
    ref: str,
    filename: str,
    sha256: str,
    *,
    token: str | None = None,
    timeout: float = 30.0,
    allow_insecure_http: bool = False,
    limit: int = MAX_COMMITS,
) -> tuple[CommitFile | None, list[CommitFile]]:
    """Walk ``ref``'s commits newest first; (the first whose file has ``sha256`` or None, every commit looked at)."""
    opts: dict[str, Any] = {"token": token, "timeout": timeout, "allow_insecure_http": allow_insecure_http}
    seen: list[CommitFile] = []
    for commit in list_commits(endpoint, repo, ref, limit=limit, **opts):
        try:
            info = file_at(endpoint, repo, commit["id"], filename, **opts)
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


def _walk_table(seen: list[CommitFile]) -> str:
    lines = []
    for row in seen:
        what = f"sha256 {row.sha256}  size {row.size}" if row.sha256 else row.note
        date = f"  {row.date[:10]}" if row.date else ""
        title = f"  {row.title[:60]}" if row.title else ""
        lines.append(f"  {row.commit}{date}  {what}{title}")
    return "\n".join(lines) or "  (no commits)"


# ---------------------------------------------------------------------------------------------- the catalog
def _yaml() -> Any:
    from ruamel.yaml import YAML

    yaml = YAML()  # round-trip: comments, order and quoting survive
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    # Unpinned fields read `null` in the catalog; ruamel would write them as empty values.
    yaml.representer.add_representer(
        type(None), lambda representer, _: representer.represent_scalar("tag:yaml.org,2002:null", "null")
    )
    return yaml


def _load(path: str) -> tuple[Any, Any, str]:
    yaml = _yaml()
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise PinError(f"cannot read the catalog {path}: {exc.strerror or exc}") from None
    data = yaml.load(text)
    if not isinstance(data, dict) or not isinstance(data.get("model_catalog"), dict):
        raise PinError(f"{path} has no model_catalog mapping")
    return yaml, data, text


def _write(path: str, yaml: Any, data: Any, explicit_start: bool) -> None:
    yaml.explicit_start = explicit_start
    write_atomic(path, lambda handle: yaml.dump(data, handle), os.stat(path).st_mode & 0o7777)


def pin_entry(
    name: str,
    revision: str | None = None,
    *,
    catalog_path: str = CATALOG_PATH,
    endpoint: str = DEFAULT_ENDPOINT,
    token: str | None = None,
    force: bool = False,
    allow_insecure_http: bool = False,
    timeout: float = 30.0,
    max_commits: int = MAX_COMMITS,
) -> PinResult:
    """Find the pin of ``name`` (see module doc) and write revision, sha256 and size into the catalog file."""
    yaml, data, text = _load(catalog_path)
    catalog = data["model_catalog"]
    if name not in catalog:
        raise PinError(f"model '{name}' is not in {catalog_path}. Known: {', '.join(sorted(catalog))}")
    entry = catalog[name]
    repo, filename = entry.get("repo"), entry.get("filename")
    if not repo or not filename:
        raise PinError(f"model '{name}' has no repo or filename in {catalog_path}: set them first, then pin")
    repo, filename = str(repo), str(filename)
    ref = revision or DEFAULT_REVISION
    opts: dict[str, Any] = {"token": token, "timeout": timeout, "allow_insecure_http": allow_insecure_http}
    trusted = str(entry.get("sha256") or "")
    resolved_from = None
    walked = 0
    if _SHA256_RE.match(trusted) and not force:
        found, seen = find_commit_with(endpoint, repo, ref, filename, trusted, limit=max_commits, **opts)
        walked = len(seen)
        if found is None:
            capped = f" (the walk stops after {max_commits} commits)" if walked >= max_commits else ""
            raise PinError(
                f"no commit of {repo} @ {ref} holds {filename} with the trusted sha256 {trusted} recorded for "
                f"'{name}' in {catalog_path}{capped}. Found, newest first:\n{_walk_table(seen)}\n"
                "Do not pin another file in its place without checking it: the recorded sha256 is what the kit "
                "trusts. If a listed file is the right one after all (a new build you checked), pin that commit "
                f"over it: make pin model={name} revision=COMMIT force=1"
            )
        assert found.sha256 is not None and found.size is not None
        info = FileInfo(sha256=found.sha256, size=found.size, commit=found.commit)
        resolved_from = None if ref == found.commit else ref
    else:
        commit = ref
        if not REVISION_RE.match(ref):
            resolved_from = ref
            commit = resolve_revision(endpoint, repo, ref, **opts)
        info = lookup_file(endpoint, repo, commit, filename, **opts)
    new = {"revision": info.commit, "sha256": info.sha256, "size": info.size}
    old = {key: entry.get(key) for key in PIN_FIELDS}
    conflicts = {key: (old[key], new[key]) for key in PIN_FIELDS if old[key] not in (None, "") and old[key] != new[key]}
    if conflicts and not force:
        lines = "\n".join(f"  {key}: {was} -> {now}" for key, (was, now) in conflicts.items())
        raise PinError(
            f"model '{name}' is already pinned differently in {catalog_path}; refusing to replace the pin:\n{lines}\n"
            f"If the new pin is right (a new revision you checked), re-run with force: "
            f"make pin model={name} revision={info.commit} force=1"
        )
    result = PinResult(
        name=name,
        catalog=catalog_path,
        repo=repo,
        filename=filename,
        revision=info.commit,
        sha256=info.sha256,
        size=info.size,
        changed=old != new,
        resolved_from=resolved_from,
        previous=old,
        anchored=bool(walked),
        walked=walked,
    )
    if not result.changed:
        return result
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString

    entry["revision"] = DoubleQuotedScalarString(info.commit)
    entry["sha256"] = info.sha256
    entry["size"] = info.size
    try:
        check_deployable(name, {key: entry[key] for key in entry})
    except CatalogError as exc:
        raise PinError(f"the pinned entry would still not be deployable: {exc}") from None
    _write(catalog_path, yaml, data, explicit_start=text.lstrip().startswith("---"))
    return result


def host_models(models_target: Any, models_drafter: Any) -> list[str]:
    """The catalog names a rig needs: its target, then its drafter when it has one."""
    return [str(name) for name in (models_target, models_drafter) if name not in (None, "")]


def pin_host(
    host: str,
    names: list[str],
    *,
    catalog_path: str = CATALOG_PATH,
    endpoint: str = DEFAULT_ENDPOINT,
    token: str | None = None,
    allow_insecure_http: bool = False,
    timeout: float = 30.0,
    max_commits: int = MAX_COMMITS,
) -> tuple[list[PinResult], list[str]]:
    """Pin every entry of ``names`` that is not fully pinned yet; (the pins made, the names already pinned).

    Entries are pinned one after the other; the first failure stops with a PinError naming the entry (the
    pins made before it stay written, so a re-run continues where this one stopped).
    """
    if not names:
        raise PinError(f"{host} names no models (models_target / models_drafter in its host_vars): nothing to pin")
    _, data, _ = _load(catalog_path)
    catalog = data["model_catalog"]
    unknown = [name for name in names if name not in catalog]
    if unknown:
        raise PinError(
            f"{host} names {', '.join(unknown)}, not in {catalog_path}: fix models_target / models_drafter in "
            f"inventory/host_vars/{host}.yml. Known: {', '.join(sorted(catalog))}"
        )
    done: list[PinResult] = []
    already: list[str] = []
    for name in dict.fromkeys(names):
        if not unpinned_fields(dict(catalog[name])):
            already.append(name)
            continue
        try:
            done.append(
                pin_entry(
                    name,
                    None,
                    catalog_path=catalog_path,
                    endpoint=endpoint,
                    token=token,
                    allow_insecure_http=allow_insecure_http,
                    timeout=timeout,
                    max_commits=max_commits,
                )
            )
        except PinError as exc:
            made = f" (pinned before it: {', '.join(r.name for r in done)})" if done else ""
            raise PinError(f"{host}: cannot pin '{name}'{made}: {exc}") from None
    return done, already
