"""TLS for a llama-server that is not on loopback: the certificate the rig makes for itself
(real openssl), the clients that verify against it (a real TLS server on loopback), the controller-side refusal
of plaintext on the LAN, and the unit's argv (paths, never contents)."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.module_utils.llama_server.api import Endpoint, ServerApiError, health
from ansible.module_utils.tls_cert import (
    certificate_sans,
    expires_within,
    parse_sans,
    public_key,
    run_openssl,
    self_signed_argv,
    wanted_sans,
)

from tests import support
from tests.support import REPO, exec_start_argv, render_server_files

OPENSSL = "openssl"
KEY = "k" * 32


def make_cert(where: Path, names: list[str], days: int = 30) -> tuple[Path, Path]:
    key, cert = where / "server.key", where / "server.crt"
    run_openssl(self_signed_argv(OPENSSL, str(key), str(cert), wanted_sans(names), days))
    return key, cert


def test_wanted_sans_always_carry_loopback_and_leave_wildcards_out() -> None:
    assert wanted_sans(["rig1", "0.0.0.0", "192.168.1.20", "RIG1", "::"]) == [
        "DNS:localhost",
        "DNS:rig1",
        "IP:127.0.0.1",
        "IP:192.168.1.20",
        "IP:::1",
    ]


def test_openssls_san_listing_is_read_back_as_written() -> None:
    text = (
        "X509v3 Subject Alternative Name: \n"
        "    DNS:localhost, DNS:rig1, IP Address:127.0.0.1, IP Address:0:0:0:0:0:0:0:1\n"
    )
    assert parse_sans(text) == ["DNS:localhost", "DNS:rig1", "IP:127.0.0.1", "IP:::1"]


def test_a_self_signed_certificate_carries_the_wanted_names(tmp_path: Path) -> None:
    key, cert = make_cert(tmp_path, ["rig1", "192.168.1.20"])
    assert certificate_sans(OPENSSL, str(cert)) == wanted_sans(["rig1", "192.168.1.20"])
    assert public_key(OPENSSL, cert_path=str(cert)) == public_key(OPENSSL, key_pem=key.read_bytes())
    assert not expires_within(OPENSSL, str(cert), 29 * 86400)
    assert expires_within(OPENSSL, str(cert), 31 * 86400)


class Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"status": "ok", "auth": self.headers.get("Authorization", "")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A real HTTPS server on 127.0.0.1 (port 0) presenting a kit-made certificate."""
    key, cert = make_cert(tmp_path, ["rig1"])
    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], cert
    server.shutdown()
    server.server_close()


def test_the_client_verifies_the_server_against_the_rigs_certificate(tls_server: tuple[int, Path]) -> None:
    port, cert = tls_server
    endpoint = Endpoint(f"https://127.0.0.1:{port}", KEY, timeout=5, ca_file=str(cert))
    assert endpoint.get_json("/health") == {"status": "ok", "auth": f"Bearer {KEY}"}


def test_a_server_with_another_certificate_is_refused(tls_server: tuple[int, Path], tmp_path: Path) -> None:
    port, _ = tls_server
    other = tmp_path / "other"
    other.mkdir()
    _, wrong = make_cert(other, ["rig1"])
    with pytest.raises(ServerApiError, match="CERTIFICATE_VERIFY_FAILED"):
        Endpoint(f"https://127.0.0.1:{port}", KEY, timeout=5, ca_file=str(wrong)).get_json("/health")
    # nor is it trusted without the rig's certificate (the system CAs do not know it)
    assert health(Endpoint(f"https://127.0.0.1:{port}", timeout=5))[0] == 0


def test_a_name_the_certificate_does_not_carry_is_refused(tmp_path: Path) -> None:
    # a certificate for rig1 only (no loopback names), presented on 127.0.0.1
    key, cert = tmp_path / "only.key", tmp_path / "only.crt"
    run_openssl(self_signed_argv(OPENSSL, str(key), str(cert), ["DNS:rig1"], 30))
    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        status, reason = health(Endpoint(f"https://127.0.0.1:{server.server_address[1]}", timeout=5, ca_file=str(cert)))
    finally:
        server.shutdown()
        server.server_close()
    assert status == 0 and "CERTIFICATE_VERIFY_FAILED" in reason and "127.0.0.1" in reason, reason


