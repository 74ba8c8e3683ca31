"""One HTTP(S) GET of a model file: connect, follow redirects by the kit's policy, map statuses to errors.

Standard library only. Retryable trouble (connection errors, timeouts, 5xx, and a 429 whose reset lies within
``backoff_max``) raises ``Transient`` carrying the wait the server asked for; a 429 asking for longer fails at once
(DownloadError: retrying before the reset only spends more of the quota); access problems raise HttpStatusError
naming repo, revision and file and what to do; a plain-http hop is refused unless ``allow_insecure_http`` marks a
trusted LAN mirror. module_utils/http_client.py holds the redirect policy, the proxy (HTTPS_PROXY / NO_PROXY)
and the reading of Retry-After / RateLimit.
"""

from __future__ import annotations

import contextlib
import http.client
import ssl
import urllib.parse

from ansible.module_utils.fetch.errors import (
    DownloadError,
    HttpStatusError,
    InsecureUrlError,
    TlsError,
    Transient,
)
from ansible.module_utils.fetch.spec import CatalogEntry, FetchOptions
from ansible.module_utils.http_client import (
    MAX_REDIRECTS,
    REDIRECT_STATUSES,
    HttpClientError,
    UrlRefused,
    carries_token,
    check_url,
    next_hop,
    open_connection,
    retry_wait,
)
from ansible.module_utils.printable import printable

USER_AGENT = "rigkit-gguf-fetch/1"
CATALOG = "inventory/group_vars/all/model_catalog.yml"


def check_scheme(url: str, entry: CatalogEntry, opts: FetchOptions) -> None:
    try:
        check_url(url, allow_insecure_http=opts.allow_insecure_http)
    except UrlRefused as exc:
        raise InsecureUrlError(f"{exc} ({entry.where})") from None


def request_headers(opts: FetchOptions, offset: int, url: str) -> dict[str, str]:
    headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
    if opts.token and carries_token(url):
        headers["Authorization"] = f"Bearer {opts.token}"
    if offset:
        headers["Range"] = f"bytes={offset}-"
    return headers


def connect(parts: urllib.parse.SplitResult, opts: FetchOptions) -> http.client.HTTPConnection:
    host = parts.hostname or ""
    try:
        url = urllib.parse.urlunsplit(parts)
        conn, proxy = open_connection(url, timeout=opts.connect_timeout, ca_file=opts.ca_file)
    except HttpClientError as exc:
        raise DownloadError(f"{exc}; fix it and re-run") from None  # DownloadError: a resumable part stays
    via = f" through the proxy {proxy}" if proxy else ""
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
        raise Transient(f"connecting to {host}{via} timed out after {opts.connect_timeout:g} s") from None
    except (OSError, ssl.SSLError) as exc:
        conn.close()
        raise Transient(f"cannot connect to {host}{via}: {exc}") from None
    assert conn.sock is not None
    conn.sock.settimeout(opts.read_timeout)
    return conn


