"""A read-only HTTP server for model files laid out as Hugging Face's ``resolve/`` URLs.

Standard library only. It serves a directory ``<root>/<owner>/<repo>/resolve/<revision>/<filename>`` at
``http://<bind>:<port>[/<secret>]/<owner>/<repo>/resolve/<revision>/<filename>``, so ``model_fetch`` uses it as its
``base_url`` unchanged (the controller's model cache for the rigs of a LAN, or the sandbox's stand-in hub).

* ``GET`` and ``HEAD``; one ``Range`` per request (``bytes=a-b``, ``bytes=a-``, ``bytes=-n``) answers 206 with
  ``Content-Range``, an unsatisfiable one (or one with absurdly many digits) 416; a malformed or multi-range
  header is ignored (200, whole file).
* ``bind``: one address or several (the controller as each group of rigs reaches it), all on one port; never
  a wildcard address.
* ``secret``: when given, every URL must start with ``/<secret>/``; anything else answers 404 (nothing else on
  the LAN can read the cache). The secret never appears in the log.
* ``allow``: when given, only these ``<owner>/<repo>/resolve/<revision>/<file>`` paths are served (the files of
  the current run); a mirror on a non-loopback address refuses to start without both ``secret`` and ``allow``.
* Only regular files under ``root``, opened component by component with ``O_NOFOLLOW`` (no symlink anywhere
  under the root is followed) and ``O_NONBLOCK`` (a FIFO never hangs a handler), checked on the opened
  descriptor; no directory listings, no hidden components (``.rigkit-verified`` records, ``..``), no ``.part``
  downloads in progress. Everything else answers 404.
* Counters per served path (``bytes`` of body sent, ``requests``, ``complete``) through ``stats()`` and
  ``stats_file`` (written after each body and at shutdown); no HTTP endpoint exposes them.
* ``clients``: when given, only connections from these addresses or networks (the rigs of the run) are served,
  and from this machine itself (127.0.0.1, ::1 and the bound addresses, which nothing on the LAN can send
  from); any other source is closed at once, without a thread or a slot. A mirror on a non-loopback address
  refuses to start without them; without them (loopback only) every source is served.
* Lifetime: ``idle_timeout`` (no request of this run and no open transfer for that long: a request without
  the secret or outside the allow-list is not activity), ``max_age`` (a hard limit) and ``watch_pid`` (stop
  when that process, the Ansible run that started the mirror, is gone).
* Connections: at most ``max_connections`` at once and ``max_per_client`` from one source (this machine's
  own are capped by the total only: the sandboxes all come from 127.0.0.1); the rest are closed at once. The
  request line and headers of each request must arrive within ``read_timeout`` in total, however they are
  trickled; a request that fails the secret or the allow-list is answered 404 and its connection closed.
  Refused connections are logged at most once per ``REFUSAL_LOG_INTERVAL_S``, the rest counted in the next
  line (or the one at shutdown).

    mirror = ModelMirror("/var/cache/rigkit/models", bind="127.0.0.1", port=0).start()
    mirror.url                         # "http://127.0.0.1:41234"
    mirror.stats()["files"]            # {"/owner/repo/resolve/<rev>/x.gguf": {"bytes": ..., ...}}
    mirror.stop()
"""

from __future__ import annotations

import contextlib
import email.utils
import errno
import hmac
import io
import ipaddress
import json
import os
import re
import socket
import struct
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TextIO

from ansible.module_utils.net_address import is_loopback

from rigkit.mirror.files import open_served_file, url_parts
from rigkit.mirror.http_range import answer_range

__all__ = ["MirrorError", "ModelMirror", "escape_log"]

SEND_CHUNK = 8 * 1024 * 1024
SEND_TIMEOUT_S = 120  # a client that accepts nothing for this long is dropped
READ_TIMEOUT_S = 30.0  # a client that sends no complete request line/headers for this long is dropped
MAX_CONNECTIONS = 32
MAX_PER_CLIENT = 8  # below MAX_CONNECTIONS: one source never takes every slot
REFUSAL_LOG_INTERVAL_S = 10.0  # a connect flood writes one line per interval, not one per connection
REFUSAL_LOG_SOURCES = 3  # sources named in a summary line, the busiest first
WATCH_INTERVAL_S = 0.5

