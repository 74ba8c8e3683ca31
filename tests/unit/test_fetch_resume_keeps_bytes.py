"""Nothing the fetcher received is lost on an error: the resume after a reset asks for exactly the bytes not yet
received, under CPU load, and a read that raises leaves every earlier chunk in the part and in its hash.

What is measured is what the client's socket handed to the process (``recv_into`` on the fetcher's connection),
not only what the stand-in wrote: an RST (SO_LINGER 0) discards what the kernel had not sent yet (held back while
the fetcher's receive window was full, as when the fetcher is stalled on a loaded machine), so the stand-in resets
only once its send queue is empty (SIOCOUTQ); the stalled runs check that then nothing sent is lost.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ansible.module_utils.fetch.model as model_fetch
import pytest
from ansible.module_utils.fetch.errors import Transient
from ansible.module_utils.fetch.hash import ThreadedHasher
from ansible.module_utils.fetch.model import fetch_model
from ansible.module_utils.fetch.part import PartWriter
from ansible.module_utils.fetch.spec import CatalogEntry, FetchOptions, FetchResult
from ansible.module_utils.fetch.transfer import Transfer

from rigkit.sandbox.tiny_gemma4 import write_arch_gguf
from tests.fixtures.hf_standin import Fault, HfStandin
from tests.support import REV, MiB, Served, assert_installed, describe, options, seed_previous

BURNERS = 2  # busy processes: as many as the kit's bench machine has cores


@pytest.fixture(scope="module")
def cpu_load() -> Iterator[None]:
    """Busy-loop processes for the module's duration, so the fetcher falls behind the server as on a loaded rig."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(BURNERS)]
    try:
        yield
    finally:
        for proc in burners:
            proc.kill()
        for proc in burners:
            proc.wait()


@pytest.fixture(scope="module")
def medium(tmp_path_factory: pytest.TempPathFactory) -> Served:
    path = write_arch_gguf(tmp_path_factory.mktemp("medium") / "m.gguf", "gemma4", padding_bytes=8 * MiB, seed=11)
    return describe(path, "medium-gemma4.gguf", "gemma4")


@pytest.fixture
def hub() -> Iterator[HfStandin]:
    with HfStandin() as server:
        yield server


