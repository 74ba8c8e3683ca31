"""The GGUF reader's budget: each hostile header shape is refused, fast, with a message;
real files (the tiny gemma4 pair, the real Gemma 3 270M with its 262k-token vocabulary) still read."""

from __future__ import annotations

import struct
import time
import tracemalloc
from pathlib import Path

import pytest
from ansible.module_utils.gguf_metadata import GgufBudget, GgufError, GgufValueType, read_gguf_metadata

STRING, ARRAY, UINT8, UINT32 = GgufValueType.STRING, GgufValueType.ARRAY, GgufValueType.UINT8, GgufValueType.UINT32


def gguf_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def kv_string(key: str, value: str) -> bytes:
    return gguf_string(key) + struct.pack("<I", STRING) + gguf_string(value)


def kv_array(key: str, item_type: GgufValueType, count: int, items: bytes) -> bytes:
    return gguf_string(key) + struct.pack("<IIQ", ARRAY, item_type, count) + items


def tensor(name: str) -> bytes:
    return gguf_string(name) + struct.pack("<I", 1) + struct.pack("<Q", 0) + struct.pack("<IQ", 0, 0)


def write_gguf(path: Path, kvs: list[bytes], tensors: list[bytes] | None = None, *, claims: int | None = None) -> Path:
    tensors = tensors or []
    count = len(tensors) if claims is None else claims
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, count, len(kvs)) + b"".join(kvs) + b"".join(tensors))
    return path


def base_kvs() -> list[bytes]:
    return [kv_string("general.architecture", "gemma4"), kv_string("general.name", "hostile")]


def refused(path: Path, match: str, budget: GgufBudget | None = None, limit_s: float = 2.0) -> str:
    started = time.monotonic()
    with pytest.raises(GgufError, match=match) as caught:
        read_gguf_metadata(path, **({"budget": budget} if budget else {}))
    assert time.monotonic() - started < limit_s, "refused, but not fast"
    return str(caught.value)


# ------------------------------------------------------------------------------------------ lowered budgets
def test_many_zero_size_tensors(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "t.gguf", base_kvs(), [tensor("") for _ in range(300)])
    assert len(read_gguf_metadata(path).tensors) == 300  # within the default budget
    message = refused(path, "over the reader's budget", GgufBudget(max_tensors=200))
    assert "300 tensors" in message and str(path) in message


def test_many_empty_strings(tmp_path: Path) -> None:
    items = struct.pack("<Q", 0) * 5000
    path = write_gguf(tmp_path / "s.gguf", [*base_kvs(), kv_array("tokenizer.ggml.tokens", STRING, 5000, items)])
    assert read_gguf_metadata(path).array_length("tokenizer.ggml.tokens") == 5000
    refused(path, "past 4000 items", GgufBudget(max_items=4000))


def test_many_keys_of_materialised_arrays(tmp_path: Path) -> None:
    kvs = [kv_array(f"junk.{i}", UINT8, 100, bytes(100)) for i in range(40)]
    path = write_gguf(tmp_path / "k.gguf", [*base_kvs(), *kvs])
    assert len(read_gguf_metadata(path).kv) == 42
    refused(path, "kept array items past 2000", GgufBudget(max_kept_items=2000))
    refused(path, "42 metadata keys", GgufBudget(max_keys=30))


def test_too_many_header_bytes(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "b.gguf", [*base_kvs(), kv_string("general.description", "x" * 50_000)])
    refused(path, "past 20000 bytes", GgufBudget(max_header_bytes=20_000))
    skipped = struct.pack("<Q", 1000) + b"y" * 1000  # 5,000 skipped strings of 1,000 bytes: 5 MB
    big = write_gguf(tmp_path / "b2.gguf", [*base_kvs(), kv_array("t", STRING, 5_000, skipped * 5_000)])
    refused(big, "more than 50000 bytes", GgufBudget(max_header_bytes=50_000))


def test_too_slow(tmp_path: Path) -> None:
    items = struct.pack("<Q", 0) * 300_000
    path = write_gguf(tmp_path / "slow.gguf", [*base_kvs(), kv_array("tokenizer.ggml.tokens", STRING, 300_000, items)])
    refused(path, "longer than 0 s", GgufBudget(max_seconds=0.0))


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    kvs = [*base_kvs(), kv_string("general.architecture", "llama")]
    message = refused(write_gguf(tmp_path / "dup.gguf", kvs), "appears twice")
    assert "'general.architecture'" in message


# ------------------------------------------------------------------------------------------ the real default budget
def test_default_budget_refuses_five_million_tensors_fast(tmp_path: Path) -> None:
    """5 M zero-size tensors would take 73 s and 591 MiB to read: refused from the header's count instead."""
    path = tmp_path / "5m.gguf"
    with open(path, "wb") as handle:
        handle.write(b"GGUF" + struct.pack("<IQQ", 3, 5_000_000, 2) + b"".join(base_kvs()))
        handle.truncate(handle.tell() + 5_000_000 * 28)  # sparse: 5 M descriptors of an empty name, 1 dim
    tracemalloc.start()
    try:
        refused(path, "5000000 tensors, more than 65536", limit_s=1.0)
        assert tracemalloc.get_traced_memory()[1] < 16 * 1024 * 1024
    finally:
        tracemalloc.stop()


def test_default_budget_refuses_fifty_million_empty_strings_fast(tmp_path: Path) -> None:
    path = tmp_path / "50m.gguf"
    with open(path, "wb") as handle:
        handle.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 3) + b"".join(base_kvs()))
        handle.write(gguf_string("tokenizer.ggml.tokens") + struct.pack("<IIQ", ARRAY, STRING, 50_000_000))
        handle.truncate(handle.tell() + 50_000_000 * 8)  # sparse zeros: 50 M empty strings
    refused(path, "50000000 items", limit_s=1.0)


def test_default_budget_reads_a_gemma4_sized_header(tmp_path: Path) -> None:
    """~2,000 tensors and a 262,144-token vocabulary with scores and token types: well inside the budget."""
    vocab = 262_144
    tokens = b"".join(gguf_string(f"tok{i}") for i in range(vocab))
    kvs = [
        *base_kvs(),
        kv_array("tokenizer.ggml.tokens", STRING, vocab, tokens),
        kv_array("tokenizer.ggml.scores", GgufValueType.FLOAT32, vocab, bytes(4 * vocab)),
        kv_array("tokenizer.ggml.token_type", GgufValueType.INT32, vocab, bytes(4 * vocab)),
    ]
    path = write_gguf(tmp_path / "g4.gguf", kvs, [tensor(f"blk.{i}.w") for i in range(2_100)])
    started = time.monotonic()
    meta = read_gguf_metadata(path)
    assert time.monotonic() - started < 5
    assert meta.vocab_size == vocab and len(meta.tensors) == 2_100


def test_real_gemma3_270m_reads_within_the_default_budget(gemma3_270m_gguf: Path) -> None:
    meta = read_gguf_metadata(gemma3_270m_gguf)
    assert meta.vocab_size == 262_144
    materialised = read_gguf_metadata(gemma3_270m_gguf, read_tensors=False, max_array_items=300_000)
    assert len(materialised.kv["tokenizer.ggml.tokens"]) == 262_144