def test_a_plain_http_client_gets_no_answer_from_a_tls_server(tls_server: tuple[int, Path]) -> None:
    port, _ = tls_server
    status, reason = health(Endpoint(f"http://127.0.0.1:{port}", timeout=5))
    assert status == 0, reason
    with pytest.raises(ServerApiError):
        Endpoint(f"http://127.0.0.1:{port}", KEY, timeout=5).get_json("/props")


def test_plain_http_with_a_certificate_is_refused_early() -> None:
    with pytest.raises(ServerApiError, match="use https://"):
        Endpoint("http://127.0.0.1:1", ca_file="/etc/rigkit/tls/main/server.crt")


# --- the controller-side refusal -------------------------------------------------------------------------------


def _problems(tmp_path: Path, **overrides: Any) -> list[str]:
    """The TLS problems the controller finds for the sandbox rig with `overrides` written into its host_vars file
    (a copy of the kit's inventory under tmp_path)."""
    from rigkit.inventory_files import Sources
    from rigkit.validation.rules import load_specs, rig_problems

    inventory = tmp_path / "inventory"
    if inventory.exists():
        shutil.rmtree(inventory)
    shutil.copytree(REPO / "inventory", inventory, ignore=shutil.ignore_patterns("examples", "rigs.lock.json"))
    host_file = inventory / "host_vars/sandbox.yml"
    rig = {**yaml.safe_load(host_file.read_text()), "llama_server_host": "0.0.0.0", "llama_server_api_key": KEY}
    rig.update(overrides)
    host_file.write_text(yaml.safe_dump(rig, sort_keys=False))
    catalog = yaml.safe_load((inventory / "group_vars/all/model_catalog.yml").read_text())["model_catalog"]
    values = {**yaml.safe_load((inventory / "group_vars/sandbox_rigs.yml").read_text()), **rig}
    sources = Sources(str(inventory), "sandbox", ["sandbox_rigs", "rigs"])
    problems = rig_problems("sandbox", values, specs=load_specs(str(REPO / "roles")), sources=sources, catalog=catalog)
    return [
        problem.replace(str(tmp_path) + "/", "") for problem in problems if "tls" in problem or "plaintext" in problem
    ]


def test_tls_is_on_by_default_off_the_loopback_and_no_problem(tmp_path: Path) -> None:
    assert _problems(tmp_path) == []
    assert _problems(tmp_path, llama_server_tls=True) == []
    assert _problems(tmp_path, llama_server_tls="auto") == []


def test_plaintext_on_the_lan_is_refused_naming_file_variable_value_and_host(tmp_path: Path) -> None:
    (problem,) = _problems(tmp_path, llama_server_tls=False)
    assert problem.startswith("inventory/host_vars/sandbox.yml: llama_server_tls is false; "), problem
    assert "llama_server_host is 0.0.0.0 (not loopback)" in problem
    assert "llama_server_allow_plaintext_lan: true" in problem


def test_plaintext_on_the_lan_passes_only_with_the_explicit_opt_out(tmp_path: Path) -> None:
    assert _problems(tmp_path, llama_server_tls=False, llama_server_allow_plaintext_lan=True) == []
    assert _problems(tmp_path, llama_server_tls=False, llama_server_host="127.0.0.1") == []
    # a value outside auto/true/false is refused by the argument spec itself
    assert _problems(tmp_path, llama_server_tls="maybe")
    assert _problems(tmp_path, llama_server_tls=False, llama_server_allow_plaintext_lan=False)


def test_a_given_certificate_needs_its_key_and_the_key_is_never_shown(tmp_path: Path) -> None:
    key, cert = make_cert(tmp_path, ["rig1"])
    (problem,) = _problems(tmp_path, llama_server_tls_cert=cert.read_text())
    assert "llama_server_tls_key" in problem and "give both" in problem
    problems = _problems(tmp_path, llama_server_tls_key="not a key", llama_server_tls_cert=cert.read_text())
    assert problems and "not a PEM private key" in "\n".join(problems)
    assert "not a key" not in "\n".join(problems)
    assert _problems(tmp_path, llama_server_tls_cert=cert.read_text(), llama_server_tls_key=key.read_text()) == []


