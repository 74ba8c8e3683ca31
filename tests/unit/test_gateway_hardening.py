"""The fleet gateway under attack, run for real: the role's own checks and tasks write haproxy.cfg and the key files
(tests/unit/playbooks/render_gateway.yml), Debian's HAProxy (tests/haproxy.py) serves them on loopback in front of
a stand-in rig, and the attacks of issue 49 go at it: a client key that ends in a newline, a comma in the
Authorization header, idle sockets and a trickler from one address while a client from another is served."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import select
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.haproxy import haproxy
from tests.support import CACHE_DIR, REPO, free_port, group_vars, json_play

KEY = "gw-client-key-" + "7f3a" * 5
RIG_KEY = "gw-rig-key-" + "c2d9" * 5
ROLE = REPO / "roles" / "fleet_gateway"
# Where the flood comes from, and where the client the gateway must still serve connects from.
ATTACKER, CLIENT = "127.0.0.1", "127.0.0.2"
# A third address, of a client the gateway has not counted yet: only the handshake deadline can drop its trickle.
TRICKLER = "127.0.0.3"
HANDSHAKE_DEADLINE = 5  # seconds, roles/fleet_gateway's fleet_gateway_timeout_handshake
KEEP_ALIVE = 2  # seconds, its fleet_gateway_timeout_keep_alive
# A client that keeps its answered connections open, as Python requests does for each response it keeps.
KEEPER = "127.0.0.4"
FLOOD = 300  # more than the gateway's 256 connections of today's main
# The first bytes of a TLS ClientHello (record header, handshake type, part of its length): a handshake never ended.
CLIENT_HELLO_HEAD = bytes.fromhex("160301020001") + bytes(58)


class StandInRig(BaseHTTPRequestHandler):
    """llama-server's answers the gateway needs: /health, and a completion after ``delay`` seconds."""

    seen: list[str] = []  # noqa: RUF012 - the Authorization headers the rig got, shared by the server's threads
    received: list[int] = []  # noqa: RUF012 - body bytes of each request the rig read
    delay = 0.0

    def do_GET(self) -> None:
        self._answer({"status": "ok"})

    def do_POST(self) -> None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while (size := int(self.rfile.readline().strip() or b"0", 16)) > 0:
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).received.append(len(body))
        type(self).seen.append(self.headers.get("Authorization", ""))
        time.sleep(type(self).delay)
        self._answer({"choices": [{"message": {"content": "hi"}}]})

    def _answer(self, document: dict[str, Any]) -> None:
        body = json.dumps(document).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


