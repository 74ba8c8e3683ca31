"""The fleet services over real sandbox rigs: `make provision` of a fleet host (container rigkit-gw-fleet,
tests/integration/inventories/gateway) running the gateway (roles/fleet_gateway, HAProxy from Debian) and the
monitor (roles/fleet_monitor, Prometheus and Alertmanager from Debian) over the kit's two sandboxes and gw-tls-rig,
a second tiny-gemma4 rig that serves TLS with its own API key.

Prometheus scrapes each rig's llama-server with the labels of its lock entry; LlamaServerDown fires within its
window when gw-tls-rig's server stops, reaches Alertmanager, and clears when the server is back.

Through the gateway, verified against its own certificate and with the client key: each alias completes, on the
rigs that serve it; /v1/models lists the aliases; no key is 401, an unknown model 404, an oversized body 413.
With gw-tls-rig's server stopped in the middle of 50 requests, all 50 succeed; it is taken out, and back in
rotation once it answers again. A second converge changes nothing; a rig the gateway could not reach is refused
before the gateway host is touched.
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import yaml

from tests.support import REPO, own_cache, recap, remove_rig, run

INVENTORY_DIR = REPO / "tests/integration/inventories/gateway"
INVENTORY = f"{REPO / 'inventory/hosts.yml'},{INVENTORY_DIR}"
_HOSTS = yaml.safe_load((INVENTORY_DIR / "hosts.yml").read_text())["all"]["children"]
RIG = "gw-tls-rig"
RIG_SETTINGS = _HOSTS["rigs"]["children"]["sandbox_rigs"]["hosts"][RIG]
GATEWAY = "gw-fleet"
GATEWAY_SETTINGS = _HOSTS["fleet_services"]["hosts"][GATEWAY]
URL = f"https://127.0.0.1:{GATEWAY_SETTINGS['fleet_gateway_port']}"
STATS = f"http://127.0.0.1:{GATEWAY_SETTINGS['fleet_gateway_stats_port']}/stats;csv"
CLIENT_KEY = GATEWAY_SETTINGS["fleet_gateway_api_key"]
CONTAINERS = ("rigkit-gw-fleet", "rigkit-gw-tls-rig")
PROMETHEUS = f"http://127.0.0.1:{GATEWAY_SETTINGS['fleet_monitor_prometheus_port']}"
ALERTMANAGER = f"http://127.0.0.1:{GATEWAY_SETTINGS['fleet_monitor_alertmanager_port']}"


def remove_containers() -> None:
    for name in CONTAINERS:
        remove_rig(name)


def make(host: str, cache: Path, log: str, *args: str) -> object:
    return run(
        ["make", "--no-print-directory", "provision", f"host={host}", *([f"ARGS={' '.join(args)}"] if args else [])],
        log_name=log,
        ANSIBLE_INVENTORY=INVENTORY,
        RIGKIT_CACHE_DIR=str(cache),
        RIGKIT_LOCK_FILE=str(cache / "rigs.lock.json"),
    )


def in_container(container: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", "exec", container, *argv], capture_output=True, text=True, check=False)


def servers() -> dict[tuple[str, str], dict[str, str]]:
    """HAProxy's statistics, {(proxy, server): row}."""
    text = requests.get(STATS, timeout=10).text.lstrip("# ")
    return {(row["pxname"], row["svname"]): row for row in csv.DictReader(io.StringIO(text))}


