"""The fetcher's threaded sha256 and its part writer (module_utils/fetch/hash.py, part.py),
alone on constructed data and through fetch_model against the real Hugging Face stand-in. Behaviour only: the
speed is measured by tests/bench/bench_fetch.py, never asserted here."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import ansible.module_utils.fetch.model as model_fetch
import pytest
from ansible.module_utils.fetch.hash import HasherError, ThreadedHasher, sha256_file
from ansible.module_utils.fetch.model import DownloadError, VerificationError, fetch_model
from ansible.module_utils.fetch.part import PartWriter

from tests.fixtures.hf_standin import Fault, HfStandin
from tests.support import Served, assert_installed, assert_untouched, describe, options, part_of, seed_previous

MiB = 1024 * 1024


def constructed(size: int, seed: int = 3) -> bytes:
    """Deterministic bytes with no period a short buffer could hide (each MiB differs)."""
    blocks = []
    for i in range(0, size, 32):
        blocks.append(hashlib.sha256(f"{seed}:{i}".encode()).digest())
    return b"".join(blocks)[:size]


def hash_in_pieces(data: bytes, chunk: int, depth: int, piece: int) -> str:
    with ThreadedHasher(chunk, depth) as hasher:
        pos = 0
        while pos < len(data):
            view = hasher.take()
            n = min(piece, len(view), len(data) - pos)
            view[:n] = data[pos : pos + n]
            hasher.submit(view, n)
            pos += n
        return hasher.hexdigest()


@pytest.mark.parametrize(
    ("size", "chunk", "depth", "piece"),
    [
        (0, 1024, 2, 1024),  # nothing submitted: the hash of no bytes
        (1, 1024, 2, 1024),
        (10 * MiB + 17, MiB, 4, MiB),  # the pool of 4 buffers cycles many times
        (3 * MiB + 5, MiB, 2, 333_333),  # partly filled buffers, odd sizes
    ],
)
def test_threaded_hash_equals_hashlib(size: int, chunk: int, depth: int, piece: int) -> None:
    data = constructed(size)
    assert hash_in_pieces(data, chunk, depth, piece) == hashlib.sha256(data).hexdigest()


def test_reset_starts_the_hash_over_after_queued_buffers(tmp_path: Path) -> None:
    first, second = constructed(5 * MiB, seed=1), constructed(2 * MiB + 3, seed=2)
    with ThreadedHasher(MiB, 3) as hasher:
        for pos in range(0, len(first), MiB):
            view = hasher.take()
            n = min(MiB, len(first) - pos)
            view[:n] = first[pos : pos + n]
            hasher.submit(view, n)
        hasher.reset()  # the part restarted from byte 0: nothing of `first` may count
        path = tmp_path / "second"
        path.write_bytes(second)
        with open(path, "rb", buffering=0) as handle:
            assert hasher.feed(handle, len(second) + 100) == len(second)  # stops at EOF
        assert hasher.hexdigest() == hashlib.sha256(second).hexdigest()


def test_feed_hashes_exactly_the_prefix_asked_for(tmp_path: Path) -> None:
    data = constructed(4 * MiB + 1)
    path = tmp_path / "part"
    path.write_bytes(data)
    with ThreadedHasher(MiB, 2) as hasher, open(path, "rb", buffering=0) as handle:
        assert hasher.feed(handle, 3 * MiB + 7) == 3 * MiB + 7
        assert hasher.hexdigest() == hashlib.sha256(data[: 3 * MiB + 7]).hexdigest()
    assert sha256_file(str(path)) == hashlib.sha256(data).hexdigest()


class _FailingSha:
    """A sha256 whose update fails after ``good`` calls (as a worker killed by a fault would stop)."""

    def __init__(self, good: int) -> None:
        self.inner = hashlib.sha256()
        self.good = good

    def update(self, data: Any) -> None:
        if self.good <= 0:
            raise MemoryError("injected failure in the hash thread")
        self.good -= 1
        self.inner.update(data)

    def hexdigest(self) -> str:
        return self.inner.hexdigest()


def test_a_failed_worker_surfaces_as_an_error_not_a_hang() -> None:
    hasher = ThreadedHasher(1024, 2, factory=lambda: _FailingSha(good=1))
    try:
        with pytest.raises(HasherError, match=r"sha256 thread failed \(MemoryError: injected"):
            for _ in range(10):  # the pool has 2 buffers: the third take() would wait forever on a dead worker
                view = hasher.take()
                hasher.submit(view, 1024)
            hasher.hexdigest()
    finally:
        hasher.close()


def test_a_gone_worker_surfaces_as_an_error() -> None:
    hasher = ThreadedHasher(1024, 2)
    hasher.close()  # the thread has ended
    with pytest.raises(HasherError, match="thread is gone"):
        hasher.take()
    with pytest.raises(HasherError, match="thread is gone"):
        hasher.hexdigest()


def test_part_writer_writes_at_the_offset_and_restarts_empty(tmp_path: Path) -> None:
    path = tmp_path / "x.part"
    path.write_bytes(b"kept-")
    data = constructed(3 * MiB + 11)
    with open(path, "r+b", buffering=0) as handle:
        writer = PartWriter(handle, 5)
        for pos in range(0, len(data), 700_000):
            writer.write(memoryview(data)[pos : pos + 700_000])
        writer.durable()
        assert writer.offset == 5 + len(data)
    assert path.read_bytes() == b"kept-" + data
    with open(path, "r+b", buffering=0) as handle:
        writer = PartWriter(handle, os.fstat(handle.fileno()).st_size)
        writer.restart()
        writer.write(memoryview(b"again"))
    assert path.read_bytes() == b"again"


def test_part_writer_flushes_in_the_background_while_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every flush_every bytes a thread of its own fdatasyncs the part (the real call, counted), the writing thread
    goes on, and durable() still ends with the fsync of the whole file."""
    flushed: list[int] = []
    real = os.fdatasync

    def counting(fd: int) -> None:
        flushed.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    path = tmp_path / "x.part"
    data = constructed(5 * MiB + 3)
    with open(path, "w+b", buffering=0) as handle, PartWriter(handle, 0, flush_every=MiB) as writer:
        for pos in range(0, len(data), 256 * 1024):
            writer.write(memoryview(data)[pos : pos + 256 * 1024])
        writer.durable()
        assert flushed and set(flushed) == {handle.fileno()}
    assert path.read_bytes() == data


