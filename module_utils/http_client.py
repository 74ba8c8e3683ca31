"""One HTTP client and one redirect policy for everything that talks to Hugging Face (or a mirror of it).

Standard library only (it ships to rigs inside the fetch module). Used by model_fetch.py (the file download,
streamed) and rigkit/hf_api.py (the JSON API). The policy, applied to every hop:

* only ``https://``; plain ``http://`` only where ``allow_insecure_http`` marks a trusted local endpoint, and
  never as a redirect away from https (no downgrade, whatever the flag says);
* the ``Authorization`` header (the HF token) and cookies go to the origin only: a redirect to another host,
  port or scheme drops them for that hop and every later one (127.0.0.1 and localhost are different hosts);
* the token goes over https only: a plain-http endpoint (a trusted local stand-in or mirror, which never needs
  one) gets no token, even when one is configured or in the environment (``carries_token``);
* at most ``MAX_REDIRECTS`` redirects; 303 (and 301/302 after a POST) continue as a GET without the body,
  307/308 repeat the method and body.
"""

from __future__ import annotations

import http.client
import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from ansible.module_utils.printable import printable

__all__ = [
    "MAX_REDIRECTS",
    "REDIRECT_STATUSES",
    "HttpClientError",
    "Response",
    "UrlRefused",
    "carries_token",
    "check_url",
    "next_hop",
    "redact",
    "request",
    "same_origin",
]