def open_get(
    url: str, headers: dict[str, str], entry: CatalogEntry, opts: FetchOptions
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """GET ``url`` (redirects followed): the connection and a 200, 206 or 416 response; the caller closes."""
    origin = url
    for _ in range(MAX_REDIRECTS + 1):
        parts = urllib.parse.urlsplit(url)
        conn = connect(parts, opts)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        try:
            conn.request("GET", target, headers=headers)
            resp = conn.getresponse()
        except TimeoutError:
            conn.close()
            raise Transient(f"no response within {opts.read_timeout:g} s (read timeout)") from None
        except (http.client.HTTPException, OSError) as exc:
            conn.close()
            raise Transient(f"request failed: {exc.__class__.__name__}: {printable(exc, 300)}") from None
        if resp.status in REDIRECT_STATUSES:
            location = resp.getheader("Location")
            conn.close()
            if not location:
                raise HttpStatusError(f"HTTP {resp.status} without a Location for {entry.where}", resp.status)
            try:  # the shared policy (module_utils/http_client.py): no downgrade, token kept to the origin
                hop = next_hop(
                    current_url=url,
                    origin_url=origin,
                    status=resp.status,
                    location=location,
                    method="GET",
                    headers=headers,
                    body=None,
                    allow_insecure_http=opts.allow_insecure_http,
                )
            except UrlRefused as exc:
                raise InsecureUrlError(f"{exc} ({entry.where})") from None
            url, headers = hop.url, hop.headers
            continue
        if resp.status in (200, 206, 416):
            return conn, resp
        detail = _error_detail(resp)
        conn.close()
        try:
            raise_for_status(resp, detail, origin, entry, opts)
        except Transient as exc:
            raise _within_backoff(exc, resp.status, entry, opts) from None
    raise HttpStatusError(f"more than {MAX_REDIRECTS} redirects for {entry.where}", 310)


def _error_detail(resp: http.client.HTTPResponse) -> str:
    detail = resp.getheader("X-Error-Message") or ""
    code = resp.getheader("X-Error-Code") or ""
    with contextlib.suppress(OSError, http.client.HTTPException):
        resp.read(4096)
    code, detail = printable(code, 100), printable(detail, 300)  # the server's text: no escapes reach a terminal
    return f"{code}: {detail}" if code and detail else code or detail


def _within_backoff(exc: Transient, status: int, entry: CatalogEntry, opts: FetchOptions) -> Exception:
    """``exc``, or for a 429 whose reset lies beyond ``backoff_max`` (the longest wait of the retry loop) the
    failure that says how long the server asked to wait."""
    wait = exc.retry_after
    if status != 429 or wait is None or wait <= opts.backoff_max:
        return exc
    return DownloadError(
        f"{exc}: the server's rate limit resets in {wait:.0f} s, longer than this download waits between attempts "
        f"({opts.backoff_max:g} s), so it stops instead of retrying early. Re-run after {wait:.0f} s (what was "
        "received is kept and resumed); with a token (HF_TOKEN, models_hf_token) the Hub's quota is larger."
    )


def _hint_401(code: str, entry: CatalogEntry, opts: FetchOptions) -> str:
    if opts.token:
        return "the token was not accepted: check it is a valid Hugging Face token with read access"
    if code == "GatedRepo":
        return (
            f"the repository is gated: accept its terms on https://huggingface.co/{entry.repo} and set HF_TOKEN "
            "(models_hf_token) to a read token of that account"
        )
    return (
        f"no such repository, or it is private or gated: check the repo name in the catalog ({CATALOG}), or set "
        "HF_TOKEN (models_hf_token) to a read token of an account with access"
    )


def raise_for_status(
    resp: http.client.HTTPResponse, detail: str, origin: str, entry: CatalogEntry, opts: FetchOptions
) -> None:
    status = resp.status
    where = entry.where
    code = resp.getheader("X-Error-Code") or ""
    extra = f" (server says {detail})" if detail else ""
    if status == 401:
        raise HttpStatusError(f"HTTP 401 for {where}{extra}: {_hint_401(code, entry, opts)}.", status)
    if status == 403:
        raise HttpStatusError(
            f"HTTP 403 for {where}{extra}: access denied. Accept the model's license on huggingface.co with the "
            "account that owns the token, or use a token with read access to this repository.",
            status,
        )
    if status == 404 and code == "RepoNotFound":
        hint = (
            "no such repository, or the token's account has no access to it: check the repo name in the catalog "
            f"({CATALOG}), or use a token of an account with access"
            if opts.token
            else f"no such repository: check the repo name in the catalog ({CATALOG})"
        )
        raise HttpStatusError(f"HTTP 404 for {where}{extra}: {hint}.", status)
    if status == 404:
        raise HttpStatusError(
            f"HTTP 404 for {where}{extra}: no such file at that revision. Check repo, filename and the pinned "
            f"commit in the catalog ({CATALOG}).",
            status,
        )
    if status == 429 or status >= 500:
        ratelimit = resp.getheader("RateLimit") if status == 429 else None
        seconds = retry_wait(resp.getheader("Retry-After"), ratelimit)
        resets = f", rate limited: the quota resets in {seconds:.0f} s" if status == 429 and seconds is not None else ""
        raise Transient(f"HTTP {status} from {urllib.parse.urlsplit(origin).netloc}{extra}{resets}", seconds)
    raise HttpStatusError(f"HTTP {status} for {where}{extra}", status)
