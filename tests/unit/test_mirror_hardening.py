"""The model mirror's hardening: secret, allow-list, clients,
no symlinks, FIFOs, lifetimes, read deadlines, connection caps (total and per source), rate-limited refusal
lines, Range edge cases, the Server header and escaped log lines."""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import os
import re
import secrets
import select
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rigkit.mirror.files import open_served_file, url_parts
from rigkit.mirror.models import MAX_PER_CLIENT, MirrorError, ModelMirror, escape_log
from tests.support import free_port

REPO = Path(__file__).resolve().parents[2]
RIGKIT = [sys.executable, str(REPO / "bin" / "rigkit"), "mirror"]
REV = "0123456789abcdef0123456789abcdef01234567"
OWNER_REPO = "rigkit-test/mirror-GGUF"
SECRET = "t" + secrets.token_urlsafe(24)  # generated: no literal that looks like a credential
MiB = 1024 * 1024


def rel(filename: str) -> str:
    return f"{OWNER_REPO}/resolve/{REV}/{filename}"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    rev = root / OWNER_REPO / "resolve" / REV
    (rev / ".rigkit-verified").mkdir(parents=True)
    (rev / "model.gguf").write_bytes(os.urandom(MiB + 7))
    (rev / "gated.gguf").write_bytes(b"a gated model of another run")
    (rev / "model.gguf.part").write_bytes(b"half a download")
    (rev / ".rigkit-verified" / "model.gguf.json").write_text('{"secret": "record"}')
    (rev / "hidden-link.gguf").symlink_to(rev / ".rigkit-verified" / "model.gguf.json")
    (rev / "part-link.gguf").symlink_to(rev / "model.gguf.part")
    os.mkfifo(rev / "fifo.gguf")
    return root


