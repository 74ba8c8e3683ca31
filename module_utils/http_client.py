"""One HTTP client and one redirect policy for everything that talks to Hugging Face (or a mirror of it).

Standard library only (it ships to rigs inside the fetch module). Used by model_fetch.py (the file download,
streamed) and rigkit/pinning/hf_api.py (the JSON API). The policy, applied to every hop:

* only ``https://``; plain ``http://`` only where ``allow_insecure_http`` marks a trusted local endpoint, and
  never as a redirect away from https (no downgrade, whatever the flag says);
* the ``Authorization`` header (the HF token) and cookies go to the origin only: a redirect to another host,
  port or scheme drops them for that hop and every later one (127.0.0.1 and localhost are different hosts);
* the token goes over https only: a plain-http endpoint (a trusted local stand-in or mirror, which never needs
  one) gets no token, even when one is configured or in the environment (``carries_token``);
* at most ``MAX_REDIRECTS`` redirects; 303 (and 301/302 after a POST) continue as a GET without the body,
  307/308 repeat the method and body.

Connections (``open_connection``, shared with the fetcher): an https URL goes through the proxy that
``https_proxy`` / ``HTTPS_PROXY`` names (lowercase first, as curl and huggingface_hub read them) with a CONNECT
tunnel, so TLS runs end to end and the proxy sees only ``host:port``, never a request or the token; ``no_proxy`` /
``NO_PROXY`` (``*``, host names matching themselves and their subdomains, ``.suffix``, IP addresses and CIDR
ranges, each optionally ``:port``) go direct. Plain-http URLs (a trusted local stand-in or mirror) always go direct.
``retry_wait`` reads how long a 429 asks to wait (``Retry-After``, or the ``RateLimit`` header's ``t=``).
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import http.client
import ipaddress
import os
import re
import ssl
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from ansible.module_utils.printable import printable

__all__ = [
    "MAX_REDIRECTS",
    "REDIRECT_STATUSES",
    "HttpClientError",
    "Proxy",
    "Response",
    "UrlRefused",
    "carries_token",
    "check_url",
    "next_hop",
    "open_connection",
    "proxy_for",
    "redact",
    "request",
    "retry_wait",
    "same_origin",
]

MAX_REDIRECTS = 10
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
MAX_BODY_BYTES = 32 * 1024 * 1024  # an API answer larger than this is not one we asked for
_CREDENTIAL_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})
_BODY_HEADERS = frozenset({"content-type", "content-length"})
_DEFAULT_PORTS = {"http": 80, "https": 443}
_DIGITS_RE = re.compile(r"[0-9]{1,9}")  # ASCII digits only: str.isdigit() takes '²', which int() refuses


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


# ------------------------------------------------------------------ how long a 429 asks to wait
def _retry_after_seconds(value: str, now: float) -> float | None:
    """``Retry-After``: delay-seconds or an HTTP date (RFC 9110 10.2.3)."""
    value = value.strip()
    if _DIGITS_RE.fullmatch(value):
        return float(value)
    if not value or not value.isascii():  # int() inside the date parser would take non-ASCII digits
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000": a date in no known zone is no HTTP date (those say GMT)
        return None
    return max(0.0, when.timestamp() - now)


def _ratelimit_reset(value: str) -> float | None:
    """The IETF draft ``RateLimit`` header: ``"api";r=0;t=39`` (the Hub's form) or ``limit=…, reset=39``; the
    longest reset it names."""
    found: list[float] = []
    for item in value.split(","):
        for param in item.split(";"):
            name, _, number = param.partition("=")
            if name.strip().lower() in ("t", "reset") and _DIGITS_RE.fullmatch(number.strip()):
                found.append(float(number.strip()))
    return max(found) if found else None


def retry_wait(retry_after: str | None, ratelimit: str | None, *, now: float | None = None) -> float | None:
    """Seconds until the server's quota resets, from ``Retry-After`` and ``RateLimit`` (the longer when both
    say); None when neither says."""
    now = time.time() if now is None else now
    waits = [
        wait
        for wait in (
            _retry_after_seconds(retry_after, now) if retry_after else None,
            _ratelimit_reset(ratelimit) if ratelimit else None,
        )
        if wait is not None
    ]
    return max(waits) if waits else None


# ------------------------------------------------------------------ proxies
@dataclass(frozen=True)
class Proxy:
    """An HTTP proxy that tunnels https with CONNECT; ``source`` is the environment variable that named it."""

    host: str
    port: int
    source: str
    authorization: str = ""  # Proxy-Authorization for the CONNECT, from the proxy URL's user info

    def __str__(self) -> str:
        return f"{self.host}:{self.port} (from {self.source})"

    def headers(self) -> dict[str, str]:
        return {"Proxy-Authorization": self.authorization} if self.authorization else {}


def _env(environ: Mapping[str, str], name: str) -> tuple[str, str]:
    """(variable, value) of ``name`` in lower case first, then upper case; ("", "") when neither is set."""
    for variable in (name.lower(), name.upper()):
        value = environ.get(variable, "").strip()
        if value:
            return variable, value
    return "", ""


def _split_port(entry: str) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]:port`` or a bare IPv6 address -> (host, port or None)."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif entry.count(":") == 1:
        host, _, port = entry.partition(":")
    else:
        host, port = entry, ""
    return host, int(port) if _DIGITS_RE.fullmatch(port) else None


def _host_matches(host: str, pattern: str) -> bool:
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host) in ipaddress.ip_network(pattern, strict=False)
    pattern = pattern.removeprefix("*").lstrip(".")
    return bool(pattern) and (host == pattern or host.endswith(f".{pattern}"))


def _bypassed(host: str, port: int, no_proxy: str) -> bool:
    for entry in (part.strip().lower() for part in no_proxy.split(",")):
        if entry == "*":
            return True
        pattern, wanted = _split_port(entry)
        if entry and (wanted is None or wanted == port) and _host_matches(host, pattern):
            return True
    return False


def _parse_proxy(value: str, source: str) -> Proxy:
    parts = urllib.parse.urlsplit(value if "://" in value else f"http://{value}")
    try:
        port = parts.port or 80
    except ValueError:
        port = 0
    if parts.scheme.lower() != "http" or not parts.hostname or not port:
        raise HttpClientError(
            f"{source}={redact(value)} is not a proxy this client can use: give http://HOST:PORT (an http proxy; "
            "https still runs end to end through its CONNECT tunnel)"
        )
    authorization = ""
    if parts.username is not None:
        pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
    return Proxy(parts.hostname, port, source, authorization)


def proxy_for(url: str, environ: Mapping[str, str] | None = None) -> Proxy | None:
    """The proxy ``url`` goes through: https only, unless no_proxy names its host; None for a direct connection."""
    environ = os.environ if environ is None else environ
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() != "https":
        return None
    source, value = _env(environ, "https_proxy")
    if not value:
        return None
    _, no_proxy = _env(environ, "no_proxy")
    if _bypassed((parts.hostname or "").lower(), parts.port or 443, no_proxy):
        return None
    return _parse_proxy(value, source)


def open_connection(
    url: str, *, timeout: float, ca_file: str | None = None, environ: Mapping[str, str] | None = None
) -> tuple[http.client.HTTPConnection, Proxy | None]:
    """A connection for ``url``, not connected yet, and the proxy it tunnels through (None: direct)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme.lower() != "https":
        return http.client.HTTPConnection(host, parts.port, timeout=timeout), None
    context = ssl.create_default_context(cafile=ca_file)
    proxy = proxy_for(url, environ)
    if proxy is None:
        return http.client.HTTPSConnection(host, parts.port, timeout=timeout, context=context), None
    conn = http.client.HTTPSConnection(proxy.host, proxy.port, timeout=timeout, context=context)
    conn.set_tunnel(host, parts.port or 443, headers=proxy.headers())  # TLS (and the certificate check) to host
    return conn, proxy


def _target(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


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
        conn, proxy = open_connection(current, timeout=timeout, ca_file=ca_file)
        via = f" through the proxy {proxy}" if proxy else ""
        try:
            conn.request(method, _target(current), body=body, headers=sent)
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
            raise HttpClientError(f"no answer from {redact(current)}{via} within {timeout:g} s") from None
        except (OSError, http.client.HTTPException) as exc:
            raise HttpClientError(f"{redact(current)}{via}: {exc.__class__.__name__}: {printable(exc, 300)}") from None
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
