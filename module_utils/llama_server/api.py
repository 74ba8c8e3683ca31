"""A small client for llama-server's HTTP API (stdlib only: it also runs on rigs).

Used by the rollout probe (library/llama_server_probe.py) and by the kit's tests and tools, so every
reader of /health, /completion, /slots and /metrics parses them the same way.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class ServerApiError(Exception):
    """The server answered with an error, or not at all."""


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """A client context that verifies the server against `ca_file` (the rig's own certificate, self-signed or a
    CA-issued leaf: partial chains are trusted) or the system's CAs; hostnames are always checked."""
    context = ssl.create_default_context(cafile=ca_file)
    if ca_file:
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


# The connection options of every module that talks to the server (documented once: doc_fragments/
# rigkit_server_client.py); the key is no_log, so Ansible scrubs it from every result and log line.
CLIENT_ARGUMENT_SPEC: dict[str, dict[str, Any]] = {
    "api_key": {"type": "str", "no_log": True},
    "ca_file": {"type": "path"},
}


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 30.0
    # The certificate (PEM file) an https:// server is verified against; None: the system's CAs.
    ca_file: str | None = None

    def __post_init__(self) -> None:
        if self.ca_file and not self.base_url.startswith("https://"):
            raise ServerApiError(
                f"{self.base_url}: a certificate to verify against ({self.ca_file}) was given for a plain http:// "
                "URL; the server serves TLS, so use https://"
            )

    def open(self, request: urllib.request.Request) -> Any:
        """urlopen with this endpoint's timeout and, for https://, its verified TLS context."""
        context = tls_context(self.ca_file) if self.base_url.startswith("https://") else None
        return urllib.request.urlopen(request, timeout=self.timeout, context=context)  # noqa: S310 - http(s) only

    def request(self, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.base_url.rstrip("/") + path, data=data, headers=headers)  # noqa: S310
        try:
            with self.open(request) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            # HTTPException: not HTTP at all, e.g. a TLS server's alert read by a plain http:// client
            raise ServerApiError(f"{self.base_url}{path}: {getattr(exc, 'reason', exc)}") from exc

    def get_json(self, path: str, body: dict[str, Any] | None = None) -> Any:
        status, payload = self.request(path, body)
        if status != 200:
            raise ServerApiError(f"{self.base_url}{path}: HTTP {status}: {payload[:300].decode(errors='replace')}")
        return json.loads(payload)


def health(endpoint: Endpoint) -> tuple[int, str]:
    """(HTTP status, body): 503 while the model loads, 200 once it serves; (0, reason) when nothing answers."""
    try:
        status, payload = endpoint.request("/health")
    except ServerApiError as exc:
        return 0, str(exc)
    return status, payload.decode(errors="replace")


def wait_ready(
    endpoint: Endpoint,
    timeout: float,
    still_alive: Callable[[], str | None] = lambda: None,
    interval: float = 1.0,
) -> float:
    """Poll /health until 200; return seconds waited. `still_alive` returns a reason once waiting is pointless."""
    start = time.monotonic()
    last = (0, "no answer yet")
    while time.monotonic() - start < timeout:
        last = health(endpoint)
        if last[0] == 200:
            return time.monotonic() - start
        reason = still_alive()
        if reason:
            raise ServerApiError(f"the server stopped before it became healthy: {reason}")
        time.sleep(interval)
    raise ServerApiError(f"/health did not answer 200 within {timeout:.0f} s (last: {last[0]} {last[1][:200]})")


@dataclass(frozen=True)
class Completion:
    content: str
    timings: dict[str, Any]

    @property
    def draft_n(self) -> int:
        return int(self.timings.get("draft_n", 0))

    @property
    def draft_n_accepted(self) -> int:
        return int(self.timings.get("draft_n_accepted", 0))

    @property
    def acceptance(self) -> float | None:
        return self.draft_n_accepted / self.draft_n if self.draft_n else None