class SocketTap:
    """Every byte ``recv_into`` handed to the process on each fetcher connection to ``port`` (headers included)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.streams: dict[int, bytearray | None] = {}  # id(socket) -> bytes received; None: not a client socket
        self.order: list[int] = []
        self._alive: list[socket.socket] = []  # held so that no id() is reused while the tap is in place

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        original = socket.socket.recv_into
        tap = self

        def recv_into(sock: socket.socket, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
            n = original(sock, buffer, nbytes, flags)
            stream = tap._stream(sock) if n else None
            if stream is not None:
                stream += memoryview(buffer)[:n]
            return n

        monkeypatch.setattr(socket.socket, "recv_into", recv_into)

    def _stream(self, sock: socket.socket) -> bytearray | None:
        """The stand-in's own sockets listen on ``port``; every other one here is the fetcher's (getsockname, unlike
        getpeername, still answers after an RST, while the data queued before it is still being read)."""
        key = id(sock)
        if key not in self.streams:
            self._alive.append(sock)
            client = sock.family == socket.AF_INET and sock.getsockname()[1] != self.port
            self.streams[key] = bytearray() if client else None
            if client:
                self.order.append(key)
        return self.streams[key]

    def body_bytes(self) -> list[int]:
        """Body bytes received on each connection, in connection order."""
        counts = []
        for key in self.order:
            stream = self.streams[key]
            assert stream is not None
            head = stream.find(b"\r\n\r\n")
            assert head >= 0, "a connection received no complete response head"
            counts.append(len(stream) - head - 4)
        return counts


# Resets at byte offsets from the first to the last of the body; uneven ones split a receive buffer anywhere.
RESET_AT = [
    1,
    100,
    8191,
    65537,
    MiB - 1,
    2 * MiB + 3,
    3355443,
    3355443 + 4093,
    5 * MiB + 12345,
    7 * MiB + 1,
    8 * MiB - 7,
]
# Resets while the fetcher is stalled (as on a loaded rig): the stand-in resets only once its send queue is
# empty, so even a stalled fetcher receives every byte it wrote, and the resume starts exactly there.
STALLED_RESET_AT = [MiB // 2, MiB, 2 * MiB, 3 * MiB]
STALL_S = 0.5  # longer than the stand-in waits before its RST
STALL_WAIT_S = 2.0  # at most this long for the stand-in to have written everything before the reset


def _cases() -> list[Any]:
    plain = [(offset, False) for offset in RESET_AT]
    stalled = [(offset, True) for offset in STALLED_RESET_AT]
    return [
        pytest.param(
            offset,
            stall,
            index % 2 == 0,
            id=f"reset-at-{offset}{'-stalled' if stall else ''}-{'threaded' if index % 2 == 0 else 'inline'}",
        )
        for index, (offset, stall) in enumerate(plain + stalled)
    ]


def _stall_first_write(monkeypatch: pytest.MonkeyPatch, hub: HfStandin, served: Served, reset_at: int) -> None:
    """The first write of the part waits until the stand-in has written its bytes, then past its reset."""
    original = PartWriter.write
    stalled: list[bool] = []

    def write(self: PartWriter, view: memoryview) -> None:
        if not stalled:
            stalled.append(True)
            until = time.monotonic() + STALL_WAIT_S
            while served.served_by(hub) < reset_at and time.monotonic() < until:
                time.sleep(0.01)
            time.sleep(STALL_S)
        original(self, view)

    monkeypatch.setattr(PartWriter, "write", write)


@pytest.mark.parametrize(("reset_at", "stall", "threaded"), _cases())
def test_resume_after_reset_under_load_asks_for_exactly_the_bytes_not_received(
    cpu_load: None,
    hub: HfStandin,
    medium: Served,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    reset_at: int,
    stall: bool,
    threaded: bool,
) -> None:
    monkeypatch.setattr(model_fetch, "HASH_IN_THREAD", threaded)
    medium.publish(hub)
    medium.fault(hub, Fault("reset", after_bytes=reset_at))
    tap = SocketTap(hub.port)
    tap.install(monkeypatch)
    if stall:
        _stall_first_write(monkeypatch, hub, medium, reset_at)
    dest = tmp_path / medium.filename
    seed_previous(dest)

    result = fetch_model(medium.entry(), dest, options(hub, read_timeout=10.0))

    assert_installed(dest, medium, result)
    assert result.attempts == 2, result.events
    received = tap.body_bytes()
    assert len(received) == 2, f"connections: {received}"
    first, second = received
    assert first <= reset_at
    if stall:  # the stand-in waited for its send queue to empty: nothing it counted as sent was lost
        assert first == reset_at, f"received {first} of the {reset_at} bytes sent before the reset"
    ranges = [r.range for r in hub.requests]
    # Every byte the first connection received is kept: the resume starts exactly there, not before it.
    assert ranges == [None, f"bytes={first}-"], f"received {first} of {reset_at} sent; requests {ranges}"
    assert second == medium.size - first
    assert result.bytes_downloaded == medium.size
    assert medium.served_by(hub) == reset_at + medium.size - first


# ------------------------------------------------------------------------------------------ the pipeline itself
class _ScriptedSocket(io.RawIOBase):
    """The socket under a real http.client.HTTPResponse: hands out ``reads`` one per system call, then raises
    ``error`` (None: the peer closed, reads return 0)."""

    def __init__(self, reads: list[bytes], error: BaseException | None) -> None:
        self.reads = list(reads)
        self.error = error

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if not self.reads:
            if self.error is None:
                return 0
            raise self.error
        data = self.reads.pop(0)
        n = min(len(data), len(buffer))
        buffer[:n] = data[:n]
        if n < len(data):  # the rest is still in the kernel for the next call
            self.reads.insert(0, data[n:])
        return n

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(self)


def _pieces(count: int) -> list[bytes]:
    """``count`` chunks of uneven sizes (one that fits with the headers, a full buffer, a byte, odd sizes)."""
    sizes = [777, MiB, 1, MiB - 5, 65536, 3, MiB, 12345]
    return [hashlib.shake_256(b"%d" % i).digest(sizes[i % len(sizes)]) for i in range(count)]


def _response(chunks: list[bytes], error: BaseException | None, size: int, *, chunked: bool) -> Any:
    """A real HTTPResponse whose body arrives as ``chunks`` (the first with the headers), then ``error``.

    Chunked, the last chunk is announced longer than what arrives of it: the error strikes inside a chunk."""
    if chunked:
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        reads = [b"%x\r\n" % len(c) + c + b"\r\n" for c in chunks[:-1]]
        if chunks:
            reads.append(b"%x\r\n" % (len(chunks[-1]) + 4096) + chunks[-1])
    else:
        head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size
        reads = list(chunks)
    reads = [head + reads[0], *reads[1:]] if reads else [head]
    resp = http.client.HTTPResponse(_ScriptedSocket(reads, error))  # type: ignore[arg-type]
    resp.begin()
    return resp


@pytest.mark.parametrize("threaded", [True, False], ids=["threaded", "inline"])
@pytest.mark.parametrize(
    "error",
    [
        ConnectionResetError(104, "Connection reset by peer"),
        TimeoutError("timed out"),
        ssl.SSLError("record layer failure"),
        OSError(5, "Input/output error"),
        None,
    ],
    ids=["reset", "timeout", "ssl", "eio", "closed"],
)
@pytest.mark.parametrize("chunked", [False, True], ids=["length", "chunked"])
@pytest.mark.parametrize("count", [0, 1, 2, 7])
def test_a_read_that_fails_after_n_chunks_leaves_exactly_those_chunks_in_part_and_hash(
    tmp_path: Path, threaded: bool, error: BaseException | None, chunked: bool, count: int
) -> None:
    chunks = _pieces(count)
    body = b"".join(chunks)
    size = len(body) + MiB  # more was announced than arrives before the error
    entry = CatalogEntry("o/r", REV, "f.gguf", "0" * 64, size, "gemma4")
    opts = FetchOptions(chunk_size=MiB, allow_insecure_http=True)
    result = FetchResult("p", False, "download", "none", entry.sha256, size, "http://x/")
    part = tmp_path / "f.gguf.part"
    resp = _response(chunks, error, size, chunked=chunked)
    with (
        open(part, "w+b", buffering=0) as fh,
        ThreadedHasher(opts.chunk_size, 2, threaded=threaded) as hasher,
        PartWriter(fh, 0) as writer,
    ):
        transfer = Transfer(entry, "http://x/", opts, writer, hasher, result, lambda _: None, lambda _: None)
        if error is None and not chunked:  # a short body ends quietly; run() retries it with a Range
            transfer._read_body(resp)
        else:
            with pytest.raises(Transient):  # classified: the attempt is retried from writer.offset
                transfer._read_body(resp)
        assert writer.offset == len(body)
        assert hasher.hexdigest() == hashlib.sha256(body).hexdigest()
    assert part.read_bytes() == body
    assert result.bytes_downloaded == len(body)