_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\\]")


class MirrorError(Exception):
    """The mirror cannot start (bad root, address in use); the message says what to change."""


def escape_log(text: str) -> str:
    """One log line whatever a client sent: control characters and backslashes escaped, non-ASCII as \\u."""
    escaped = _CONTROL_RE.sub(lambda m: "\\\\" if m[0] == "\\" else f"\\x{ord(m[0]):02x}", text)
    return escaped.encode("ascii", "backslashreplace").decode("ascii")


def _is_wildcard(address: str) -> bool:
    """True for every spelling of "all interfaces" a socket API accepts: empty, an unspecified IPv4 or IPv6
    address (``::0``, ``[::]``, ``::%eth0``), an IPv4-mapped one (``::ffff:0.0.0.0``) and inet_aton's short or
    odd forms that decode to 0.0.0.0 (``0``, ``0.0``, ``00``, ``0x0``)."""
    text = address.strip()
    text = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    if not text:
        return True
    try:
        parsed = ipaddress.ip_address(text)
    except ValueError:
        pass
    else:
        mapped = parsed.ipv4_mapped if isinstance(parsed, ipaddress.IPv6Address) else None
        return parsed.is_unspecified or (mapped is not None and mapped.is_unspecified)
    if ":" in text:
        return False
    try:
        return socket.inet_aton(text) == bytes(4)
    except (OSError, ValueError):  # a host name, or not an IPv4 spelling at all
        return False


Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# This machine's own source addresses: the kernel drops a packet from the wire that claims one of them.
_THIS_MACHINE: frozenset[Address] = frozenset({ipaddress.IPv4Address("127.0.0.1"), ipaddress.IPv6Address("::1")})


def _source_address(host: str) -> Address | None:
    """A connection's source as an address: an IPv4-mapped IPv6 one as IPv4, a zone (``%eth0``) dropped."""
    try:
        parsed = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return parsed.ipv4_mapped
    return parsed


def _client_networks(clients: Iterable[str]) -> tuple[Network, ...]:
    """``clients`` as networks (an address is a network of one); a spelling that is neither is refused."""
    networks: list[Network] = []
    for client in clients:
        text = client.strip()
        text = text[1:-1] if text.startswith("[") and text.endswith("]") else text
        address, slash, prefix = text.partition("/")
        try:
            network = ipaddress.ip_network(address.split("%", 1)[0] + slash + prefix, strict=False)
        except ValueError:
            raise MirrorError(f"client {client!r} is not an IP address or network: give each rig's address") from None
        if network.prefixlen == 0:
            raise MirrorError(f"client {client!r} means every address: give the rigs' addresses or networks")
        networks.append(network)
    return tuple(dict.fromkeys(networks))