def test_part_writer_raises_a_failed_background_flush(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writeback error is reported once per open file by the kernel: the one a background flush saw must fail
    durable(), even when the final fsync succeeds (so the part is never installed)."""

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    with open(tmp_path / "x.part", "w+b", buffering=0) as handle, PartWriter(handle, 0, flush_every=MiB) as writer:
        writer.write(memoryview(constructed(2 * MiB)))
        with pytest.raises(OSError, match="Input/output error"):
            writer.durable()


def test_part_writer_close_ends_the_flusher_before_the_file_closes(tmp_path: Path) -> None:
    """A download that fails half-way leaves the writer without durable(): leaving its block ends the thread,
    so no flush can ever run on a closed (or reused) descriptor."""
    with open(tmp_path / "x.part", "w+b", buffering=0) as handle, PartWriter(handle, 0, flush_every=MiB) as writer:
        writer.write(memoryview(constructed(3 * MiB)))
        flusher = writer._flusher
        assert flusher is not None
    assert not flusher._thread.is_alive()


# ------------------------------------------------------------------------------------------ through fetch_model
@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> Served:
    """A 12 MiB GGUF: 12 buffers of 1 MiB through a pool of 4, so every buffer is reused while hashing."""
    from rigkit.sandbox.tiny_gemma4 import write_arch_gguf

    path = write_arch_gguf(tmp_path_factory.mktemp("large") / "l.gguf", "gemma4", padding_bytes=12 * MiB, seed=5)
    return describe(path, "large-gemma4.gguf", "gemma4")


@pytest.fixture(params=[True, False], ids=["hash-thread", "hash-inline"])
def hash_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Both ways model_fetch hashes a download: in the second thread (rigs with cores to spare) and inline."""
    monkeypatch.setattr(model_fetch, "HASH_IN_THREAD", request.param)
    return bool(request.param)


def test_threaded_download_installs_the_exact_bytes(
    hub: HfStandin, large: Served, models: Path, hash_mode: bool
) -> None:
    large.publish(hub)
    dest = models / large.filename
    result = fetch_model(large.entry(), dest, options(hub, chunk_size=MiB))
    assert result.verification == "download" and result.bytes_downloaded == large.size
    assert_installed(dest, large, result)


def test_a_hash_mismatch_still_refuses_and_keeps_the_previous_file(
    hub: HfStandin, large: Served, models: Path, hash_mode: bool
) -> None:
    large.publish(hub)
    dest = models / large.filename
    previous = seed_previous(dest)
    wrong = "0" * 64
    with pytest.raises(VerificationError, match=f"sha256 mismatch.*expected {wrong}, got {large.sha256}"):
        fetch_model(large.entry(sha256=wrong), dest, options(hub, chunk_size=MiB))
    assert_untouched(dest, previous)


def test_resume_after_a_reset_rehashes_the_part_in_the_thread(
    hub: HfStandin, large: Served, models: Path, hash_mode: bool
) -> None:
    """The run dies at 5 MiB + 3 (reset, then the server is down); the next run re-hashes the kept part through
    the pool and asks only for the rest."""
    large.publish(hub)
    large.fault(hub, Fault("reset", after_bytes=5 * MiB + 3), Fault("status", status=503, times=None))
    dest = models / large.filename
    with pytest.raises(DownloadError):
        fetch_model(large.entry(), dest, options(hub, retries=1, chunk_size=MiB))
    kept = part_of(dest).stat().st_size
    assert 0 < kept < large.size
    hub.clear_faults()
    hub.reset_counters()
    result = fetch_model(large.entry(), dest, options(hub, chunk_size=MiB))
    assert (result.operation, result.resumed_from, result.bytes_downloaded) == ("resume", kept, large.size - kept)
    assert [r.range for r in hub.requests if r.range] == [f"bytes={kept}-"]
    assert_installed(dest, large, result)