@dataclass
class Rendered:
    work: Path
    result: dict[str, Any]
    files: Path
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def failures(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for play in self.result.get("plays", []):
            for task in play["tasks"]:
                for host, outcome in task["hosts"].items():
                    if outcome.get("failed"):
                        found.setdefault(host, str(outcome.get("msg", "")))
        return found


def config_tasks(dest: Path) -> Path:
    """The role's tasks/config.yml as it is, less owners, the template's check and the reload notifications."""
    tasks = yaml.safe_load((ROLE / "tasks" / "config.yml").read_text())
    for task in tasks:
        task.pop("notify", None)
        for module in ("ansible.builtin.copy", "ansible.builtin.template", "ansible.builtin.file"):
            if module in task:
                for key in ("owner", "group", "validate"):
                    task[module].pop(key, None)
        if "ansible.builtin.template" in task:
            template = task["ansible.builtin.template"]
            template["src"] = str(ROLE / "templates" / template["src"])
            template["dest"] = str(dest.parent / "haproxy.written.cfg")  # not /etc/haproxy of this machine
    dest.write_text(yaml.safe_dump(tasks, sort_keys=False))
    return dest


def render(work: Path, client_key: str, rig_port: int, *, verify: bool = False, **settings: Any) -> Rendered:
    """The role's checks and file tasks for a gateway on this machine in front of one loopback rig (``verify``:
    then the role's verify.yml, against the gateway that runs them)."""
    files = work / "etc"
    inventory = {
        "all": {
            "vars": {"model_catalog": group_vars("all/model_catalog")["model_catalog"]},
            "children": {
                "rigs": {
                    "hosts": {
                        "gw-rig": {
                            "llama_server_host": "127.0.0.1",
                            "llama_server_port": rig_port,
                            "llama_server_api_key": RIG_KEY,
                            "models_target": "tiny-gemma4-target",
                        }
                    }
                },
                "gateway": {
                    "hosts": {
                        "gw": {
                            "ansible_connection": "local",
                            "ansible_python_interpreter": str(REPO / ".venv" / "bin" / "python"),
                            "fleet_gateway_api_key": client_key,
                            "fleet_gateway_rigs": ["gw-rig"],
                            "fleet_gateway_rigs_share_network": True,
                            "fleet_gateway_port": settings.pop("port", free_port()),
                            "fleet_gateway_stats_port": 0,
                            "fleet_gateway_haproxy_version": "2.6.12-*",
                            **settings,
                        }
                    }
                },
            },
        }
    }
    (work / "hosts.json").write_text(json.dumps(inventory))
    paths = {
        "__fleet_gateway_dir": str(files),
        "__fleet_gateway_chroot": "",
        "__fleet_gateway_socket_dir_in_chroot": str(work / "sockets"),
        "config_tasks": str(config_tasks(work / "config.yml")),
        "role_path": str(ROLE),  # the copy of config.yml runs outside the role; the role's digest reads it
        **({"verify_tasks": str(ROLE / "tasks" / "verify.yml")} if verify else {}),
    }
    (work / "settings.json").write_text(json.dumps(paths))
    playbook = REPO / "tests" / "unit" / "playbooks" / "render_gateway.yml"
    result = json_play(work / "hosts.json", playbook, "-e", f"@{work / 'settings.json'}")
    return Rendered(work, result, files, inventory["all"]["children"]["gateway"]["hosts"]["gw"])


def runnable(config: str) -> str:
    """haproxy.cfg as the role wrote it, less what binds it to a gateway host: the chroot, the haproxy user and
    group (this machine has none), the admin socket in /run and the syslog socket; every proxy stays as written."""
    host_bound = re.compile(r"^\s+(chroot|user|group|daemon|stats socket|log /dev/log)\b.*\n", re.MULTILINE)
    config = host_bound.sub("", config)
    return config.replace(" user haproxy mode 600", " mode 600")


@dataclass
class Gateway:
    rendered: Rendered
    port: int
    process: subprocess.Popen[bytes]

    @property
    def cert(self) -> str:
        return str(self.rendered.files / "gateway.pem")

    def request(
        self, method: str, path: str, *, source: str = CLIENT, authorization: str | None = None, timeout: float = 5
    ) -> tuple[int, bytes, float]:
        """(status, body, seconds) of one HTTPS request from ``source``, verified against the gateway's certificate."""
        context = ssl.create_default_context(cafile=self.cert)
        started = time.monotonic()
        connection = http.client.HTTPSConnection(
            "127.0.0.1", self.port, source_address=(source, 0), context=context, timeout=timeout
        )
        try:
            headers = {"Content-Type": "application/json"}
            if authorization is not None:
                headers["Authorization"] = authorization
            body = json.dumps({"model": "tiny-gemma4", "messages": [{"role": "user", "content": "hi"}]})
            connection.request(method, path, body=body if method == "POST" else None, headers=headers)
            answer = connection.getresponse()
            return answer.status, answer.read(), time.monotonic() - started
        finally:
            connection.close()


@pytest.fixture(scope="module")
def rig() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandInRig)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, rig: ThreadingHTTPServer) -> Iterator[Gateway]:
    binary, env = haproxy(CACHE_DIR)
    work = tmp_path_factory.mktemp("gateway")
    rendered = render(work, KEY, rig.server_address[1])
    assert not rendered.failures, rendered.failures
    config = work / "haproxy.cfg"
    config.write_text(runnable((work / "haproxy.written.cfg").read_text()))
    check = subprocess.run([str(binary), "-c", "-f", str(config)], env=env, capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    log = (work / "haproxy.log").open("wb")
    process = subprocess.Popen([str(binary), "-db", "-f", str(config)], env=env, stdout=log, stderr=log)
    started = Gateway(rendered, rendered.settings["fleet_gateway_port"], process)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if started.request("GET", "/health", source=ATTACKER, timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline and process.poll() is None, (work / "haproxy.log").read_text()
            time.sleep(0.2)
        yield started
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


# ------------------------------------------------------------------------------------ item 1: the client key
def test_the_client_key_opens_the_gateway_and_its_requests_reach_the_rig_with_the_rigs_own_key(gateway: Gateway):
    assert gateway.request("GET", "/v1/models", authorization=f"Bearer {KEY}")[0] == 200
    StandInRig.seen.clear()
    status, _body, _seconds = gateway.request("POST", "/v1/chat/completions", authorization=f"Bearer {KEY}")
    assert status == 200 and StandInRig.seen == [f"Bearer {RIG_KEY}"]


@pytest.mark.parametrize("authorization", [None, "Bearer client", f"Bearer {KEY[:-1]}", f"Basic x, Bearer {KEY}"])
def test_anything_but_the_whole_header_bearer_key_is_refused(gateway: Gateway, authorization: str | None):
    """req.hdr splits a header on commas and reads its last value; the key is the whole header's."""
    status, body, _seconds = gateway.request("GET", "/v1/models", authorization=authorization)
    assert status == 401, body


def test_a_client_key_ending_in_a_newline_is_refused_before_any_file_is_written(tmp_path: Path):
    """openssl rand -hex 32 | ansible-vault encrypt_string --stdin-name stores the key with its newline; the key
    file then held a second line, `client`, which HAProxy took for a key of its own."""
    rendered = render(tmp_path, KEY + "\n", free_port())
    message = rendered.failures.get("gw")
    assert message is not None, "a key ending in a newline was accepted"
    assert "fleet_gateway_api_key" in message and "inventory/host_vars/gw.yml" in message
    assert KEY not in json.dumps(rendered.result)  # the value is never shown, not even in the result
    assert not rendered.files.exists() or not any(rendered.files.iterdir())


def test_the_roles_verify_step_passes_on_the_gateway_running_its_files(gateway: Gateway, rig: ThreadingHTTPServer):
    """verify.yml against the running gateway: the same configuration (no restart asked), /health, the models."""
    again = render(gateway.rendered.work, KEY, rig.server_address[1], verify=True, port=gateway.port)
    assert not again.failures, again.failures
    ran = {task["task"]["name"]: task["hosts"]["gw"] for task in again.result["plays"][0]["tasks"]}
    assert ran["Restart HAProxy when it runs another configuration than this one"].get("skipped")
    assert not ran["Check that the gateway runs this configuration and lists the fleet's models"].get("failed")
    assert KEY not in json.dumps(again.result)


# ------------------------------------------------------------------------------ item 2: holding every connection
def connect_from(source: str, port: int) -> socket.socket | None:
    sock = socket.socket()
    sock.settimeout(1)
    try:
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", port))
    except OSError:
        sock.close()
        return None
    return sock


def closed_by_gateway(sock: socket.socket, wait: float) -> bool:
    try:
        if not select.select([sock], [], [], wait)[0]:
            return False
        return sock.recv(1) == b""
    except OSError:
        return True


def trickle(port: int, stop: threading.Event, dropped: list[float], source: str = ATTACKER) -> None:
    """A TLS handshake one byte every 0.5 s from ``source``, until the gateway drops it or ``stop``."""
    sock = connect_from(source, port)
    if sock is None:
        dropped.append(0.0)
        return
    started = time.monotonic()
    with sock:
        for byte in CLIENT_HELLO_HEAD:
            if stop.is_set():
                return
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                dropped.append(time.monotonic() - started)
                return
            if closed_by_gateway(sock, 0.5):
                dropped.append(time.monotonic() - started)
                return


def test_idle_sockets_and_a_trickler_from_one_address_leave_a_client_from_another_served(gateway: Gateway):
    """FLOOD idle connections that never start TLS and a trickled handshake from 127.0.0.1; a client with the key
    from 127.0.0.2 is still answered, within a few seconds."""
    stop, dropped = threading.Event(), []
    trickler = threading.Thread(target=trickle, args=(gateway.port, stop, dropped), daemon=True)
    flood = [sock for sock in (connect_from(ATTACKER, gateway.port) for _ in range(FLOOD)) if sock is not None]
    established = len(flood)
    trickler.start()
    try:
        time.sleep(1)  # the gateway accepted (and refused) what it would
        held = [sock for sock in flood if not closed_by_gateway(sock, 0.01)]
        status, _body, seconds = gateway.request(
            "POST", "/v1/chat/completions", authorization=f"Bearer {KEY}", timeout=10
        )
        print(
            f"flood: {FLOOD} connections tried from {ATTACKER}, {established} established, {len(held)} held by the "
            f"gateway; trickler dropped after {dropped}; authorised request "
            f"from {CLIENT}: {status} in {seconds:.3f} s"
        )
        assert status == 200 and seconds < 5
    finally:
        stop.set()
        trickler.join(timeout=5)
        for sock in flood:
            sock.close()


def test_a_handshake_trickled_a_byte_at_a_time_is_dropped_at_the_handshake_deadline(gateway: Gateway):
    stop, dropped = threading.Event(), []
    deadline = 20.0  # the loop ends by itself: CLIENT_HELLO_HEAD's 64 bytes take 32 s at most
    trickler = threading.Thread(target=trickle, args=(gateway.port, stop, dropped, TRICKLER), daemon=True)
    trickler.start()
    trickler.join(timeout=deadline)
    stop.set()
    trickler.join(timeout=5)
    print(f"trickled handshake dropped after {dropped[0] if dropped else None} s")
    assert dropped, "a trickled handshake held its connection past the handshake deadline"
    assert HANDSHAKE_DEADLINE - 1 < dropped[0] < HANDSHAKE_DEADLINE + 3


def test_a_completion_slower_than_the_handshake_deadline_still_arrives(gateway: Gateway):
    """The short handshake deadline is not a short completion: a rig that thinks for 12 s is still waited for."""
    StandInRig.delay = 12
    try:
        status, _body, seconds = gateway.request(
            "POST", "/v1/chat/completions", authorization=f"Bearer {KEY}", timeout=30
        )
    finally:
        StandInRig.delay = 0
    assert status == 200 and seconds >= 12


def test_an_answered_connection_left_open_is_closed_after_the_keep_alive_timeout(gateway: Gateway):
    """A client that keeps every answered socket (requests does, per response kept) holds a per-source slot for
    the keep-alive timeout only, not until its handshake or client timeout."""
    context = ssl.create_default_context(cafile=gateway.cert)
    connection = http.client.HTTPSConnection(
        "127.0.0.1", gateway.port, source_address=(KEEPER, 0), context=context, timeout=10
    )
    try:
        connection.request("GET", "/health")
        answer = connection.getresponse()
        assert answer.status == 200 and answer.read()
        answered = time.monotonic()
        assert connection.sock is not None, "the gateway closed the connection with its answer"
        closed = closed_by_gateway(connection.sock, KEEP_ALIVE + 4)
        seconds = time.monotonic() - answered
    finally:
        connection.close()
    print(f"answered connection closed by the gateway after {seconds:.2f} s idle")
    assert closed and KEEP_ALIVE - 0.5 < seconds < KEEP_ALIVE + 2


# ------------------------------------------------------------------------------------ item 3: the body limit
MAX_BODY = 192 * 1024  # roles/fleet_gateway's fleet_gateway_max_body_kib, in bytes


def raw_request(gateway: Gateway, head: bytes, body: bytes) -> tuple[int, int]:
    """(status the gateway answers, bytes of body the rig received) for one hand-written HTTPS request."""
    context = ssl.create_default_context(cafile=gateway.cert)
    StandInRig.received.clear()
    plain = socket.create_connection(("127.0.0.1", gateway.port), timeout=10, source_address=(CLIENT, 0))
    with context.wrap_socket(plain, server_hostname="127.0.0.1") as tls:
        answer = b""
        # a refusal can come, and the gateway close, while the body is still on its way: then read what it said
        with contextlib.suppress(ssl.SSLError, OSError):
            tls.sendall(head + body)
        try:
            while b"\r\n" not in answer:
                chunk = tls.recv(4096)
                if not chunk:
                    break
                answer += chunk
        except (ssl.SSLError, OSError):
            pass
    assert answer.startswith(b"HTTP/1."), answer[:200]
    return int(answer.split(b" ", 2)[1]), sum(StandInRig.received)


def chunked(body: bytes, size: int = 8192) -> bytes:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"


def test_a_chunked_body_behind_a_large_head_cannot_pass_the_body_limit(gateway: Gateway):
    """A head that fills most of the buffer, then a chunked body of twice the limit: before, HAProxy saw only the
    part that fitted (under the limit) and streamed the rest to the rig. Now chunked bodies and heads past 16 KiB
    are refused, so every body the gateway forwards is one it read whole."""
    document = json.dumps({"model": "tiny-gemma4", "prompt": "x" * (2 * MAX_BODY)}).encode()
    pad = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"p" * 10_000) for i in range(15))  # 150 KB of the 256 KiB buffer
    common = b"Host: gw\r\nAuthorization: Bearer " + KEY.encode() + b"\r\nContent-Type: application/json\r\n"
    head = b"POST /v1/completions HTTP/1.1\r\n" + common + pad + b"Transfer-Encoding: chunked\r\n\r\n"
    status, forwarded = raw_request(gateway, head, chunked(document))
    assert (status, forwarded) == (411, 0), f"HTTP {status}, {forwarded} body bytes reached the rig"
    small = b"POST /v1/completions HTTP/1.1\r\n" + common + b"Transfer-Encoding: chunked\r\n\r\n"
    assert raw_request(gateway, small, chunked(b'{"model": "tiny-gemma4"}'))[0] == 411  # chunked at all
    big_head = b"POST /v1/completions HTTP/1.1\r\n" + common + pad + b"Content-Length: 24\r\n\r\n"
    assert raw_request(gateway, big_head, b'{"model": "tiny-gemma4"}') == (431, 0)
    fine = b"POST /v1/completions HTTP/1.1\r\n" + common + b"Content-Length: 24\r\nConnection: close\r\n\r\n"
    assert raw_request(gateway, fine, b'{"model": "tiny-gemma4"}') == (200, 24)


# ------------------------------------------------------------------------------------ item 3: secrets in output
def test_no_key_appears_in_the_roles_task_results(gateway: Gateway):
    """Every task result of the role's checks and file tasks, as Ansible's JSON callback reports them (what -v
    prints): the plan names rigs, and only no_log tasks read their keys."""
    shown = json.dumps(gateway.rendered.result)
    assert "gw-rig" in shown and "tiny-gemma4" in shown  # the plan is there
    assert RIG_KEY not in shown, "the rig's llama_server_api_key is in a task result"
    assert KEY not in shown, "the client key is in a task result"