def request(
    port: int, path: str, *, headers: dict[str, str] | None = None, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def connect_from(source: str, port: int) -> socket.socket:
    """A connection to the mirror on 127.0.0.1 whose source is ``source`` (another "host" on loopback)."""
    sock = socket.socket()
    sock.settimeout(10)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def closed_by_mirror(sock: socket.socket, wait: float) -> bool:
    """True when the mirror closes ``sock`` within ``wait`` seconds without answering."""
    sock.settimeout(wait)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def fetch_from(source: str, port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.fixture
def guarded(tree: Path) -> Iterator[tuple[ModelMirror, io.StringIO]]:
    log = io.StringIO()
    with ModelMirror(tree, secret=SECRET, allow=[rel("model.gguf")], log=log) as server:
        yield server, log


# ------------------------------------------------------------------------------------------ secret, allow-list
def test_every_request_must_carry_the_secret(guarded: tuple[ModelMirror, io.StringIO], tree: Path) -> None:
    server, log = guarded
    assert request(server.port, f"/{rel('model.gguf')}")[0] == 404
    wrong = SECRET[:-1] + ("A" if SECRET[-1] != "A" else "B")  # one character off
    assert request(server.port, f"/{wrong}/{rel('model.gguf')}")[0] == 404
    assert request(server.port, f"/{SECRET}")[0] == 404
    status, _, body = request(server.port, f"/{SECRET}/{rel('model.gguf')}")
    assert status == 200 and body == (tree / rel("model.gguf")).read_bytes()
    assert server.base_url == f"{server.url}/{SECRET}" and SECRET not in server.url
    assert "<secret>" in log.getvalue() and SECRET not in log.getvalue()


def test_only_the_files_of_the_run_are_served(guarded: tuple[ModelMirror, io.StringIO]) -> None:
    server, _ = guarded
    assert request(server.port, f"/{SECRET}/{rel('gated.gguf')}")[0] == 404  # present, but not this run's
    assert request(server.port, "/.rigkit/stats")[0] == 404
    assert request(server.port, f"/{SECRET}/.rigkit/stats")[0] == 404


def test_several_addresses_share_one_port(tree: Path) -> None:
    with ModelMirror(tree, bind=["127.0.0.1", "127.0.0.2"]) as server:
        for address in ("127.0.0.1", "127.0.0.2"):
            conn = http.client.HTTPConnection(address, server.port, timeout=10)
            conn.request("HEAD", f"/{rel('model.gguf')}")
            assert conn.getresponse().status == 200
            conn.close()
        with socket.socket() as sock:  # and nothing else: not a wildcard
            assert sock.connect_ex(("127.0.0.3", server.port)) != 0
    with pytest.raises(MirrorError, match="every interface"):
        ModelMirror(tree, bind=["127.0.0.1", "0.0.0.0"])


@pytest.mark.parametrize(
    "bind",
    [
        "0.0.0.0",
        "::",
        "",
        # spellings a socket API also takes for "every interface" (inet_aton's short forms, IPv6 forms)
        "0",
        "0.0",
        "0.0.0",
        "00",
        "0x0",
        " 0.0.0.0 ",
        "::0",
        "0:0:0:0:0:0:0:0",
        "[::]",
        "::ffff:0.0.0.0",
        "::ffff:0:0",
    ],
)
def test_wildcard_bind_is_refused(tree: Path, bind: str) -> None:
    with pytest.raises(MirrorError, match="every interface"):
        ModelMirror(tree, bind=bind, secret=SECRET, allow=[])


def test_a_lan_address_needs_a_secret_and_an_allow_list(tree: Path) -> None:
    with pytest.raises(MirrorError, match="needs a secret and an allow-list"):
        ModelMirror(tree, bind="192.0.2.10")
    with pytest.raises(MirrorError, match="needs a secret and an allow-list"):
        ModelMirror(tree, bind="192.0.2.10", secret=SECRET)
    with pytest.raises(MirrorError, match="16 or more"):
        ModelMirror(tree, secret="x" * 8)


def test_a_lan_address_needs_its_clients(tree: Path) -> None:
    for clients in (None, []):
        with pytest.raises(MirrorError, match=r"serves only the rigs of the run: .*--client ADDR"):
            ModelMirror(tree, bind="192.0.2.10", secret=SECRET, allow=[], clients=clients)
    for client, why in (("rig-1", "not an IP address"), ("0.0.0.0/0", "every address"), ("::/0", "every address")):
        with pytest.raises(MirrorError, match=why):
            ModelMirror(tree, clients=[client])
    with ModelMirror(tree, clients=["192.0.2.7", "[2001:db8::7]", "fe80::7%eth0", "198.51.100.0/24"]) as server:
        assert [str(network) for network in server.clients or ()] == [
            "192.0.2.7/32",
            "2001:db8::7/128",
            "fe80::7/128",
            "198.51.100.0/24",
        ]


# ------------------------------------------------------------------------------------------ files
@pytest.mark.parametrize("name", ["hidden-link.gguf", "part-link.gguf"])
def test_symlink_to_a_hidden_file_or_a_part_is_refused(tree: Path, name: str) -> None:
    assert open_served_file(str(tree), url_parts(f"/{rel(name)}") or []) is None
    with ModelMirror(tree) as server:
        status, _, body = request(server.port, f"/{rel(name)}")
    assert status == 404 and b"secret" not in body and b"half" not in body


def test_a_fifo_is_refused_without_hanging(tree: Path) -> None:
    with ModelMirror(tree, idle_timeout=1.0) as server:
        started = time.monotonic()
        assert request(server.port, f"/{rel('fifo.gguf')}")[0] == 404
        assert time.monotonic() - started < 3
        server.wait()  # nothing stuck in a handler: it idles out
    assert stat.S_ISFIFO(os.stat(tree / rel("fifo.gguf")).st_mode)


# ------------------------------------------------------------------------------------------ Range, headers, log
@pytest.mark.parametrize("digits", [30, 5000])
def test_huge_range_numbers_answer_416(tree: Path, digits: int) -> None:
    log = io.StringIO()
    with ModelMirror(tree, log=log) as server:
        for header in (f"bytes={'9' * digits}-", f"bytes=0-{'9' * digits}", f"bytes=-{'9' * digits}"):
            status, headers, _ = request(server.port, f"/{rel('model.gguf')}", headers={"Range": header})
            assert status == 416 and headers["Content-Range"] == f"bytes */{MiB + 7}"
        assert request(server.port, f"/{rel('model.gguf')}")[0] == 200  # still serving
    assert "Traceback" not in log.getvalue() and "error" not in log.getvalue()


@pytest.mark.parametrize("header", ["abc", "bytes=5-3", "bytes=0-1,5-9", "bytes=x-", "items=0-5"])
def test_malformed_range_sends_the_whole_file(tree: Path, header: str) -> None:
    with ModelMirror(tree) as server:
        status, _, body = request(server.port, f"/{rel('model.gguf')}", headers={"Range": header})
    assert status == 200 and len(body) == MiB + 7


def test_server_header_names_no_python(tree: Path) -> None:
    with ModelMirror(tree) as server:
        _, headers, _ = request(server.port, f"/{rel('model.gguf')}", method="HEAD")
    assert headers["Server"] == "rigkit-mirror/1"


def test_log_lines_are_escaped(tree: Path) -> None:
    log = io.StringIO()
    with ModelMirror(tree, log=log) as server, socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"GET /\x1b[31mred\x07\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.recv(4096)
    text = log.getvalue()
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b[31mred\\x07" in text
    assert escape_log("a\nb\\c\u00e9") == "a\\x0ab\\\\c\\xe9"


# ------------------------------------------------------------------------------------------ time and connections
def test_an_idle_connection_is_dropped_after_the_read_timeout(tree: Path) -> None:
    with (
        ModelMirror(tree, read_timeout=0.5) as server,
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock,
    ):
        started = time.monotonic()
        sock.sendall(b"GET /")  # half a request line, then nothing
        assert sock.recv(4096) == b""  # closed by the mirror, without an answer
        assert 0.4 < time.monotonic() - started < 5


def test_connections_are_capped_and_threads_bounded(tree: Path) -> None:
    baseline = threading.active_count()
    with ModelMirror(tree, max_connections=4, read_timeout=30) as server:
        held = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(60)]
        try:
            time.sleep(0.5)
            assert threading.active_count() <= baseline + 2 + 4 + 1  # serve loop, watchdog-free, 4 handlers
            refused = 0
            for sock in held[4:]:
                sock.settimeout(5)
                try:
                    refused += sock.recv(1) == b""
                except ConnectionResetError:
                    refused += 1
            assert refused == 56
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.3)
        assert request(server.port, f"/{rel('model.gguf')}", method="HEAD")[0] == 200  # slots came back


# ------------------------------------------------------------------------------------------ starving the mirror
def test_only_the_rigs_of_the_run_get_a_connection(tree: Path) -> None:
    """40 idle connections from a host that is no client (127.0.0.2) take no slot and no thread: a rig's fetch
    (127.0.0.3, a client) and this machine's (127.0.0.1) are served while they stay open."""
    log = io.StringIO()
    baseline = threading.active_count()
    with ModelMirror(tree, secret=SECRET, allow=[rel("model.gguf")], clients=["127.0.0.3"], log=log) as server:
        held = [connect_from("127.0.0.2", server.port) for _ in range(40)]
        try:
            assert all(closed_by_mirror(sock, 5) for sock in held)
            assert threading.active_count() <= baseline + 1  # the serve loop, no handler
            for source in ("127.0.0.3", "127.0.0.1"):
                status, body = fetch_from(source, server.port, f"/{SECRET}/{rel('model.gguf')}")
                assert status == 200 and body == (tree / rel("model.gguf")).read_bytes()
        finally:
            for sock in held:
                sock.close()
    assert "127.0.0.2 refused: not a client of this run" in log.getvalue()


def test_one_client_cannot_take_every_slot(tree: Path) -> None:
    """A client that opens 40 idle connections holds MAX_PER_CLIENT of them; another client is still served."""
    with ModelMirror(tree, clients=["127.0.0.2", "127.0.0.3"], read_timeout=30) as server:
        held = [connect_from("127.0.0.2", server.port) for _ in range(40)]
        try:
            time.sleep(0.5)  # every one accepted: the refused ones are closed by now
            still_open = [sock for sock in held if not closed_by_mirror(sock, 0.05)]
            assert len(still_open) == MAX_PER_CLIENT
            status, body = fetch_from("127.0.0.3", server.port, f"/{rel('model.gguf')}")
            assert status == 200 and len(body) == MiB + 7
        finally:
            for sock in held:
                sock.close()


def test_a_trickled_request_is_dropped_at_the_read_deadline(tree: Path) -> None:
    """One byte every 0.5 s never lets a single recv time out; the request head's deadline still drops it."""
    read_timeout = 2.0
    head = f"GET /{rel('model.gguf')} HTTP/1.1\r\nHost: x\r\nUser-Agent: slow\r\n".encode()  # never ends
    with (
        ModelMirror(tree, read_timeout=read_timeout) as server,
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock,
    ):
        started = time.monotonic()
        dropped_after = None
        for byte in head:
            try:
                sock.sendall(bytes([byte]))
                if select.select([sock], [], [], 0.5)[0]:
                    assert sock.recv(4096) == b"", "the mirror answered a request it never got whole"
                    dropped_after = time.monotonic() - started
            except (BrokenPipeError, ConnectionResetError):
                dropped_after = time.monotonic() - started
            if dropped_after is not None or time.monotonic() - started > read_timeout + 3:
                break
    assert dropped_after is not None, "a trickling client held its connection past the read deadline"
    assert read_timeout - 0.2 < dropped_after < read_timeout + 1.0


def read_until_closed(sock: socket.socket) -> bytes:
    sock.settimeout(2)
    answer = b""
    while chunk := sock.recv(4096):  # a connection kept alive times out here instead of ending
        answer += chunk
    return answer


def test_requests_without_the_secret_are_not_activity(tree: Path) -> None:
    """404s for a URL without the secret, one every 0.2 s, neither keep the idle mirror alive nor their
    connection: each is closed after its answer."""
    idle_timeout = 1.0
    server = ModelMirror(tree, secret=SECRET, allow=[rel("model.gguf")], idle_timeout=idle_timeout).start()
    started = time.monotonic()
    answered = 0
    try:
        while not server._stopped.is_set() and time.monotonic() - started < idle_timeout + 3:
            try:
                with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
                    sock.sendall(f"GET /{rel('model.gguf')} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                    answer = read_until_closed(sock)
            except (ConnectionRefusedError, ConnectionResetError):
                break  # stopped between two requests
            assert answer.startswith(b"HTTP/1.1 404") and b"\r\nConnection: close\r\n" in answer
            answered += 1
            time.sleep(0.2)
        stopped_after = time.monotonic() - started
        assert server._done.wait(2), "requests without the secret kept the mirror alive"
    finally:
        server.stop()
    assert answered >= 3 and stopped_after < idle_timeout + 1.5


def test_a_connect_flood_writes_a_few_log_lines(tree: Path) -> None:
    """200 refused connections: one line at once and one count at shutdown, not a line each."""
    log = io.StringIO()
    with ModelMirror(tree, clients=["127.0.0.3"], log=log) as server:
        for _ in range(200):
            connect_from("127.0.0.2", server.port).close()
        # accepted in order: once the rig is answered, every connection of the flood has been refused
        assert fetch_from("127.0.0.3", server.port, f"/{rel('model.gguf')}")[0] == 200
    refusals = [line for line in log.getvalue().splitlines() if "refused" in line]
    assert len(refusals) == 2, refusals
    assert "127.0.0.2 refused: not a client of this run" in refusals[0]
    assert re.search(
        r"refused 199 more connections in \d+ s \(199 not a client of this run\) from 127\.0\.0\.2 \(199\)", refusals[1]
    )


def test_maximum_age_stops_a_busy_mirror(tree: Path) -> None:
    server = ModelMirror(tree, max_age=1.0, read_timeout=30).start()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"GET /")  # a handler stuck waiting for the rest of the request
        started = time.monotonic()
        server.wait()
    assert time.monotonic() - started < 4


def test_the_mirror_stops_when_the_watched_process_exits(tree: Path) -> None:
    parent = subprocess.Popen(["sleep", "60"])
    try:
        server = ModelMirror(tree, watch_pid=parent.pid).start()
        time.sleep(0.6)
        assert not server._stopped.is_set()
        parent.kill()  # not reaped yet: a zombie counts as gone
        started = time.monotonic()
        server.wait()
        assert time.monotonic() - started < 3
    finally:
        parent.kill()
        parent.wait()
    with pytest.raises(MirrorError, match="not running"):
        ModelMirror(tree, watch_pid=parent.pid)


# ------------------------------------------------------------------------------------------ bin/rigkit mirror
def test_cli_secret_stays_off_the_command_line(tree: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    secret_file = run / "mirror.secret"
    argv = [*RIGKIT, "--root", str(tree), "--pidfile", str(run / "m.pid"), "--logfile", str(run / "m.log")]
    argv += ["--secret-file", str(secret_file), "--allow", rel("model.gguf"), "--max-age", "60"]
    started = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert started.returncode == 0, started.stderr
    info = json.loads(started.stdout)
    try:
        secret = secret_file.read_text().strip()
        assert len(secret) >= 30 and stat.S_IMODE(secret_file.stat().st_mode) == 0o600
        assert secret not in started.stdout
        assert secret.encode() not in Path(f"/proc/{info['pid']}/cmdline").read_bytes()
        port = info["port"]
        assert request(port, f"/{rel('model.gguf')}")[0] == 404
        assert request(port, f"/{secret}/{rel('gated.gguf')}")[0] == 404
        assert request(port, f"/{secret}/{rel('model.gguf')}")[0] == 200
    finally:
        subprocess.run([*RIGKIT, "--stop", "--pidfile", str(run / "m.pid")], capture_output=True, timeout=60)
    assert secret not in (run / "m.log").read_text()


@contextlib.contextmanager
def runs_sharing_a_mirror(
    tree: Path, tmp_path: Path, count: int
) -> Iterator[tuple[list[str], int, list[subprocess.Popen]]]:
    """``count`` runs on one port and run directory, each a process the mirror watches (--watch-pid, as
    --watch-ansible names the ansible-playbook run); the first run's mirror serves. Yields (the start's argv without
    --watch-pid, the port, the runs)."""
    port = free_port()
    runs = [subprocess.Popen(["sleep", "120"]) for _ in range(count)]
    pidfile = tmp_path / "m.pid"
    base = [*RIGKIT, "--root", str(tree), "--pidfile", str(pidfile), "--logfile", str(tmp_path / "m.log")]
    base += ["--port", str(port), "--max-age", "120"]
    try:
        first = subprocess.run(
            [*base, "--watch-pid", str(runs[0].pid)], capture_output=True, text=True, timeout=60, check=False
        )
        assert first.returncode == 0, first.stderr
        yield base, port, runs
    finally:
        for run in runs:
            run.kill()
            run.wait()
        subprocess.run([*RIGKIT, "--stop", "--pidfile", str(pidfile)], capture_output=True, timeout=60, check=False)


def _stderr_until(process: subprocess.Popen, text: str, timeout: float) -> str:
    """What ``process`` printed on stderr up to the line holding ``text`` (the test fails after ``timeout``)."""
    assert process.stderr is not None
    printed, deadline = "", time.monotonic() + timeout
    while text not in printed:
        ready, _, _ = select.select([process.stderr], [], [], max(0.0, deadline - time.monotonic()))
        line = process.stderr.readline() if ready else ""
        assert line, f"no {text!r} within {timeout} s: {printed}"
        printed += line
    return printed


def test_cli_waits_for_another_runs_mirror_instead_of_replacing_it(tree: Path, tmp_path: Path) -> None:
    """Two provisions on one controller share the mirror's run directory and port: the second run's mirror starts
    once the first run's has stopped (it stops when that run ends), never under it. Each run is a process the
    mirror watches."""
    with runs_sharing_a_mirror(tree, tmp_path, 2) as (base, port, runs):
        second = subprocess.Popen(
            [*base, "--watch-pid", str(runs[1].pid)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        # from its own word that it waits, not from a sleep: its start may take seconds on a busy machine
        announced = _stderr_until(second, "waiting for the mirror of another run", timeout=60)
        time.sleep(1)
        assert second.poll() is None, second.communicate()
        assert request(port, f"/{rel('model.gguf')}")[0] == 200  # the first run's mirror still serves
        runs[0].kill()
        runs[0].wait()
        out, err = second.communicate(timeout=60)
        err = announced + err
        assert second.returncode == 0, err
        started = json.loads(out)
        assert started["port"] == port and started["waited_s"] >= 1  # the first mirror, its run gone, may be replaced
        assert f"waiting for the mirror of another run (ansible-playbook pid {runs[0].pid})" in err
        assert request(port, f"/{rel('model.gguf')}")[0] == 200


def test_cli_runs_that_waited_for_one_mirror_start_theirs_one_at_a_time(tree: Path, tmp_path: Path) -> None:
    """Two runs waiting for a third run's mirror: when it stops, one starts its mirror and the other waits for that
    one, instead of both starting at once on the one port."""
    with runs_sharing_a_mirror(tree, tmp_path, 3) as (base, port, runs):
        waiting = {
            run.pid: subprocess.Popen(
                [*base, "--watch-pid", str(run.pid)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for run in runs[1:]
        }
        time.sleep(1)
        assert all(start.poll() is None for start in waiting.values())
        runs[0].kill()
        runs[0].wait()
        deadline = time.monotonic() + 60
        while not any(start.poll() is not None for start in waiting.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)
        started = [pid for pid, start in waiting.items() if start.poll() is not None]
        assert len(started) == 1, {pid: start.poll() for pid, start in waiting.items()}
        assert waiting[started[0]].returncode == 0, waiting[started[0]].communicate()
        (later,) = (pid for pid in waiting if pid != started[0])
        for run in runs:
            if run.pid == started[0]:
                run.kill()
                run.wait()
        out, err = waiting[later].communicate(timeout=60)
        assert waiting[later].returncode == 0, err
        assert json.loads(out)["port"] == port


def test_cli_replaces_a_mirror_of_its_own_run(tree: Path, tmp_path: Path) -> None:
    """A second models play in the same run (or a run started again by hand) starts afresh, as before."""
    run = subprocess.Popen(["sleep", "120"])
    pidfile = tmp_path / "m.pid"
    base = [*RIGKIT, "--root", str(tree), "--pidfile", str(pidfile), "--logfile", str(tmp_path / "m.log")]
    base += ["--max-age", "120", "--watch-pid", str(run.pid)]
    try:
        first = subprocess.run(base, capture_output=True, text=True, timeout=60, check=False)
        again = subprocess.run(base, capture_output=True, text=True, timeout=60, check=False)
        assert first.returncode == 0 and again.returncode == 0, (first.stderr, again.stderr)
        assert json.loads(again.stdout)["replaced"] is True
        assert json.loads(again.stdout)["pid"] != json.loads(first.stdout)["pid"]
    finally:
        run.kill()
        run.wait()
        subprocess.run([*RIGKIT, "--stop", "--pidfile", str(pidfile)], capture_output=True, timeout=60, check=False)


def test_cli_serves_only_its_clients(tree: Path, tmp_path: Path) -> None:
    argv = [*RIGKIT, "--root", str(tree), "--pidfile", str(tmp_path / "m.pid"), "--logfile", str(tmp_path / "m.log")]
    argv += ["--client", "127.0.0.3", "--client", "192.0.2.0/24", "--max-age", "60"]
    started = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert started.returncode == 0, started.stderr
    port = json.loads(started.stdout)["port"]
    try:
        with connect_from("127.0.0.2", port) as sock:
            assert closed_by_mirror(sock, 5)
        assert fetch_from("127.0.0.3", port, f"/{rel('model.gguf')}")[0] == 200
    finally:
        subprocess.run([*RIGKIT, "--stop", "--pidfile", str(tmp_path / "m.pid")], capture_output=True, timeout=60)
    log = (tmp_path / "m.log").read_text()
    assert "clients: 127.0.0.3, 192.0.2.0/24" in log and "127.0.0.2 refused: not a client" in log
    lan = [*RIGKIT, "--root", str(tree), "--pidfile", str(tmp_path / "l.pid"), "--logfile", str(tmp_path / "l.log")]
    lan += ["--bind", "192.0.2.10", "--secret-file", str(tmp_path / "s"), "--allow", rel("model.gguf")]
    failed = subprocess.run(lan, capture_output=True, text=True, timeout=60, check=False)
    assert failed.returncode == 1 and "--client ADDR" in failed.stderr


def test_cli_refuses_a_run_directory_another_user_could_change(tree: Path, tmp_path: Path) -> None:
    """A shared RIGKIT_CACHE_DIR: whoever may write the run directory could plant a symlink where the mirror
    writes its pid, log or stats, or read the secret; the mirror refuses it and writes nothing."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    elsewhere = tmp_path / "victim"
    (shared / "m.log").symlink_to(elsewhere)
    argv = [*RIGKIT, "--root", str(tree), "--pidfile", str(shared / "m.pid"), "--logfile", str(shared / "m.log")]
    refused = subprocess.run([*argv, "--max-age", "60"], capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 1, refused.stderr
    assert f"refusing its run directory: {shared} is writable by others (mode 0777)" in refused.stderr
    assert not elsewhere.exists() and not (shared / "m.pid").exists()

    linked = tmp_path / "linked"
    linked.symlink_to(tmp_path / "private", target_is_directory=True)
    (tmp_path / "private").mkdir(mode=0o700)
    argv = [*RIGKIT, "--root", str(tree), "--pidfile", str(linked / "m.pid"), "--logfile", str(linked / "m.log")]
    refused = subprocess.run([*argv, "--max-age", "60"], capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 1 and f"{linked} is a symlink" in refused.stderr, refused.stderr


def test_cli_mirror_exits_with_the_ansible_run_that_started_it(tree: Path, tmp_path: Path) -> None:
    """A play that starts the mirror and never stops it (every rig unreachable, say): the mirror still goes."""
    pidfile = tmp_path / "m.pid"
    playbook = tmp_path / "play.yml"
    argv = [*RIGKIT, "--root", str(tree), "--pidfile", str(pidfile), "--logfile", str(tmp_path / "m.log")]
    argv += ["--watch-ansible"]
    playbook.write_text(
        "- name: Start a mirror and leave it running\n  hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - name: Start\n      ansible.builtin.command:\n        argv: " + json.dumps(argv) + "\n"
    )
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}
    ran = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            *("-i", "localhost,", "-c", "local", str(playbook)),
            *("-e", f"ansible_python_interpreter={sys.executable}"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env=env,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists(), "the mirror outlived the ansible-playbook run"
    assert "has exited: stopping" in (tmp_path / "m.log").read_text()


def test_cli_watch_ansible_outside_ansible_is_refused(tree: Path, tmp_path: Path) -> None:
    argv = [*RIGKIT, "--root", str(tree), "--pidfile", str(tmp_path / "p"), "--logfile", str(tmp_path / "l")]
    failed = subprocess.run([*argv, "--watch-ansible"], capture_output=True, text=True, timeout=60, check=False)
    assert failed.returncode == 1 and "no ansible-playbook process" in failed.stderr


def served_tiny(source: Path, tmp_path: Path) -> tuple[Path, dict[str, object]]:
    """The mirror's cache root holding ``source`` as tiny.gguf, and its catalog entry."""
    import hashlib
    import shutil

    root = tmp_path / "cache"
    served = root / rel("tiny.gguf")
    served.parent.mkdir(parents=True)
    shutil.copyfile(source, served)
    entry = {
        "repo": OWNER_REPO,
        "revision": REV,
        "filename": "tiny.gguf",
        "sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
        "size": source.stat().st_size,
        "architecture": "gemma4",
        "role": "target",
    }
    return root, entry


# -------------------------------------------------------------------------------------------------- no token
def test_gguf_fetch_never_sends_a_token_to_the_mirror(
    tiny_gemma4_pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The play passes no token, the rig's environment has HF_TOKEN: the mirror must still see none."""
    from tests.support import run_gguf_fetch

    root, entry = served_tiny(tiny_gemma4_pair[0], tmp_path)
    token = "hf_" + os.urandom(12).hex()
    monkeypatch.setenv("HF_TOKEN", token)
    (tmp_path / "rig").mkdir()
    args = {"entry": entry, "dest": str(tmp_path / "rig" / "tiny.gguf"), "allow_insecure_http": True}
    with ModelMirror(root, secret=SECRET, allow=[rel("tiny.gguf")]) as server:
        result, printed = run_gguf_fetch({**args, "base_url": server.url, "mirror_secret": SECRET})
        assert not result.get("failed"), result.get("msg")
        assert result["changed"] and result["bytes_downloaded"] == entry["size"]
        assert server.stats()["credentialed_requests"] == 0
        assert server.stats()["files"][f"/{rel('tiny.gguf')}"]["complete"] == 1
        assert SECRET not in printed and token not in printed
        run_gguf_fetch({**args, "base_url": server.url, "mirror_secret": SECRET, "token": token})
        assert server.stats()["credentialed_requests"] == 0  # an explicit token is dropped too


def test_an_interrupted_mirror_download_leaves_no_secret_on_the_rig(
    tiny_gemma4_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """Ctrl-C in the middle of a download from the mirror: the part and its metadata stay (resumable), and neither
    they nor the result carry the run's secret (it is worthless after the run, but it is the run's credential)."""
    from ansible.module_utils.fetch.model import fetch_model
    from ansible.module_utils.fetch.spec import CatalogEntry, FetchOptions

    root, mapping = served_tiny(tiny_gemma4_pair[0], tmp_path)
    entry = CatalogEntry.from_mapping(mapping)
    rig = tmp_path / "rig"
    rig.mkdir()

    def interrupt(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with ModelMirror(root, secret=SECRET, allow=[rel("tiny.gguf")]) as server:
        options = FetchOptions(base_url=server.url, mirror_secret=SECRET, allow_insecure_http=True, progress=interrupt)
        with pytest.raises(KeyboardInterrupt):
            fetch_model(entry, str(rig / "tiny.gguf"), options)
        left = {path.relative_to(rig).as_posix(): path.read_bytes() for path in rig.rglob("*") if path.is_file()}
        assert "tiny.gguf.part" in left and any(name.endswith(".part.json") for name in left), sorted(left)
        assert all(SECRET.encode() not in body for body in left.values()), sorted(left)
        meta = next(json.loads(body) for name, body in left.items() if name.endswith(".part.json"))
        assert meta["url"] == f"{server.url}/{OWNER_REPO}/resolve/{REV}/tiny.gguf"

        # the resumed download finishes, and what it returns names the mirror without the secret
        result = fetch_model(entry, str(rig / "tiny.gguf"), FetchOptions(**{**vars(options), "progress": None}))
        assert result.changed and result.url == meta["url"]
        assert SECRET not in json.dumps(result.as_dict())
        assert not any(SECRET.encode() in path.read_bytes() for path in rig.rglob("*") if path.is_file())
