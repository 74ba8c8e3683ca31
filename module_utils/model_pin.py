"""Pin a model-catalog entry: ask the Hugging Face API for a file's LFS sha256 and size at a commit, record them.

Used by ``rigkit pin`` / ``make pin model=NAME revision=COMMIT`` on the controller (never on rigs).

1. The entry must exist in the catalog file and name its ``repo`` and ``filename``.
2. A revision that is not a full 40-hex commit (``main``, a tag) is resolved once through
   ``GET {endpoint}/api/models/{repo}/revision/{ref}``; the commit is what gets pinned.
3. ``POST {endpoint}/api/models/{repo}/paths-info/{commit}`` with ``paths=<filename>`` (the API
   huggingface_hub's ``get_paths_info`` uses) gives the file's ``lfs.oid`` (its sha256) and ``size``.
4. ``revision`` (double-quoted), ``sha256`` and ``size`` are written into the catalog with ruamel.yaml's
   round-trip mode: comments, order and the other entries stay as they are. An existing, different value is
   never replaced silently: without ``force`` the pin is refused, listing old and new.

The token (``HF_TOKEN``) is optional, sent as a bearer token for gated or private repositories, and never
sent over plain http unless ``allow_insecure_http`` marks a trusted local endpoint.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from ansible.module_utils.atomic_file import write_atomic
from ansible.module_utils.model_catalog import CATALOG_PATH, REVISION_RE, CatalogError, check_deployable

__all__ = ["DEFAULT_ENDPOINT", "FileInfo", "PinError", "PinResult", "lookup_file", "pin_entry", "resolve_revision"]

DEFAULT_ENDPOINT = "https://huggingface.co"
PIN_FIELDS = ("revision", "sha256", "size")
USER_AGENT = "rigkit-pin/1"
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class PinError(Exception):
    """The pin cannot be made; the message says what to do next."""


@dataclass(frozen=True)
class FileInfo:
    sha256: str
    size: int
    commit: str


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


# ---------------------------------------------------------------------------------------------- the API
def _request(
    url: str, *, token: str | None, data: bytes | None = None, timeout: float, allow_insecure_http: bool
) -> tuple[Any, dict[str, str]]:
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme != "https" and not (scheme == "http" and allow_insecure_http):
        raise PinError(
            f"refusing {scheme}:// endpoint {url.split('/api/')[0]}: use https (plain http only for a trusted local "
            "endpoint, with --allow-insecure-http)"
        )
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if data is not None:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    method = "POST" if data is not None else "GET"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310 - scheme checked
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - scheme checked above
            body = response.read()
            return json.loads(body or b"null"), dict(response.headers.items())
    except urllib.error.HTTPError as exc:
        code = exc.headers.get("X-Error-Code") or ""
        message = exc.headers.get("X-Error-Message") or ""
        exc.close()
        raise _ApiError(exc.code, code, message) from None
    except urllib.error.URLError as exc:
        raise PinError(f"cannot reach {url.split('/api/')[0]}: {exc.reason}; check the network or --endpoint") from None
    except (TimeoutError, OSError) as exc:
        raise PinError(f"cannot reach {url.split('/api/')[0]}: {exc}; check the network or --endpoint") from None
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
        hint = "the token was not accepted" if token else "the repository is gated or private: set HF_TOKEN"
        return PinError(f"HTTP 401 for {repo}{detail}: {hint}.")
    if exc.status == 403:
        return PinError(
            f"HTTP 403 for {repo}{detail}: accept the model's license on its page with the account of HF_TOKEN, "
            "or use a token with read access."
        )
    if exc.status == 404 and exc.code == "RevisionNotFound":
        return PinError(f"revision {revision} not found in {repo}{detail}: give a commit of that repository.")
    if exc.status == 404:
        token_hint = "" if token else " (a private or gated repository also answers 404 without HF_TOKEN)"
        return PinError(f"repository {repo} not found{detail}: fix the entry's repo in the catalog{token_hint}.")
    return PinError(f"HTTP {exc.status} from the Hugging Face API for {repo}{detail}; try again later.")


def _api_base(endpoint: str, repo: str) -> str:
    return f"{endpoint.rstrip('/')}/api/models/{urllib.parse.quote(repo, safe='/')}"


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
    url = f"{_api_base(endpoint, repo)}/revision/{urllib.parse.quote(ref, safe='')}"
    try:
        body, _ = _request(url, token=token, timeout=timeout, allow_insecure_http=allow_insecure_http)
    except _ApiError as exc:
        raise _explain(exc, repo, ref, token) from None
    commit = body.get("sha") if isinstance(body, dict) else None
    if not isinstance(commit, str) or not REVISION_RE.match(commit):
        raise PinError(f"the API did not give a commit for {repo} @ {ref}; pass the full 40-character commit")
    return commit


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
    """The file's LFS sha256 and size at ``revision`` (paths-info API)."""
    url = f"{_api_base(endpoint, repo)}/paths-info/{urllib.parse.quote(revision, safe='')}"
    data = urllib.parse.urlencode({"paths": filename, "expand": "false"}).encode()
    try:
        body, headers = _request(url, token=token, data=data, timeout=timeout, allow_insecure_http=allow_insecure_http)
    except _ApiError as exc:
        raise _explain(exc, repo, revision, token) from None
    found = [item for item in body or [] if isinstance(item, dict) and item.get("path") == filename]
    if not found or found[0].get("type") != "file":
        raise PinError(
            f"{filename} does not exist in {repo} at {revision}: check the entry's filename (paths inside the "
            "repository, e.g. MTP/x.gguf) and the revision."
        )
    item = found[0]
    lfs = item.get("lfs")
    if not isinstance(lfs, dict) or not _SHA256_RE.match(str(lfs.get("oid", ""))):
        raise PinError(
            f"{repo} : {filename} is not stored with Git LFS, so the API gives no sha256 for it; pin it by hand "
            "(sha256sum of the file at that revision) in the catalog."
        )
    size = lfs.get("size", item.get("size"))
    if not isinstance(size, int) or size <= 0:
        raise PinError(f"the API gave no usable size for {repo} : {filename} ({size!r})")
    commit = headers.get("X-Repo-Commit") or revision
    return FileInfo(sha256=str(lfs["oid"]), size=size, commit=commit if REVISION_RE.match(commit) else revision)


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
    revision: str,
    *,
    catalog_path: str = CATALOG_PATH,
    endpoint: str = DEFAULT_ENDPOINT,
    token: str | None = None,
    force: bool = False,
    allow_insecure_http: bool = False,
    timeout: float = 30.0,
) -> PinResult:
    """Ask the API and write revision, sha256 and size of ``name`` into the catalog file (see module doc)."""
    yaml, data, text = _load(catalog_path)
    catalog = data["model_catalog"]
    if name not in catalog:
        raise PinError(f"model '{name}' is not in {catalog_path}. Known: {', '.join(sorted(catalog))}")
    entry = catalog[name]
    repo, filename = entry.get("repo"), entry.get("filename")
    if not repo or not filename:
        raise PinError(f"model '{name}' has no repo or filename in {catalog_path}: set them first, then pin")
    repo, filename = str(repo), str(filename)
    if not revision:
        raise PinError(f"give the revision to pin: make pin model={name} revision=COMMIT")
    opts = {"token": token, "timeout": timeout, "allow_insecure_http": allow_insecure_http}
    resolved_from = None
    if not REVISION_RE.match(revision):
        resolved_from = revision
        revision = resolve_revision(endpoint, repo, revision, **opts)
    info = lookup_file(endpoint, repo, revision, filename, **opts)
    new = {"revision": info.commit, "sha256": info.sha256, "size": info.size}
    old = {key: entry.get(key) for key in PIN_FIELDS}
    conflicts = {key: (old[key], new[key]) for key in PIN_FIELDS if old[key] not in (None, "") and old[key] != new[key]}
    if conflicts and not force:
        lines = "\n".join(f"  {key}: {was} -> {now}" for key, (was, now) in conflicts.items())
        raise PinError(
            f"model '{name}' is already pinned differently in {catalog_path}; refusing to replace the pin:\n{lines}\n"
            f"If the new pin is right (a new revision you checked), re-run with force: "
            f"make pin model={name} revision={revision} force=1"
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
