"""A rig that serves on every address serves TLS: `make provision` of a sandbox rig of its own
(container tls-rig, tests/integration/inventories/tls) with llama_server_host 0.0.0.0 on host networking.

Verified against the certificate the rig made for itself, https answers /health and a drafted completion; plain
http gets no answer; a request without the API key is 401; the key file is readable by the container's group
only; the container's own healthcheck speaks TLS; `make status` reads the server over https; a second converge
changes nothing (the certificate is kept).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.llama_server.api import Endpoint, ServerApiError, complete, health

from tests.support import REPO, exec_start_argv, own_cache, recap, remove_rig, rig_suite, run

INVENTORY_DIR = REPO / "tests/integration/inventories/tls"
INVENTORY = f"{REPO / 'inventory/hosts.yml'},{INVENTORY_DIR}"
RIG = "tls-rig"
SETTINGS = yaml.safe_load((INVENTORY_DIR / "hosts.yml").read_text())["all"]["children"]["rigs"]["children"][
    "sandbox_rigs"
]["hosts"][RIG]
CONTAINER = SETTINGS["ansible_host"]
PORT = SETTINGS["llama_server_port"]
API_KEY = SETTINGS["llama_server_api_key"]
CERT = "/etc/rigkit/tls/main/server.crt"
KEY = "/etc/rigkit/tls/main/server.key"
UNIT = "/etc/systemd/system/rigkit-llama-main.service"


def in_rig(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", "exec", CONTAINER, *argv], capture_output=True, text=True, check=False)


def make(target: str, *extra: str, cache: Path, log: str) -> object:
    # Its own cache (and so its own mirror pidfile and run directory): the kit's sandboxes may converge meanwhile.
    return run(
        ["make", "--no-print-directory", target, f"host={RIG}", *extra],
        log_name=log,
        ANSIBLE_INVENTORY=INVENTORY,
        RIGKIT_CACHE_DIR=str(cache),
        RIGKIT_LOCK_FILE=str(cache / "rigs.lock.json"),
    )


@pytest.fixture(scope="module")
def tls_rig(llama_image, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    remove_rig(CONTAINER)
    cache = own_cache(tmp_path_factory, "tls-cache")
    started = time.monotonic()
    first = make("provision", cache=cache, log="provision-tls-first")
    assert first.returncode == 0, first.tail(120)
    seconds = time.monotonic() - started
    cert = cache / "tls-rig.crt"
    fetched = in_rig("cat", CERT)
    assert fetched.returncode == 0 and "BEGIN CERTIFICATE" in fetched.stdout, fetched.stderr
    cert.write_text(fetched.stdout)
    print(f"tls-rig provisioned in {seconds:.0f} s")
    yield {"cache": cache, "cert": cert, "first": first}
    remove_rig(CONTAINER)


def endpoint(rig: dict, host: str = "127.0.0.1", key: str | None = API_KEY) -> Endpoint:
    return Endpoint(f"https://{host}:{PORT}", key, timeout=120.0, ca_file=str(rig["cert"]))


def test_https_verified_against_the_rigs_certificate_answers_health_and_a_drafted_completion(tls_rig):
    assert endpoint(tls_rig).get_json("/health") == {"status": "ok"}
    assert endpoint(tls_rig, host="localhost").get_json("/health") == {"status": "ok"}
    answer = complete(endpoint(tls_rig), "def fibonacci(n):", 32, top_k=1)
    assert answer.content and answer.draft_n > 0, answer.timings
    assert answer.acceptance is not None and answer.acceptance >= SETTINGS["rig_expected_min_acceptance"]
    # the rollout's own probe went over https too
    assert f"answers at https://127.0.0.1:{PORT}" in " ".join(tls_rig["first"].output.split())


def test_plain_http_gets_no_answer(tls_rig):
    status, reason = health(Endpoint(f"http://127.0.0.1:{PORT}", timeout=10.0))
    assert status != 200, reason
    with pytest.raises(ServerApiError):
        Endpoint(f"http://127.0.0.1:{PORT}", API_KEY, timeout=10.0).get_json("/props")


def test_a_request_without_the_api_key_is_401(tls_rig):
    status, payload = endpoint(tls_rig, key=None).request("/completion", {"prompt": "hi", "n_predict": 1})
    assert status == 401, payload[:300]
    status, _ = endpoint(tls_rig, key="wrong-key").request("/props")
    assert status == 401


def test_the_certificate_is_the_rigs_and_the_key_stays_private(tls_rig):
    names = in_rig("openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", CERT).stdout
    assert "IP Address:127.0.0.1" in names and "DNS:tls-rig" in names, names
    assert in_rig("stat", "-c", "%a %u %g", KEY).stdout.split() == ["640", "0", "10001"]
    unit = in_rig("cat", UNIT).stdout
    argv = exec_start_argv(unit)
    assert argv[argv.index("--ssl-key-file") + 1] == KEY and argv[argv.index("--ssl-cert-file") + 1] == CERT
    assert "/etc/rigkit/tls/main:/etc/rigkit/tls/main:ro" in argv
    assert "PRIVATE KEY" not in unit and "BEGIN CERTIFICATE" not in unit and API_KEY not in unit


def test_the_containers_healthcheck_speaks_tls(tls_rig):
    deadline = time.monotonic() + 120
    status = ""
    while time.monotonic() < deadline:
        status = in_rig("docker", "inspect", "--format", "{{.State.Health.Status}}", "rigkit-llama-main").stdout.strip()
        if status != "starting":
            break
        time.sleep(5)
    assert status == "healthy", in_rig("docker", "inspect", "--format", "{{json .State.Health}}", "rigkit-llama-main")


def test_status_reads_the_server_over_https(tls_rig):
    result = make("status", "json=1", cache=tls_rig["cache"], log="status-tls")
    assert result.returncode == 0, result.tail(60)
    data = json.loads(result.output[result.output.index("{") :])
    server = data[RIG]["deployed"]["server"]
    assert server["answers"] is True, server


def test_second_converge_changes_nothing_and_keeps_the_certificate(tls_rig):
    before = in_rig("openssl", "x509", "-noout", "-fingerprint", "-sha256", "-in", CERT).stdout
    second = make("provision", cache=tls_rig["cache"], log="provision-tls-second")
    assert second.returncode == 0, second.tail(120)
    assert recap(second.output)[RIG]["changed"] == 0, second.tail(120)
    assert in_rig("openssl", "x509", "-noout", "-fingerprint", "-sha256", "-in", CERT).stdout == before


def test_the_rig_suite_passes_over_https(tls_rig):
    """tests/rig against this rig: every request it makes goes over https, verified on the rig itself."""
    suite = rig_suite(
        RIG,
        log_name="rig-suite-tls",
        inventory=None,
        ANSIBLE_INVENTORY=INVENTORY,
        RIGKIT_CACHE_DIR=str(tls_rig["cache"]),
    )
    assert "test_llama_server::test_serves_tls_off_the_loopback_with_a_private_key" in suite.passed
