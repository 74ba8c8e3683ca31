"""What the drafter benchmark sends to a llama-server, and how one measured cell is taken (stdlib only).

A cell is (prompt kind, concurrency) at whatever draft setting the server runs now. Every request is greedy,
bypasses the prompt cache (`cache_prompt: false`) and starts with a fresh nonce, so no request reuses another's
KV cache. Before each cell, one warm-up round at the same shape (kind and concurrency) is sent and discarded.

Used by library/llama_server_bench.py on the rig and by tests/gpu on the GPU machine, so both measure alike.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from ansible.module_utils.llama_server.api import (
    Endpoint,
    ServerApiError,
    StreamedCompletion,
    apply_template,
    metrics,
    stream_completion,
)

# Prompt kinds: what the drafter sees differs in predictability (code and JSON repeat, prose does not).
PROMPT_KINDS: dict[str, dict[str, Any]] = {
    "code": {
        "prompt": "# Python 3\ndef merge_sorted(left: list[int], right: list[int]) -> list[int]:\n"
        '    """Merge two sorted lists into one sorted list."""\n',
    },
    "prose": {
        "prompt": "Write a short story about a lighthouse keeper who finds a message in a bottle.\n\n"
        "The fog came in early that evening,",
    },
    "chat": {
        "messages": [
            {"role": "user", "content": "Explain in a few sentences how a bicycle's gears make hills easier."},
        ],
    },
    "structured": {
        "prompt": "Return the three largest cities of Japan as JSON with fields name and population.\n",
        "json_schema": {
            "type": "object",
            "properties": {
                "cities": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}, "population": {"type": "integer"}},
                        "required": ["name", "population"],
                    },
                },
            },
            "required": ["cities"],
        },
    },
}

SPEC_METRICS = {
    "drafts": "llamacpp:spec_decode_num_drafts_total",
    "draft_tokens": "llamacpp:spec_decode_num_draft_tokens_total",
    "accepted_tokens": "llamacpp:spec_decode_num_accepted_tokens_total",
}


class BenchError(Exception):
    """A cell could not be measured."""


@dataclass(frozen=True)
class RequestSample:
    ttft_ms: float | None
    decode_tps_client: float | None
    predicted_n: int
    server_predicted_per_second: float | None
    server_prompt_ms: float | None
    draft_n: int
    draft_n_accepted: int
    wall_s: float


@dataclass(frozen=True)
class CellSample:
    kind: str
    concurrency: int
    requests: list[RequestSample]
    aggregate_tps: float
    metric_drafts: float | None
    metric_draft_tokens: float | None
    metric_accepted_tokens: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _nonce() -> str:
    return uuid.uuid4().hex[:12]


def request_body(endpoint: Endpoint, kind: str, n_predict: int, seed: int) -> dict[str, Any]:
    """The /completion body for one request of `kind`, with a fresh nonce in front of the prompt."""
    if kind not in PROMPT_KINDS:
        raise BenchError(f"unknown prompt kind {kind!r}: choose from {', '.join(PROMPT_KINDS)}")
    spec = PROMPT_KINDS[kind]
    nonce = _nonce()
    if "messages" in spec:
        messages = [dict(message) for message in spec["messages"]]
        messages[0]["content"] = f"(request {nonce}) {messages[0]['content']}"
        prompt = apply_template(endpoint, messages)
    else:
        prompt = f"[request {nonce}]\n{spec['prompt']}"
    body: dict[str, Any] = {
        "prompt": prompt,
        "n_predict": n_predict,
        "temperature": 0,
        "seed": seed,
        "cache_prompt": False,
        "ignore_eos": True,  # every request decodes n_predict tokens: cells compare equal work
    }
    if "json_schema" in spec:
        body["json_schema"] = spec["json_schema"]
    return body


def _sample(result: StreamedCompletion, wall_s: float) -> RequestSample:
    timings = result.timings
    return RequestSample(
        ttft_ms=result.ttft_ms,
        decode_tps_client=result.decode_tps,
        predicted_n=result.predicted_n,
        server_predicted_per_second=timings.get("predicted_per_second"),
        server_prompt_ms=timings.get("prompt_ms"),
        draft_n=int(timings.get("draft_n", 0)),
        draft_n_accepted=int(timings.get("draft_n_accepted", 0)),
        wall_s=wall_s,
    )


def _round(endpoint: Endpoint, kind: str, concurrency: int, n_predict: int, seed: int) -> tuple[list, float]:
    """`concurrency` requests released together; returns their samples and the round's wall time."""
    bodies = [request_body(endpoint, kind, n_predict, seed) for _ in range(concurrency)]
    results: list[tuple[StreamedCompletion, float] | Exception] = [ServerApiError("not run")] * concurrency
    barrier = threading.Barrier(concurrency)

    def worker(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            started = time.monotonic()
            streamed = stream_completion(endpoint, bodies[index])
            results[index] = (streamed, time.monotonic() - started)
        except Exception as exc:  # reported below with the request it broke
            results[index] = exc

    threads = [threading.Thread(target=worker, args=(index,), daemon=True) for index in range(concurrency)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - started
    failures = [result for result in results if isinstance(result, Exception)]
    if failures:
        raise BenchError(f"{kind} x{concurrency}: {failures[0]}")
    return [result for result in results if not isinstance(result, Exception)], wall


def _spec_counters(endpoint: Endpoint) -> dict[str, float] | None:
    try:
        values = metrics(endpoint)
    except ServerApiError:
        return None
    return {key: values.get(name, 0.0) for key, name in SPEC_METRICS.items()}


def measure_cell(
    endpoint: Endpoint, kind: str, concurrency: int, n_predict: int, warmup: int = 1, seed: int = 1
) -> CellSample:
    """Warm up at this shape, then measure one round of `concurrency` simultaneous requests."""
    if concurrency < 1:
        raise BenchError(f"concurrency must be at least 1, got {concurrency}")
    for _ in range(warmup):
        _round(endpoint, kind, concurrency, n_predict, seed)
    before = _spec_counters(endpoint)
    streamed, wall = _round(endpoint, kind, concurrency, n_predict, seed)
    after = _spec_counters(endpoint)
    delta = {key: after[key] - before[key] for key in SPEC_METRICS} if before and after else {}
    samples = [_sample(result, request_wall) for result, request_wall in streamed]
    tokens = sum(sample.predicted_n for sample in samples)
    return CellSample(
        kind=kind,
        concurrency=concurrency,
        requests=samples,
        aggregate_tps=tokens / wall if wall > 0 else 0.0,
        metric_drafts=delta.get("drafts"),
        metric_draft_tokens=delta.get("draft_tokens"),
        metric_accepted_tokens=delta.get("accepted_tokens"),
    )


def measure_setting(
    endpoint: Endpoint,
    kinds: list[str],
    concurrency: list[int],
    n_predict: int,
    warmup: int = 1,
    repeats: int = 1,
) -> list[CellSample]:
    """Every (kind, concurrency) cell at the server's current setting, `repeats` times each."""
    unknown = [kind for kind in kinds if kind not in PROMPT_KINDS]
    if unknown:
        raise BenchError(f"unknown prompt kind(s) {', '.join(unknown)}: choose from {', '.join(PROMPT_KINDS)}")
    cells = []
    for _, kind, level in itertools.product(range(repeats), kinds, concurrency):
        cells.append(measure_cell(endpoint, kind, level, n_predict, warmup))
    return cells
