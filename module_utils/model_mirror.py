"""A read-only HTTP server for model files laid out as Hugging Face's ``resolve/`` URLs.

Standard library only. It serves a directory ``<root>/<owner>/<repo>/resolve/<revision>/<filename>`` at
``http://<bind>:<port>/<owner>/<repo>/resolve/<revision>/<filename>``, so ``model_fetch`` uses it as its
``base_url`` unchanged (the controller's model cache for the rigs of a LAN, or the sandbox's stand-in hub).

* ``GET`` and ``HEAD``; one ``Range`` per request (``bytes=a-b``, ``bytes=a-``, ``bytes=-n``) answers 206 with
  ``Content-Range``, an unsatisfiable one 416; a malformed or multi-range header is ignored (200, whole file).
* Only regular files under ``root`` at a ``/<owner>/<repo>/resolve/<revision>/<path>`` URL: no directory
  listings, no hidden components (``.rigkit-verified`` records, ``..``), no ``.part`` downloads in progress,
  no symlink that leads out of ``root``. Everything else answers 404.
* ``GET /.rigkit/stats``: JSON counters per served path (``bytes`` of body sent, ``requests``, ``complete``)
  for tests and benchmarks; also written to ``stats_file`` after each body and at shutdown when given.
* ``idle_timeout``: the server stops by itself after that many seconds without a request or an open
  transfer, so a mirror whose playbook was interrupted does not outlive it for long.

    mirror = ModelMirror("/var/cache/rigkit/models", bind="127.0.0.1", port=0).start()
    mirror.url                         # "http://127.0.0.1:41234"
    mirror.stats()["files"]            # {"/owner/repo/resolve/<rev>/x.gguf": {"bytes": ..., ...}}
    mirror.stop()
"""

from __future__ import annotations

import contextlib
import email.utils
import errno
import json
import os
import re
import socket
import stat
import struct
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TextIO

__all__ = ["STATS_PATH", "MirrorError", "ModelMirror", "resolve_request_path"]

STATS_PATH = "/.rigkit/stats"
SEND_CHUNK = 8 * 1024 * 1024
SEND_TIMEOUT_S = 120  # a client that accepts nothing for this long is dropped

_RESOLVE_RE = re.compile(r"^/[^/]+/[^/]+/resolve/[^/]+/.+$")
_RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")


class MirrorError(Exception):
    """The mirror cannot start (bad root, address in use); the message says what to change."""


def resolve_request_path(root: str, url_path: str) -> str | None:
    """The file under ``root`` that ``url_path`` names, or None when it is not one the mirror may serve."""
    path = urllib.parse.unquote(url_path)
    if "\x00" in path or "\\" in path or not _RESOLVE_RE.match(path):
        return None
    parts = path[1:].split("/")
    if any(part in ("", ".", "..") or part.startswith(".") for part in parts) or parts[-1].endswith(".part"):
        return None
    real_root = os.path.realpath(root)
    candidate = os.path.realpath(os.path.join(real_root, *parts))
    if os.path.commonpath([real_root, candidate]) != real_root:
        return None  # a symlink that leads out of the root
    return candidate