# --- rendering: the unit's argv has the paths, never a secret --------------------------------------------------


def _render(tmp_path: Path, hosts: dict[str, dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    out, result = render_server_files(tmp_path, hosts)
    failed = {host: stats for host, stats in result["stats"].items() if stats["failures"] or stats["unreachable"]}
    assert not failed, json.dumps(result)[-3000:]
    return out, result


def test_the_unit_serves_tls_off_the_loopback_with_paths_only(tmp_path: Path) -> None:
    key, cert = make_cert(tmp_path, ["rig1"])
    out, _ = _render(
        tmp_path,
        {
            "lan": {"llama_server_host": "0.0.0.0", "llama_server_api_key": KEY},
            "given": {
                "llama_server_host": "192.0.2.7",
                "llama_server_api_key": KEY,
                "llama_server_tls_cert": cert.read_text(),
                "llama_server_tls_key": key.read_text(),
            },
            "local": {},
            "local_tls": {"llama_server_tls": True},
            "opt_out": {
                "llama_server_host": "0.0.0.0",
                "llama_server_api_key": KEY,
                "llama_server_tls": False,
                "llama_server_allow_plaintext_lan": True,
            },
        },
    )
    for host in ("lan", "given", "local_tls"):
        argv = exec_start_argv((out / f"{host}.service").read_text())
        assert argv[argv.index("--ssl-key-file") + 1] == "/etc/rigkit/tls/main/server.key", host
        assert argv[argv.index("--ssl-cert-file") + 1] == "/etc/rigkit/tls/main/server.crt", host
        assert "/etc/rigkit/tls/main:/etc/rigkit/tls/main:ro" in argv, host
    for host in ("local", "opt_out"):
        argv = exec_start_argv((out / f"{host}.service").read_text())
        assert "--ssl-key-file" not in argv and not any("/etc/rigkit/tls" in arg for arg in argv), host
    secret_key_body = key.read_text().splitlines()[1]
    for path in out.iterdir():
        text = path.read_text()
        assert "PRIVATE KEY" not in text and secret_key_body not in text, path.name
        assert "BEGIN CERTIFICATE" not in text, path.name
        if path.suffix == ".service":
            assert KEY not in text, path.name


# --- the module on a host: made once, kept, made again only when its names change -------------------------------


def _module(tmp_path: Path, **args: Any) -> dict[str, Any]:
    params = {"cert_path": str(tmp_path / "server.crt"), "key_path": str(tmp_path / "server.key"), **args}
    result, _ = support.run_module("llama_server_tls", params)
    assert not result.get("failed"), result.get("msg")
    return result


@pytest.mark.skipif(os.geteuid() != 0, reason="the module sets root ownership, as it does on a rig")
def test_the_module_makes_the_certificate_once_and_again_only_when_its_names_change(tmp_path: Path) -> None:
    first = _module(tmp_path, names=["rig1", "0.0.0.0"])
    assert first["changed"] and first["reason"] == "no certificate yet"
    key = (tmp_path / "server.key").stat()
    assert (key.st_mode & 0o777, key.st_uid, key.st_gid) == (0o640, 0, 10001)
    assert first["sans"] == wanted_sans(["rig1"]) and "BEGIN CERTIFICATE" in first["certificate"]
    again = _module(tmp_path, names=["rig1", "0.0.0.0"])
    assert not again["changed"] and again["fingerprint"] == first["fingerprint"]
    renamed = _module(tmp_path, names=["rig1", "192.168.1.20"])
    assert renamed["changed"] and "names changed" in renamed["reason"]
    assert renamed["fingerprint"] != first["fingerprint"]
    expiring = _module(tmp_path, names=["rig1", "192.168.1.20"], renew_days=900)
    assert expiring["changed"] and "expires within 900 days" in expiring["reason"]