MAX_REDIRECTS = 10
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
MAX_BODY_BYTES = 32 * 1024 * 1024  # an API answer larger than this is not one we asked for
_CREDENTIAL_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})
_BODY_HEADERS = frozenset({"content-type", "content-length"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


class UrlRefused(Exception):
    """A URL (the first one or a redirect target) the policy does not allow; the message says why and what to do."""


class HttpClientError(Exception):
    """The request could not be completed (connection, TLS, protocol, too many redirects)."""


def redact(url: str) -> str:
    """The URL without user info, query or fragment (CDN redirects carry signatures in the query), printable (a
    redirect's Location is the server's text)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return printable(urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", "")), 500)


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(scheme)


def same_origin(a: str, b: str) -> bool:
    """Same scheme, host (as written: an IP and a name for it differ) and port."""
    return _origin(a) == _origin(b)


def carries_token(url: str) -> bool:
    """Whether a request to ``url`` may carry the HF token: over https only, never in clear text."""
    return urllib.parse.urlsplit(url).scheme.lower() == "https"


def check_url(url: str, *, allow_insecure_http: bool, redirect_from: str | None = None) -> None:
    """Raise UrlRefused unless ``url`` may be requested (``redirect_from``: the URL that redirected to it)."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    what = "a redirect to" if redirect_from is not None else "the base URL"
    if not urllib.parse.urlsplit(url).hostname:
        raise UrlRefused(f"refusing {what} {redact(url)}: it names no host")
    if scheme == "https":
        return
    if scheme == "http":
        if redirect_from is not None and urllib.parse.urlsplit(redirect_from).scheme.lower() == "https":
            raise UrlRefused(
                f"refusing a redirect to plain http:// ({redact(url)}) from {redact(redirect_from)}: a downgrade "
                "from https would send the request (and any token) unencrypted. The server is misconfigured or "
                "something on the way rewrites its answers; use another endpoint."
            )
        if allow_insecure_http:
            return
        raise UrlRefused(
            f"refusing {what} plain http:// ({redact(url)}): the model and the token would travel unencrypted and "
            "unauthenticated. Use https, or allow plain http only for a trusted local endpoint "
            "(allow_insecure_http / --allow-insecure-http)."
        )
    raise UrlRefused(f"refusing {what} {redact(url)}: unsupported URL scheme {scheme!r}")


@dataclass
class Hop:
    """What to request next after a redirect."""

    url: str
    method: str
    headers: dict[str, str]
    body: bytes | None


def next_hop(
    *,
    current_url: str,
    origin_url: str,
    status: int,
    location: str | None,
    method: str,
    headers: Mapping[str, str],
    body: bytes | None,
    allow_insecure_http: bool,
) -> Hop:
    """Apply the policy to one redirect answer (``status`` in REDIRECT_STATUSES) from ``current_url``."""
    if not location:
        raise HttpClientError(f"HTTP {status} without a Location header from {redact(current_url)}")
    url = urllib.parse.urljoin(current_url, location.strip())
    check_url(url, allow_insecure_http=allow_insecure_http, redirect_from=current_url)
    kept = dict(headers)
    if not same_origin(url, origin_url):
        kept = {name: value for name, value in kept.items() if name.lower() not in _CREDENTIAL_HEADERS}
    if status == 303 or (status in (301, 302) and method.upper() == "POST"):
        method, body = "GET", None
        kept = {name: value for name, value in kept.items() if name.lower() not in _BODY_HEADERS}
    return Hop(url=url, method=method, headers=kept, body=body)


@dataclass
class Response:
    status: int
    url: str  # the URL that answered (after redirects)
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names
    body: bytes = b""

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name.lower(), default)


def _connection(url: str, timeout: float, ca_file: str | None) -> tuple[http.client.HTTPConnection, str]:
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    conn: http.client.HTTPConnection
    if parts.scheme.lower() == "https":
        conn = http.client.HTTPSConnection(
            host, parts.port, timeout=timeout, context=ssl.create_default_context(cafile=ca_file)
        )
    else:
        conn = http.client.HTTPConnection(host, parts.port, timeout=timeout)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return conn, target


def request(
    method: str,
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    token: str | None = None,
    timeout: float = 30.0,
    allow_insecure_http: bool = False,
    ca_file: str | None = None,
    max_redirects: int = MAX_REDIRECTS,
    max_body: int = MAX_BODY_BYTES,
) -> Response:
    """One request with its redirects followed under the policy; any final status is returned, not raised.

    ``token`` goes out as ``Authorization: Bearer`` to ``url``'s origin only. Raises UrlRefused for a URL the
    policy refuses and HttpClientError when no answer could be had.
    """
    check_url(url, allow_insecure_http=allow_insecure_http)
    sent = dict(headers or {})
    if token and carries_token(url):
        if not token.isascii() or not token.isprintable() or " " in token:
            raise HttpClientError(
                "the token contains whitespace or non-printable characters; use the bare hf_... token"
            )
        sent["Authorization"] = f"Bearer {token}"
    current = url
    for _ in range(max_redirects + 1):
        conn, target = _connection(current, timeout, ca_file)
        try:
            conn.request(method, target, body=body, headers=sent)
            resp = conn.getresponse()
            data = resp.read(max_body + 1)
            answer = Response(
                status=resp.status, url=current, headers={k.lower(): v for k, v in resp.getheaders()}, body=data
            )
        except ssl.SSLCertVerificationError as exc:
            raise HttpClientError(
                f"TLS certificate of {urllib.parse.urlsplit(current).hostname} not trusted ({exc.verify_message}); "
                "never disable verification: fix the endpoint or its CA"
            ) from None
        except TimeoutError:
            raise HttpClientError(f"no answer from {redact(current)} within {timeout:g} s") from None
        except (OSError, http.client.HTTPException) as exc:
            raise HttpClientError(f"{redact(current)}: {exc.__class__.__name__}: {printable(exc, 300)}") from None
        finally:
            conn.close()
        if len(answer.body) > max_body:
            raise HttpClientError(f"{redact(current)} answered more than {max_body} bytes; not an API answer")
        if answer.status not in REDIRECT_STATUSES:
            return answer
        hop = next_hop(
            current_url=current,
            origin_url=url,
            status=answer.status,
            location=answer.header("Location") or None,
            method=method,
            headers=sent,
            body=body,
            allow_insecure_http=allow_insecure_http,
        )
        current, method, sent, body = hop.url, hop.method, hop.headers, hop.body
    raise HttpClientError(f"more than {max_redirects} redirects from {redact(url)}")