def _proc_start_time(pid: int) -> str | None:
    """The start time of ``pid`` (field 22 of /proc/<pid>/stat), None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if not fields or fields[0] in ("Z", "X"):
        return None
    return fields[19] if len(fields) > 19 else None


class _Stats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.files: dict[str, dict[str, int]] = {}
        self.started = time.time()
        self.credentialed = 0  # requests that carried an Authorization or Cookie header

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
            "credentialed_requests": self.credentialed,
            "started": self.started,
            "pid": os.getpid(),
        }


class _RefusalLog:
    """Refused connections as log lines: one at once, then at most one per interval counting the rest."""

    def __init__(self, write: Callable[[str], None], interval: float = REFUSAL_LOG_INTERVAL_S) -> None:
        self._write = write
        self._interval = interval
        self._lock = threading.Lock()
        self._last = -interval
        self._held_since = 0.0
        self._reasons: Counter[str] = Counter()
        self._sources: Counter[str] = Counter()

    def refused(self, source: str, reason: str) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last < self._interval:
                self._hold(source, reason, now)
                return
            self._last = now
            summary = self._take_summary(now)
        if summary:
            self._write(summary)
        self._write(f"{source} refused: {reason}")

    def flush(self) -> None:
        """Log what is held (at shutdown: a flood's count is never lost)."""
        with self._lock:
            summary = self._take_summary(time.monotonic())
        if summary:
            self._write(summary)

    def _hold(self, source: str, reason: str, now: float) -> None:
        if not self._reasons:
            self._held_since = now
        self._reasons[reason] += 1
        if source in self._sources or len(self._sources) < 256:  # bounded, whatever a flood's sources
            self._sources[source] += 1

    def _take_summary(self, now: float) -> str | None:
        if not self._reasons:
            return None
        total = sum(self._reasons.values())
        reasons = ", ".join(f"{count} {reason}" for reason, count in self._reasons.most_common())
        busiest = [f"{source} ({count})" for source, count in self._sources.most_common(REFUSAL_LOG_SOURCES)]
        more = ", ..." if len(self._sources) > REFUSAL_LOG_SOURCES else ""
        elapsed = now - self._held_since
        self._reasons.clear()
        self._sources.clear()
        return f"refused {total} more connections in {elapsed:.0f} s ({reasons}) from {', '.join(busiest)}{more}"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # a connect flood waits to be refused in the backlog, not a rig's SYN dropped
    mirror: ModelMirror

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.mirror._admit(client_address[0]):  # not a client, or over a cap: close at once, no thread
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.mirror._release(client_address[0])
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.mirror._release(client_address[0])

    def handle_error(self, request: Any, client_address: Any) -> None:  # a client that hung up is not news
        exc = sys.exc_info()[1]
        if not isinstance(exc, (ConnectionError, TimeoutError)):
            self.mirror._log(f"{client_address[0]} handler error: {exc.__class__.__name__}: {exc}")


class _HeadReader(io.RawIOBase):
    """The connection's reads; while ``deadline`` is set, each one waits only for the time left until it."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request line and headers did not arrive in time")
            self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "rigkit-mirror/1"

    def version_string(self) -> str:  # no Python version in the Server header
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:
        self.server.mirror._log(f"{self.client_address[0]} {format % args}")

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", SEND_TIMEOUT_S, 0))
        self.connection.settimeout(self.server.mirror.read_timeout)
        self.rfile.close()  # read through the head reader: a deadline per request, not a timeout per recv
        self._head = _HeadReader(self.connection)
        self.rfile = io.BufferedReader(self._head)

    def handle_one_request(self) -> None:
        self._head.deadline = time.monotonic() + self.server.mirror.read_timeout  # a trickled head is dropped
        try:
            super().handle_one_request()
        finally:
            self._head.deadline = None

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        self._head.deadline = None  # GET and HEAD read no body: the answer is written with the usual timeout
        self.connection.settimeout(self.server.mirror.read_timeout)
        return parsed

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
        if self.headers.get("Authorization") or self.headers.get("Cookie"):
            mirror._credentialed()  # the mirror needs none: a client that sends one leaks it over plain http
        parts = self._run_file()
        if parts is None:  # not a request of this run: no activity, and no keep-alive to repeat it on
            self._plain(
                404,
                "not found: the mirror serves /<owner>/<repo>/resolve/<revision>/<file> only",
                {"Connection": "close"},
            )
            return
        mirror._busy(+1)
        try:
            self._answer(parts)
        finally:
            mirror._busy(-1)

    def _run_file(self) -> list[str] | None:
        """The requested file's path components when the URL carries the secret and names a file of the run."""
        mirror = self.server.mirror
        key = mirror.strip_secret(urllib.parse.urlsplit(self.path).path)
        parts = url_parts(key) if key is not None else None
        return parts if parts is not None and mirror.allowed("/".join(parts)) else None

    def _answer(self, parts: list[str]) -> None:
        mirror = self.server.mirror
        opened = open_served_file(mirror.root, parts)
        if opened is None:
            self._plain(404, "not found")
            return
        fd, st = opened
        try:
            self._send_file(fd, st, "/" + "/".join(parts))
        finally:
            os.close(fd)

    def do_POST(self) -> None:  # its body is never read: the connection cannot carry another request
        self._plain(405, "the mirror is read-only", {"Allow": "GET, HEAD", "Connection": "close"})

    do_PUT = do_DELETE = do_PATCH = do_POST

    def _send_file(self, fd: int, st: os.stat_result, key: str) -> None:
        size = st.st_size
        answer = answer_range(self.headers.get("Range"), size)
        common = {
            "Accept-Ranges": "bytes",
            "ETag": f'"{st.st_ino:x}-{size:x}-{st.st_mtime_ns:x}"',
            "Last-Modified": email.utils.formatdate(st.st_mtime, usegmt=True),
        }
        if answer.status == 416:
            self._plain(416, "range not satisfiable", {**common, **answer.headers})
            return
        start, end = answer.start, answer.end
        self.send_response(answer.status)
        self.send_header("Content-Type", "application/octet-stream")
        for name, value in {**answer.headers, **common}.items():
            self.send_header(name, value)
        if self.command == "HEAD":  # counted before the answer leaves: a client never sees stale counters
            self.server.mirror._served(key, sent=0, complete=False, head=True)
            self.end_headers()
            return
        self.end_headers()
        sent = self._sendfile(fd, start, end)
        self.server.mirror._served(key, sent=sent, complete=sent == end - start, head=False)

    def _sendfile(self, fd: int, start: int, end: int) -> int:
        self.wfile.flush()
        # Blocking for os.sendfile; the kernel-level send timeout (SO_SNDTIMEO) still drops a dead client.
        self.connection.settimeout(None)
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
        finally:
            with contextlib.suppress(OSError):
                self.connection.settimeout(self.server.mirror.read_timeout)
        if offset < end:
            self.close_connection = True
        return offset - start


class ModelMirror:
    """See the module docstring."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        bind: str | Sequence[str] = "127.0.0.1",
        port: int = 0,
        *,
        secret: str | None = None,
        allow: Iterable[str] | None = None,
        clients: Iterable[str] | None = None,
        idle_timeout: float = 0.0,
        max_age: float = 0.0,
        watch_pid: int | None = None,
        read_timeout: float = READ_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
        max_per_client: int = MAX_PER_CLIENT,
        stats_file: str | os.PathLike[str] | None = None,
        log: TextIO | None = None,
    ) -> None:
        self.root = os.path.realpath(os.fspath(root))
        if not os.path.isdir(self.root):
            raise MirrorError(f"mirror root {self.root} is not a directory: create it (or fetch models into it) first")
        binds = [bind] if isinstance(bind, str) else list(dict.fromkeys(bind))
        if not binds:
            raise MirrorError("no address to listen on: give the controller address the rigs reach")
        for address in binds:
            if _is_wildcard(address):
                raise MirrorError(
                    f"refusing to listen on every interface ({address!r} means all of them): bind the addresses the "
                    "rigs reach (models_controller_address; 127.0.0.1 for rigs on this machine)"
                )
        if secret is not None and (len(secret) < 16 or not re.fullmatch(r"[A-Za-z0-9_-]+", secret)):
            raise MirrorError("the mirror's secret must be 16 or more URL-safe characters ([A-Za-z0-9_-])")
        lan = [address for address in binds if not is_loopback(address)]
        if lan and (secret is None or allow is None):
            raise MirrorError(
                f"a mirror on {', '.join(lan)} (not loopback) needs a secret and an allow-list of the files to serve: "
                "start it with `rigkit mirror --secret-file F --allow PATH ...` as playbooks/models.yml does"
            )
        self.clients = None if clients is None else _client_networks(clients)
        if lan and not self.clients:
            raise MirrorError(
                f"a mirror on {', '.join(lan)} (not loopback) serves only the rigs of the run: start it with "
                "`rigkit mirror --client ADDR ...` (every address of each rig) as playbooks/models.yml does"
            )
        if watch_pid is not None and _proc_start_time(watch_pid) is None:
            raise MirrorError(f"process {watch_pid} to watch is not running: start the mirror from the live run")
        self.bind = binds[0]
        self.binds = binds
        self.secret = secret
        self.allow = None if allow is None else frozenset(path.strip("/") for path in allow)
        self.idle_timeout = idle_timeout
        self.max_age = max_age
        self.watch_pid = watch_pid
        self._watch_start = _proc_start_time(watch_pid) if watch_pid is not None else None
        self.read_timeout = read_timeout
        self.max_connections = max_connections
        self.max_per_client = max_per_client
        self.stats_file = os.fspath(stats_file) if stats_file else None
        self._log_stream = log
        self._stats = _Stats()
        self._lock = threading.Lock()
        self._active = 0
        self._open: Counter[Address | None] = Counter()  # connections being served, per source
        self._open_total = 0
        self._this_machine = set(_THIS_MACHINE)
        self._refusals = _RefusalLog(self._log)
        self._started = time.monotonic()
        self._last_activity = time.monotonic()
        self._stopped = threading.Event()
        self._done = threading.Event()
        self._servers: list[_Server] = []
        self._threads: list[threading.Thread] = []
        try:
            for address in binds:  # every address on one port: the first one's (a free one when port is 0)
                family = socket.AF_INET6 if ":" in address else socket.AF_INET
                server_class = type("_BoundServer", (_Server,), {"address_family": family})
                wanted = port if not self._servers else self.port
                try:
                    server = server_class((address, wanted), _Handler)
                except OSError as exc:
                    hint = "pick another port" if exc.errno == errno.EADDRINUSE else "check the bind address"
                    raise MirrorError(f"cannot listen on {address}:{wanted}: {exc.strerror or exc}; {hint}") from None
                if _is_wildcard(str(server.server_address[0])):  # a name that resolved to "every interface"
                    server.server_close()
                    raise MirrorError(
                        f"refusing to listen on every interface ({address!r} resolved to "
                        f"{server.server_address[0]}): bind the addresses the rigs reach by number"
                    )
                server.mirror = self
                self._servers.append(server)
                bound = _source_address(str(server.server_address[0]))
                if bound is not None:  # this machine's own address, as a source too
                    self._this_machine.add(bound)
        except MirrorError:
            for server in self._servers:
                server.server_close()
            raise

    # ------------------------------------------------------------------ facts
    @property
    def port(self) -> int:
        return int(self._servers[0].server_address[1])

    @property
    def url(self) -> str:
        """The address without the secret (safe to print); ``base_url`` adds the secret."""
        host = f"[{self.bind}]" if ":" in self.bind else self.bind
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What a fetcher uses: ``url`` plus ``/<secret>`` when there is one. Never log it."""
        return f"{self.url}/{self.secret}" if self.secret else self.url

    def strip_secret(self, url_path: str) -> str | None:
        """The path after ``/<secret>``; None when the secret is wanted and missing or wrong."""
        if self.secret is None:
            return url_path
        given, sep, rest = url_path[1:].partition("/") if url_path.startswith("/") else ("", "", "")
        if not sep or not hmac.compare_digest(given.encode(), self.secret.encode()):
            return None
        return "/" + rest

    def allowed(self, relative: str) -> bool:
        return self.allow is None or relative in self.allow

    def stats(self) -> dict[str, Any]:
        data = self._stats.snapshot()
        data.update(root=self.root, url=self.url)
        return data

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> ModelMirror:
        """Serve from a daemon thread, with a watchdog for the idle timeout, the maximum age and the watched pid."""
        for server in self._servers:
            thread = threading.Thread(
                target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="model-mirror", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        if self.idle_timeout > 0 or self.max_age > 0 or self.watch_pid is not None:
            threading.Thread(target=self._watch, name="model-mirror-watch", daemon=True).start()
        self._log(
            f"serving {self.root} on {', '.join(self.binds)}:{self.port} (pid {os.getpid()}); {self._clients_text()}"
        )
        return self

    def _clients_text(self) -> str:
        if self.clients is None:
            return "clients: any (loopback only)"
        named = [str(net.network_address if net.num_addresses == 1 else net) for net in self.clients]
        return f"clients: {', '.join(named) or 'this machine only'}"

    def wait(self) -> None:
        """Block until stop() (from a signal handler or the watchdog) has finished."""
        self._done.wait()

    def stop(self) -> None:
        """Stop serving, write the final stats; a second call waits for the first to finish."""
        with self._lock:
            first = not self._stopped.is_set()
            self._stopped.set()
        if not first:
            self._done.wait()
            return
        for server, thread in zip(self._servers, self._threads, strict=False):  # no threads: never started
            server.shutdown()
            thread.join(timeout=5)
        for server in self._servers:
            server.server_close()
        self._write_stats()
        self._refusals.flush()
        self._log("stopped")
        self._done.set()

    def __enter__(self) -> ModelMirror:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ used by the server and the handler
    def _admit(self, host: str) -> bool:
        """Take a slot for a connection from ``host``; False (logged, rate-limited) when it gets none."""
        source = _source_address(host)
        reason = self._refusal(source)
        if reason is None:
            return True
        self._refusals.refused(host, reason)
        return False

    def _refusal(self, source: Address | None) -> str | None:
        """Why a connection from ``source`` is not served, after taking its slot when it is (None)."""
        local = source in self._this_machine
        if not local and not self._is_client(source):
            return "not a client of this run"
        with self._lock:
            if self._open_total >= self.max_connections:
                return f"{self.max_connections} connections already open"
            if not local and self._open[source] >= self.max_per_client:
                return f"{self.max_per_client} connections from this address already open"
            self._open[source] += 1
            self._open_total += 1
        return None

    def _is_client(self, source: Address | None) -> bool:
        if self.clients is None:
            return True
        return source is not None and any(source in network for network in self.clients)

    def _release(self, host: str) -> None:
        source = _source_address(host)
        with self._lock:
            self._open_total -= 1
            self._open[source] -= 1
            if self._open[source] <= 0:
                del self._open[source]

    def _busy(self, delta: int) -> None:
        with self._lock:
            self._active += delta
            self._last_activity = time.monotonic()

    def _served(self, key: str, *, sent: int, complete: bool, head: bool) -> None:
        self._stats.add(key, sent=sent, complete=complete, head=head)
        if not head:
            self._write_stats()

    def _credentialed(self) -> None:
        with self._lock:
            self._stats.credentialed += 1
        self._log("warning: a request carried credentials (Authorization/Cookie); the mirror never needs them")

    def _why_stop(self) -> str | None:
        now = time.monotonic()
        if self.max_age > 0 and now - self._started >= self.max_age:
            return f"reached the maximum age of {self.max_age:g} s"
        if self.watch_pid is not None and _proc_start_time(self.watch_pid) != self._watch_start:
            return f"the run that started it (pid {self.watch_pid}) has exited"
        with self._lock:
            idle = self._active == 0 and now - self._last_activity >= self.idle_timeout
        if self.idle_timeout > 0 and idle:
            return f"no request for {self.idle_timeout:g} s"
        return None

    def _watch(self) -> None:
        interval = min([WATCH_INTERVAL_S] + [t for t in (self.idle_timeout, self.max_age) if t > 0])
        while not self._stopped.wait(interval):
            reason = self._why_stop()
            if reason:
                self._log(f"{reason}: stopping")
                threading.Thread(target=self.stop, name="model-mirror-stop", daemon=True).start()
                return

    def _write_stats(self) -> None:
        if not self.stats_file:
            return
        tmp = f"{self.stats_file}.tmp.{threading.get_ident()}"
        with contextlib.suppress(OSError):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(self.stats(), handle, indent=1)
            os.replace(tmp, self.stats_file)

    def _log(self, message: str) -> None:
        if self._log_stream is None:
            return
        if self.secret:
            message = message.replace(self.secret, "<secret>")
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        with contextlib.suppress(OSError, ValueError):
            self._log_stream.write(f"{stamp} rigkit-mirror: {escape_log(message)}\n")
            self._log_stream.flush()