def wait_for_status(server: str, status: str, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if servers()[("model_tiny-gemma4", server)]["status"] == status:
            return time.monotonic() - started
        time.sleep(0.5)
    raise AssertionError(f"{server} not {status} after {timeout} s: {servers()[('model_tiny-gemma4', server)]}")


def ask(gateway: dict, model: str | None, key: str | None = CLIENT_KEY, **body: object) -> requests.Response:
    payload = {"prompt": "abc", "max_tokens": 8, "temperature": 0, **body}
    if model is not None:
        payload["model"] = model
    # requests keeps a socket open for each response kept: 50 kept would pass the gateway's 32 connections per
    # source address (tests/unit/test_gateway_hardening.py proves that limit), so each answer ends its connection
    headers = {"Connection": "close", **({"Authorization": f"Bearer {key}"} if key else {})}
    return requests.post(f"{URL}/v1/completions", json=payload, headers=headers, verify=gateway["cert"], timeout=120)


@pytest.fixture(scope="module")
def gateway(sandbox_provisioned, mtp_provisioned, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    remove_containers()
    cache = own_cache(tmp_path_factory, "gateway-cache")
    rig = make(RIG, cache, "provision-gw-tls-rig")
    assert rig.returncode == 0, rig.tail(120)
    started = time.monotonic()
    first = make(GATEWAY, cache, "provision-gw-fleet-first")
    assert first.returncode == 0, first.tail(120)
    seconds = time.monotonic() - started
    cert = cache / "gateway.pem"
    cert.write_text(in_container("rigkit-gw-fleet", "cat", "/etc/haproxy/rigkit/gateway.pem").stdout)
    print(f"gateway provisioned in {seconds:.0f} s")
    yield {"cache": cache, "cert": str(cert)}
    remove_containers()


def test_each_alias_completes_through_the_gateway_on_a_rig_that_serves_it(gateway):
    listed = requests.get(
        f"{URL}/v1/models", headers={"Authorization": f"Bearer {CLIENT_KEY}"}, verify=gateway["cert"], timeout=30
    )
    assert listed.status_code == 200 and [m["id"] for m in listed.json()["data"]] == ["gemma-3-270m", "tiny-gemma4"]
    # each rig answers to its target's catalog alias (--alias): the answer names the model that served it
    for model in ("gemma-3-270m", "tiny-gemma4"):
        answer = ask(gateway, model)
        assert answer.status_code == 200, answer.text[:300]
        assert answer.json()["choices"][0]["text"] and answer.json()["model"] == model, answer.text[:300]
    # llama.cpp's own endpoint, without a "model": the first alias
    native = requests.post(
        f"{URL}/completion",
        json={"prompt": "hi", "n_predict": 2},
        headers={"Authorization": f"Bearer {CLIENT_KEY}"},
        verify=gateway["cert"],
        timeout=60,
    )
    assert native.status_code == 200 and native.json()["model"] == "gemma-3-270m", native.text


def test_the_tls_rig_is_reached_with_its_own_key_and_the_client_key_opens_only_the_gateway(gateway):
    before = int(servers()[("model_tiny-gemma4", RIG)]["stot"])
    for _ in range(4):
        assert ask(gateway, "tiny-gemma4").status_code == 200
    assert int(servers()[("model_tiny-gemma4", RIG)]["stot"]) > before
    rig_url = f"https://127.0.0.1:{RIG_SETTINGS['llama_server_port']}/completion"
    rig_cert = gateway["cache"] / "rig.crt"
    rig_cert.write_text(in_container("rigkit-gw-tls-rig", "cat", "/etc/rigkit/tls/main/server.crt").stdout)
    direct = requests.post(
        rig_url,
        json={"prompt": "a", "n_predict": 1},
        headers={"Authorization": f"Bearer {CLIENT_KEY}"},
        verify=str(rig_cert),
        timeout=30,
    )
    assert direct.status_code == 401, "the rig must not accept the gateway's client key"


def test_refusals_a_client_sees(gateway):
    assert ask(gateway, "tiny-gemma4", key=None).status_code == 401
    assert ask(gateway, "tiny-gemma4", key="not-the-key-0000000000").status_code == 401
    unknown = ask(gateway, "gpt-4")
    assert unknown.status_code == 404 and "v1/models" in unknown.json()["error"]["message"]
    too_big = ask(gateway, "tiny-gemma4", prompt="x" * (GATEWAY_SETTINGS.get("fleet_gateway_max_body_kib", 192) * 1024))
    assert too_big.status_code == 413
    assert requests.get(f"{URL}/health", verify=gateway["cert"], timeout=10).json() == {"status": "ok"}


def test_a_rig_stopped_in_the_middle_of_50_requests_loses_none_and_comes_back(gateway):
    unit = "rigkit-llama-main.service"
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(ask, gateway, "tiny-gemma4") for _ in range(50)]
        while sum(future.done() for future in futures) < 10:
            time.sleep(0.05)
        stopped = in_container("rigkit-gw-tls-rig", "systemctl", "stop", unit)
        answers = [future.result() for future in futures]
    assert stopped.returncode == 0, stopped.stderr
    failed = [(answer.status_code, answer.text[:200]) for answer in answers if answer.status_code != 200]
    assert not failed, failed
    assert all(answer.json()["choices"][0]["text"] for answer in answers)
    taken_out = wait_for_status(RIG, "DOWN", 30)
    assert in_container("rigkit-gw-tls-rig", "systemctl", "start", unit).returncode == 0
    back = wait_for_status(RIG, "UP", 180)
    before = int(servers()[("model_tiny-gemma4", RIG)]["stot"])
    for _ in range(6):
        assert ask(gateway, "tiny-gemma4").status_code == 200
    assert int(servers()[("model_tiny-gemma4", RIG)]["stot"]) > before, "the rig did not come back into rotation"
    print(f"50/50 answered; {RIG} out {taken_out:.1f} s after the stop, back {back:.1f} s after its start")


def test_no_service_listened_before_the_roles_flags(gateway):
    """Debian starts Prometheus, Alertmanager and the node exporter as their packages install, with the packages'
    defaults (every interface); the roles keep them masked until their flags are written. Every listening line of
    their journals, since the fresh containers' installs, shows one address: the flags'."""
    services = {
        "rigkit-gw-fleet": {"prometheus": True, "prometheus-alertmanager": True},
        "rigkit-gw-tls-rig": {"prometheus-node-exporter": False},  # exposed with TLS and a password
    }
    for container, units in services.items():
        for unit, loopback in units.items():
            journal = in_container(container, "journalctl", "--no-pager", "--unit", unit).stdout
            addresses = re.findall(r"listening\S*.*?address=(\S+)", journal, re.IGNORECASE)
            assert addresses, f"{container} {unit}: no listening line in\n{journal[-1500:]}"
            assert len(set(addresses)) == 1, f"{container} {unit} listened on {addresses}"
            assert addresses[0].startswith("127.0.0.1:") or not loopback, addresses


def test_second_converge_changes_nothing(gateway):
    second = make(GATEWAY, gateway["cache"], "provision-gw-fleet-second")
    assert second.returncode == 0, second.tail(60)
    assert recap(second.output)[GATEWAY]["changed"] == 0, second.tail(60)


def test_a_rig_the_gateway_cannot_reach_is_refused_before_the_gateway_is_touched(gateway):
    config = ["stat", "-c", "%Y", "/etc/haproxy/haproxy.cfg"]
    before = in_container("rigkit-gw-fleet", *config).stdout
    refused = make(GATEWAY, gateway["cache"], "provision-gw-fleet-refused", "-e fleet_gateway_rigs_share_network=false")
    assert refused.returncode != 0
    text = " ".join(refused.output.split())
    assert "sandbox: llama_server_host is 127.0.0.1 (loopback), which the gateway on gw-fleet cannot reach" in text
    assert "inventory/host_vars/sandbox.yml" in text
    assert "Install haproxy" not in refused.output
    assert in_container("rigkit-gw-fleet", *config).stdout == before


def test_a_gateway_running_another_configuration_than_its_file_is_restarted(gateway):
    """Level-triggered: the file on disk is right, the process runs something else (a reload that failed, a hand
    edit since undone); the next converge sees it in what HAProxy reports and restarts it."""
    config = "/etc/haproxy/haproxy.cfg"
    original = in_container("rigkit-gw-fleet", "cat", config).stdout
    assert "X-Rigkit-Config" in original
    edited = "\n".join(
        line.replace("set-header X-Rigkit-Config ", "set-header X-Rigkit-Config stale")
        for line in original.splitlines()
    )
    subprocess.run(
        ["docker", "exec", "-i", "rigkit-gw-fleet", "tee", config],
        input=edited + "\n",
        text=True,
        capture_output=True,
        check=True,
    )
    assert in_container("rigkit-gw-fleet", "systemctl", "reload", "haproxy").returncode == 0
    # HAProxy 2.6's reload is a signal: systemctl returns before the new worker has read the file, so the file is
    # put back only once the edit is what answers.
    wait_until(lambda: served_config(gateway).startswith("stale"), 30, "the reloaded gateway to serve the edit")
    subprocess.run(
        ["docker", "exec", "-i", "rigkit-gw-fleet", "tee", config],
        input=original,
        text=True,
        capture_output=True,
        check=True,
    )
    converge = make(GATEWAY, gateway["cache"], "provision-gw-fleet-restart")
    assert converge.returncode == 0, converge.tail(60)
    assert recap(converge.output)[GATEWAY]["changed"] == 1, converge.tail(60)
    assert not served_config(gateway).startswith("stale")


def served_config(gateway: dict) -> str:
    listed = requests.get(
        f"{URL}/v1/models", headers={"Authorization": f"Bearer {CLIENT_KEY}"}, verify=gateway["cert"], timeout=30
    )
    return listed.headers["X-Rigkit-Config"]


def query(expression: str) -> list[dict]:
    answer = requests.get(f"{PROMETHEUS}/api/v1/query", params={"query": expression}, timeout=10).json()
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def firing(rig: str) -> bool:
    alerts = requests.get(f"{PROMETHEUS}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    return any(
        a["labels"].get("alertname") == "LlamaServerDown" and a["labels"].get("rig") == rig and a["state"] == "firing"
        for a in alerts
    )


def wait_until(predicate, timeout: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(1)
    raise AssertionError(f"{what}: not within {timeout} s")


def wait_until_every_rig_is_up(service: str) -> set[str]:
    """The gateway fleet's rigs, once Prometheus scrapes every one's ``service`` and finds it up."""
    rigs = {"sandbox", "sandbox-mtp", RIG}
    wait_until(
        lambda: {r["metric"]["rig"] for r in query(f'up{{service="{service}"}} == 1')} == rigs,
        60,
        f"every rig's {service} scraped and up",
    )
    return rigs


def test_prometheus_scrapes_every_rig_with_the_labels_of_its_lock_entry(gateway):
    from ansible.module_utils.rig_lock import read_lock

    ask(gateway, "tiny-gemma4")
    rigs = wait_until_every_rig_is_up("llama-server")
    series = {r["metric"]["rig"]: r["metric"] for r in query("llamacpp:tokens_predicted_total")}
    assert set(series) == rigs
    entry = read_lock(str(gateway["cache"] / "rigs.lock.json"))[RIG]
    labels = series[RIG]
    assert labels["target_sha256"] == entry["models"]["target"]["sha256"][:12]
    assert labels["drafter_sha256"] == entry["models"]["drafter"]["sha256"][:12]
    assert labels["llamacpp_commit"] == entry["image"]["llamacpp_commit"][:12]
    assert labels["draft_n_max"] == str(RIG_SETTINGS["llama_server_spec_draft_n_max"])
    accepted = query(f'llamacpp:spec_decode_num_accepted_tokens_total{{rig="{RIG}"}}')
    assert accepted and float(accepted[0]["value"][1]) > 0, "the TLS rig's drafting counters, read with its key"


def test_the_fleet_graph_draws_each_rigs_acceptance_from_prometheus(gateway, tmp_path):
    """make fleet-graph's command against the fleet's Prometheus: the query API, matplotlib, one line per rig."""
    from matplotlib import image

    from rigkit.fleet.monitor import GRAPHS

    ask(gateway, "tiny-gemma4")
    wait_until(lambda: len(query(GRAPHS["acceptance"])) > 0, 90, "a 5-minute acceptance rate for a rig")
    out = tmp_path / "acceptance.png"
    drawn = run(
        ["python", "bin/rigkit", "fleet-graph", "--prometheus", PROMETHEUS, "--out", str(out), "--range", "10m"]
    )
    assert drawn.returncode == 0, drawn.tail()
    assert re.search(r"acceptance over the last 10m \(.*\b(sandbox-mtp|gw-tls-rig)\b.*; [0-9]+ points\)", drawn.output)
    assert image.imread(out).shape[:2] == (450, 1000)


def test_prometheus_scrapes_every_rigs_node_exporter_and_the_gpu_collectors_sample(gateway):
    """Each rig's node exporter (roles/node_exporter) is scraped with the rig's lock labels; sandbox-mtp runs the GPU
    collector's timer as a GPU rig does, and its sample (no GPU here: nvidia-smi is missing, and it says so) reaches
    Prometheus through the textfile collector."""
    rigs = wait_until_every_rig_is_up("node")
    uname = {r["metric"]["rig"]: r["metric"] for r in query("node_uname_info")}
    assert set(uname) == rigs and uname[RIG]["draft_n_max"] == str(RIG_SETTINGS["llama_server_spec_draft_n_max"])
    wait_until(lambda: query('rigkit_gpu_collector_success{rig="sandbox-mtp"}'), 60, "the GPU collector's sample")
    (sample,) = query('rigkit_gpu_collector_success{rig="sandbox-mtp"}')
    assert sample["value"][1] == "0"
    (error,) = query('rigkit_gpu_collector_error{rig="sandbox-mtp"}')
    assert "nvidia-smi is not installed" in error["metric"]["message"]
    ages = query('time() - rigkit_gpu_collector_timestamp_seconds{rig="sandbox-mtp"}')
    assert float(ages[0]["value"][1]) < 60, "the timer keeps sampling"
    assert not query('rigkit_gpu_collector_success{rig="sandbox"}'), "no GPU collector where it was not asked for"


def test_the_tls_rigs_node_exporter_answers_only_its_user_over_tls_and_prometheus_scrapes_it_so(gateway):
    """gw-tls-rig's node exporter serves TLS with a certificate the rig made and answers only its user: Prometheus
    verifies it against that certificate and reads the password from a root-only file, never from prometheus.yml."""
    password = RIG_SETTINGS["node_exporter_password"]
    url = f"https://127.0.0.1:{RIG_SETTINGS['llama_server_port'] + 1000}/metrics"
    code = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", "/etc/prometheus/node-exporter/tls.crt"]
    assert in_container("rigkit-gw-tls-rig", *code, url).stdout == "401"
    assert in_container("rigkit-gw-tls-rig", *code, "-u", "prometheus:wrong-password-of-16", url).stdout == "401"
    assert in_container("rigkit-gw-tls-rig", *code, "-u", f"prometheus:{password}", url).stdout == "200"
    targets = requests.get(f"{PROMETHEUS}/api/v1/targets?state=active", timeout=10).json()["data"]["activeTargets"]
    (node,) = [t for t in targets if t["labels"].get("service") == "node" and t["labels"]["rig"] == RIG]
    assert node["scrapeUrl"].startswith("https://") and node["health"] == "up", node
    config = in_container("rigkit-gw-fleet", "cat", "/etc/prometheus/prometheus.yml").stdout
    assert "password_file" in config and password not in config
    web = in_container("rigkit-gw-tls-rig", "cat", "/etc/prometheus/node-exporter/web.yml").stdout
    assert "$2y$" in web and password not in web  # the rig keeps a bcrypt hash only


def test_an_alert_fires_when_a_server_stops_reaches_alertmanager_and_clears_when_it_is_back(gateway):
    unit = "rigkit-llama-main.service"
    assert not firing(RIG)
    assert in_container("rigkit-gw-tls-rig", "systemctl", "stop", unit).returncode == 0
    try:
        fired = wait_until(lambda: firing(RIG), GATEWAY_SETTINGS["fleet_monitor_down_for"] + 60, "LlamaServerDown")
        delivered = wait_until(
            lambda: any(
                a["labels"].get("rig") == RIG and a["labels"]["alertname"] == "LlamaServerDown"
                for a in requests.get(f"{ALERTMANAGER}/api/v2/alerts", timeout=10).json()
            ),
            60,
            "the alert in Alertmanager",
        )
    finally:
        assert in_container("rigkit-gw-tls-rig", "systemctl", "start", unit).returncode == 0
    cleared = wait_until(lambda: not firing(RIG), 240, "LlamaServerDown cleared")
    print(
        f"LlamaServerDown fired {fired:.0f} s after the stop (for: {GATEWAY_SETTINGS['fleet_monitor_down_for']} s), "
        f"in Alertmanager {delivered:.0f} s later, cleared {cleared:.0f} s after the start"
    )