class _Stats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.files: dict[str, dict[str, int]] = {}
        self.started = time.time()

    def add(self, path: str, *, sent: int, complete: bool, head: bool) -> None:
        with self._lock:
            entry = self.files.setdefault(path, {"bytes": 0, "requests": 0, "complete": 0, "head": 0})
            if head:
                entry["head"] += 1
                return
            entry["requests"] += 1
            entry["bytes"] += sent
            entry["complete"] += int(complete)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            files = {path: dict(counters) for path, counters in sorted(self.files.items())}
        return {
            "files": files,
            "total_bytes": sum(counters["bytes"] for counters in files.values()),
            "started": self.started,
            "pid": os.getpid(),
        }


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    mirror: ModelMirror

    def handle_error(self, request: Any, client_address: Any) -> None:  # a client that hung up is not news
        exc = sys.exc_info()[1]
        if not isinstance(exc, (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "rigkit-mirror/1"

    def log_message(self, format: str, *args: Any) -> None:
        self.server.mirror._log(f"{self.client_address[0]} {format % args}")

    def setup(self) -> None:
        super().setup()
        # A kernel-level send timeout keeps the socket blocking for os.sendfile while still dropping dead clients.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", SEND_TIMEOUT_S, 0))

    # ------------------------------------------------------------------ answers
    def _plain(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        body = (message + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        mirror = self.server.mirror
        mirror._busy(+1)
        try:
            self._answer()
        finally:
            mirror._busy(-1)

    def _answer(self) -> None:
        url_path = urllib.parse.urlsplit(self.path).path
        if url_path == STATS_PATH:
            body = json.dumps(self.server.mirror.stats(), indent=1).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            return
        path = resolve_request_path(self.server.mirror.root, url_path)
        if path is None:
            self._plain(404, "not found: the mirror serves /<owner>/<repo>/resolve/<revision>/<file> only")
            return
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._plain(404, "not found")
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self._plain(404, "not found")
                return
            self._send_file(fd, st, urllib.parse.unquote(url_path))
        finally:
            os.close(fd)

    def do_POST(self) -> None:
        self._plain(405, "the mirror is read-only", {"Allow": "GET, HEAD"})

    do_PUT = do_DELETE = do_PATCH = do_POST

    def _wanted_range(self, size: int) -> tuple[int, int] | bool | None:
        """(start, end_exclusive); None: no usable Range (send everything); False: unsatisfiable."""
        header = (self.headers.get("Range") or "").strip()
        match = _RANGE_RE.match(header)
        if not match or (not match[1] and not match[2]):
            return None
        if match[1]:
            start = int(match[1])
            end = min(size, int(match[2]) + 1) if match[2] else size
            if match[2] and int(match[2]) < start:
                return None  # syntactically invalid: ignore it (RFC 9110)
        else:
            start, end = max(0, size - int(match[2])), size
        if start >= size or start >= end:
            return False
        return start, end

    def _send_file(self, fd: int, st: os.stat_result, key: str) -> None:
        size = st.st_size
        wanted = self._wanted_range(size)
        common = {
            "Accept-Ranges": "bytes",
            "ETag": f'"{st.st_ino:x}-{size:x}-{st.st_mtime_ns:x}"',
            "Last-Modified": email.utils.formatdate(st.st_mtime, usegmt=True),
        }
        if wanted is False:
            self._plain(416, "range not satisfiable", {**common, "Content-Range": f"bytes */{size}"})
            return
        start, end = wanted if isinstance(wanted, tuple) else (0, size)
        self.send_response(206 if isinstance(wanted, tuple) else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        for name, value in common.items():
            self.send_header(name, value)
        if isinstance(wanted, tuple):
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        head = self.command == "HEAD"
        sent = 0 if head else self._sendfile(fd, start, end)
        self.server.mirror._served(key, sent=sent, complete=not head and sent == end - start, head=head)

    def _sendfile(self, fd: int, start: int, end: int) -> int:
        self.wfile.flush()
        out = self.connection.fileno()
        offset = start
        try:
            while offset < end:
                n = os.sendfile(out, fd, offset, min(SEND_CHUNK, end - offset))
                if n == 0:
                    break  # the file shrank under us
                offset += n
        except OSError as exc:
            self.close_connection = True
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.EAGAIN, errno.ETIMEDOUT):
                self.server.mirror._log(f"sending {self.path} failed: {exc}")
        if offset < end:
            self.close_connection = True
        return offset - start


class ModelMirror:
    """See the module docstring."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        bind: str = "127.0.0.1",
        port: int = 0,
        *,
        idle_timeout: float = 0.0,
        stats_file: str | os.PathLike[str] | None = None,
        log: TextIO | None = None,
    ) -> None:
        self.root = os.path.realpath(os.fspath(root))
        if not os.path.isdir(self.root):
            raise MirrorError(f"mirror root {self.root} is not a directory: create it (or fetch models into it) first")
        self.bind = bind
        self.idle_timeout = idle_timeout
        self.stats_file = os.fspath(stats_file) if stats_file else None
        self._log_stream = log
        self._stats = _Stats()
        self._lock = threading.Lock()
        self._active = 0
        self._last_activity = time.monotonic()
        self._stopped = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        server_class = type("_BoundServer", (_Server,), {"address_family": family})
        try:
            self._server = server_class((bind, port), _Handler)
        except OSError as exc:
            hint = "pick another port" if exc.errno == errno.EADDRINUSE else "check the bind address"
            raise MirrorError(f"cannot listen on {bind}:{port}: {exc.strerror or exc}; {hint}") from None
        self._server.mirror = self

    # ------------------------------------------------------------------ facts
    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = self.bind
        if host in ("0.0.0.0", ""):  # noqa: S104 - naming the wildcard, not binding it
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def stats(self) -> dict[str, Any]:
        data = self._stats.snapshot()
        data.update(root=self.root, url=self.url)
        return data

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> ModelMirror:
        """Serve from a daemon thread (and watch for idleness when idle_timeout is set)."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="model-mirror", daemon=True
        )
        self._thread.start()
        if self.idle_timeout > 0:
            threading.Thread(target=self._watch_idle, name="model-mirror-idle", daemon=True).start()
        self._log(f"serving {self.root} on {self.bind}:{self.port} (pid {os.getpid()})")
        return self

    def wait(self) -> None:
        """Block until stop() (from a signal handler or the idle watchdog) has finished."""
        self._done.wait()

    def stop(self) -> None:
        """Stop serving, write the final stats; a second call waits for the first to finish."""
        with self._lock:
            first = not self._stopped.is_set()
            self._stopped.set()
        if not first:
            self._done.wait()
            return
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()
        self._write_stats()
        self._log("stopped")
        self._done.set()

    def __enter__(self) -> ModelMirror:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ used by the handler
    def _busy(self, delta: int) -> None:
        with self._lock:
            self._active += delta
            self._last_activity = time.monotonic()

    def _served(self, key: str, *, sent: int, complete: bool, head: bool) -> None:
        self._stats.add(key, sent=sent, complete=complete, head=head)
        if not head:
            self._write_stats()

    def _watch_idle(self) -> None:
        while not self._stopped.wait(min(1.0, self.idle_timeout)):
            with self._lock:
                idle = self._active == 0 and time.monotonic() - self._last_activity >= self.idle_timeout
            if idle:
                self._log(f"no request for {self.idle_timeout:g} s: stopping")
                threading.Thread(target=self.stop, name="model-mirror-stop", daemon=True).start()
                return

    def _write_stats(self) -> None:
        if not self.stats_file:
            return
        tmp = f"{self.stats_file}.tmp.{threading.get_ident()}"
        with contextlib.suppress(OSError):
            with open(tmp, "w", encoding="utf-8") as handle:
                json.dump(self.stats(), handle, indent=1)
            os.replace(tmp, self.stats_file)

    def _log(self, message: str) -> None:
        if self._log_stream is None:
            return
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        with contextlib.suppress(OSError, ValueError):
            self._log_stream.write(f"{stamp} rigkit-mirror: {message}\n")
            self._log_stream.flush()