def complete(endpoint: Endpoint, prompt: str, n_predict: int = 32, **options: Any) -> Completion:
    """A greedy completion that bypasses the prompt cache, so every call does the same work."""
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "cache_prompt": False, "seed": 1, **options}
    answer = endpoint.get_json("/completion", body)
    return Completion(content=answer.get("content", ""), timings=answer.get("timings", {}))


def speculative_slots(endpoint: Endpoint) -> list[bool]:
    """Whether each slot drafts (the one endpoint that shows the drafter is active)."""
    return [bool(slot.get("speculative")) for slot in endpoint.get_json("/slots")]


def metrics(endpoint: Endpoint) -> dict[str, float]:
    """Prometheus text from /metrics (needs --metrics) as {name{labels}: value}."""
    status, payload = endpoint.request("/metrics")
    if status != 200:
        raise ServerApiError(f"{endpoint.base_url}/metrics: HTTP {status} (is llama_server_metrics on?)")
    values: dict[str, float] = {}
    for line in payload.decode(errors="replace").splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            values[name] = float(value)
        except ValueError:
            continue
    return values


def build_info(endpoint: Endpoint) -> str:
    """`b<build>-<commit>` as the server reports it in /props."""
    return str(endpoint.get_json("/props").get("build_info", ""))


@dataclass(frozen=True)
class StreamedCompletion:
    """One streamed completion as the client saw it (monotonic seconds) plus the server's final timings."""

    sent_at: float
    first_token_at: float | None
    last_token_at: float | None
    token_events: int
    content: str
    timings: dict[str, Any]

    @property
    def predicted_n(self) -> int:
        return int(self.timings.get("predicted_n", self.token_events))

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first_token_at is None else (self.first_token_at - self.sent_at) * 1000.0

    @property
    def decode_tps(self) -> float | None:
        """Tokens per second after the first token, from the client's clock (drafts arrive in bursts)."""
        if self.first_token_at is None or self.last_token_at is None or self.predicted_n < 2:
            return None
        span = self.last_token_at - self.first_token_at
        return (self.predicted_n - 1) / span if span > 0 else None


def stream_completion(endpoint: Endpoint, body: dict[str, Any]) -> StreamedCompletion:
    """POST /completion with `stream: true`; time the first and last token events as they arrive."""
    headers = {"Accept": "text/event-stream", "Content-Type": "application/json"}
    if endpoint.api_key:
        headers["Authorization"] = f"Bearer {endpoint.api_key}"
    data = json.dumps({**body, "stream": True}).encode()
    url = endpoint.base_url.rstrip("/") + "/completion"
    request = urllib.request.Request(url, data=data, headers=headers)  # noqa: S310
    sent_at = time.monotonic()
    first = last = None
    events = 0
    parts: list[str] = []
    timings: dict[str, Any] = {}
    try:
        with endpoint.open(request) as response:
            for raw in response:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                event = json.loads(line[5:])
                now = time.monotonic()
                if event.get("content"):
                    events += 1
                    first = now if first is None else first
                    last = now
                    parts.append(event["content"])
                if event.get("stop"):
                    timings = event.get("timings", {})
                    break
    except urllib.error.HTTPError as exc:
        raise ServerApiError(f"{url}: HTTP {exc.code}: {exc.read()[:300].decode(errors='replace')}") from exc
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise ServerApiError(f"{url}: {getattr(exc, 'reason', exc)}") from exc
    return StreamedCompletion(sent_at, first, last, events, "".join(parts), timings)


def apply_template(endpoint: Endpoint, messages: list[dict[str, str]]) -> str:
    """The model's own chat template applied by the server (POST /apply-template)."""
    return str(endpoint.get_json("/apply-template", {"messages": messages}).get("prompt", ""))


def total_slots(endpoint: Endpoint) -> int:
    return int(endpoint.get_json("/props").get("total_slots", 1))
