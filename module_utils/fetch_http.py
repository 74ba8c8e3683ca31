"""One HTTP(S) GET of a model file: connect, follow redirects by the kit's policy, map statuses to errors.

Standard library only. Retryable trouble (connection errors, timeouts, 429, 5xx) raises ``Transient``; access
problems raise HttpStatusError naming repo, revision and file and what to do; a plain-http hop is refused unless
``allow_insecure_http`` marks a trusted LAN mirror (module_utils/http_client.py holds the redirect policy).
"""

from __future__ import annotations

import contextlib
import http.client
import re
import ssl
import urllib.parse

from ansible.module_utils.fetch_errors import HttpStatusError, InsecureUrlError, TlsError, Transient
from ansible.module_utils.fetch_spec import CatalogEntry, FetchOptions
from ansible.module_utils.http_client import (
    MAX_REDIRECTS,
    REDIRECT_STATUSES,
    UrlRefused,
    carries_token,
    check_url,
    next_hop,
)
from ansible.module_utils.printable import printable

USER_AGENT = "rigkit-gguf-fetch/1"


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
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        context = ssl.create_default_context(cafile=opts.ca_file)
        conn = http.client.HTTPSConnection(host, parts.port, timeout=opts.connect_timeout, context=context)
    else:
        conn = http.client.HTTPConnection(host, parts.port, timeout=opts.connect_timeout)
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
        raise Transient(f"connecting to {host} timed out after {opts.connect_timeout:g} s") from None
    except (OSError, ssl.SSLError) as exc:
        conn.close()
        raise Transient(f"cannot connect to {host}: {exc}") from None
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
        raise_for_status(resp, detail, origin, entry, opts)
    raise HttpStatusError(f"more than {MAX_REDIRECTS} redirects for {entry.where}", 310)


def _error_detail(resp: http.client.HTTPResponse) -> str:
    detail = resp.getheader("X-Error-Message") or ""
    code = resp.getheader("X-Error-Code") or ""
    with contextlib.suppress(OSError, http.client.HTTPException):
        resp.read(4096)
    code, detail = printable(code, 100), printable(detail, 300)  # the server's text: no escapes reach a terminal
    return f"{code}: {detail}" if code and detail else code or detail


def raise_for_status(
    resp: http.client.HTTPResponse, detail: str, origin: str, entry: CatalogEntry, opts: FetchOptions
) -> None:
    status = resp.status
    where = entry.where
    extra = f" (server says {detail})" if detail else ""
    if status == 401:
        hint = (
            "the token was not accepted: check it is a valid Hugging Face token"
            if opts.token
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
        # delay-seconds only, ASCII digits (str.isdigit() takes '²', which float() refuses); an HTTP-date is ignored
        delay = (retry_after or "").strip()
        seconds = float(delay) if re.fullmatch(r"[0-9]{1,9}", delay) else None
        raise Transient(f"HTTP {status} from {urllib.parse.urlsplit(origin).netloc}{extra}", seconds)
    raise HttpStatusError(f"HTTP {status} for {where}{extra}", status)
