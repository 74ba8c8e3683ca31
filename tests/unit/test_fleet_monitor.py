"""rigkit/fleet/monitor.py: the Prometheus configuration and alert rules the fleet monitor deploys, checked and
unit-tested by the pinned Prometheus's own promtool (`promtool check config`, `promtool test rules`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from rigkit.fleet.monitor import SCRAPE_LIMITS, alert_rules, bench_decode_rate, lock_labels, prometheus_config
from rigkit.fleet.promtool import promtool
from tests.support import CACHE_DIR, REPO, group_vars, run

UPSTREAMS = [
    {
        "rig": "desktop3050",
        "address": "192.168.1.20",
        "port": 8080,
        "tls": True,
        "verify_name": "desktop3050",
        "keyed": True,
    },
    {"rig": "sandbox", "address": "127.0.0.1", "port": 18080, "tls": False, "verify_name": "", "keyed": False},
]
LOCK = {
    "gpu": {"name": "NVIDIA GeForce RTX 3050"},
    "image": {"llamacpp_commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f"},
    "models": {
        "target": {"sha256": "419db9a6bf3bc15d770c85ccf9216827aa88c64fe8f3d72fbe5674f48efe2dc8"},
        "drafter": {"sha256": "d5130b29dc92253d758cfe7708e6648af88c6a342bf1e2e353b2be81f603a777"},
    },
}


@pytest.fixture(scope="module")
def tool() -> Path:
    return promtool(CACHE_DIR)


def test_every_series_of_a_rig_carries_what_its_lock_says_it_runs():
    assert lock_labels("desktop3050", LOCK, 3) == {
        "rig": "desktop3050",
        "gpu": "NVIDIA GeForce RTX 3050",
        "target_sha256": "419db9a6bf3b",
        "drafter_sha256": "d5130b29dc92",
        "llamacpp_commit": "0c1e57098bba",
        "draft_n_max": "3",
    }
    assert lock_labels("new-rig", None, 2)["target_sha256"] == ""


def configuration(tmp_path: Path, upstreams: list, labels: dict, rigs: dict, files: tuple, **extra) -> dict:
    """prometheus_config with the rules of ``rigs`` written beside it and the certificate and key ``files`` it names
    present (placeholders: promtool checks that they exist)."""
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(alert_rules(rigs, down_for_s=60, window_s=600, decode_fraction=0.5)))
    for name in files:
        (tmp_path / name).write_text("placeholder\n")
    return prometheus_config(upstreams, labels, interval_s=15, alertmanager="127.0.0.1:9093", rules_file=str(rules),
                             certs_dir=str(tmp_path), keys_dir=str(tmp_path), **extra)  # fmt: skip


def test_the_generated_configuration_passes_promtool(tool: Path, tmp_path: Path):
    labels = {"desktop3050": lock_labels("desktop3050", LOCK, 3), "sandbox": lock_labels("sandbox", None, 4)}
    gpu_rig = {"desktop3050": {"gpu": True}}  # every rule, the GPU's included, goes through promtool
    config = configuration(
        tmp_path,
        UPSTREAMS,
        labels,
        gpu_rig,
        ("desktop3050.crt", "desktop3050"),
        gateway_metrics="127.0.0.1:8404",
        config_id="abc",
        nodes=[{"rig": "sandbox", "address": "127.0.0.1", "port": 19080}],
    )
    node = next(job for job in config["scrape_configs"] if job["job_name"] == "node-sandbox")
    assert node["static_configs"] == [
        {"targets": ["127.0.0.1:19080"], "labels": {**labels["sandbox"], "service": "node"}}
    ]
    desktop = config["scrape_configs"][0]
    assert desktop["scheme"] == "https" and desktop["tls_config"] == {
        "ca_file": f"{tmp_path}/desktop3050.crt",
        "server_name": "desktop3050",
    }
    assert desktop["authorization"] == {"type": "Bearer", "credentials_file": f"{tmp_path}/desktop3050"}
    assert "k" * 32 not in json.dumps(config)  # the key is named by file, never held
    # what a rig serves is bounded on every job, the kit's own too
    assert all(job.items() >= SCRAPE_LIMITS.items() for job in config["scrape_configs"])
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    checked = subprocess.run([str(tool), "check", "config", str(path)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _expected(rules: dict, name: str, labels: dict[str, str], rig: str) -> dict:
    rule = next(
        rule for rule in rules["groups"][0]["rules"] if rule["alert"] == name and rule["labels"].get("rig", rig) == rig
    )
    annotations = {
        key: value.replace("{{ $labels.rig }}", rig).replace("{{ $labels.instance }}", labels.get("instance", ""))
        for key, value in rule["annotations"].items()
    }
    return {"exp_labels": {**labels, **rule["labels"]}, "exp_annotations": annotations}


def test_the_alert_rules_fire_when_they_should_and_only_then(tool: Path, tmp_path: Path):
    """promtool test rules on synthetic series: a server that stops answering, a drafter whose acceptance drops
    below the rig's own threshold, a rig decoding at a fifth of its bench; and a healthy rig that raises nothing."""
    rigs = {
        "desktop3050": {"drafts": True, "min_acceptance": 0.6, "bench_tps": 50.0},
        "sandbox": {"drafts": True, "min_acceptance": 0.9, "bench_tps": None},
    }
    rules = alert_rules(rigs, down_for_s=60, window_s=300, decode_fraction=0.5)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    down = {"service": "llama-server", "rig": "desktop3050", "instance": "192.168.1.20:8080", "job": "j"}
    series = 'rig="desktop3050",service="llama-server",instance="192.168.1.20:8080",job="j"'
    healthy = 'rig="sandbox",service="llama-server",instance="127.0.0.1:18080",job="k"'
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [
                    # answers for 2 minutes, then not
                    {"series": f"up{{{series}}}", "values": "1x8 0x20"},
                    {"series": f"up{{{healthy}}}", "values": "1x28"},
                    # desktop3050 accepts 5 of 10 drafted per step (0.5 < 0.6); sandbox 9.5 of 10 (0.95 >= 0.9)
                    {"series": f"llamacpp:spec_decode_num_draft_tokens_total{{{series}}}", "values": "0+10x28"},
                    {"series": f"llamacpp:spec_decode_num_accepted_tokens_total{{{series}}}", "values": "0+5x28"},
                    {"series": f"llamacpp:spec_decode_num_draft_tokens_total{{{healthy}}}", "values": "0+20x28"},
                    {"series": f"llamacpp:spec_decode_num_accepted_tokens_total{{{healthy}}}", "values": "0+19x28"},
                    # desktop3050 decodes 100 tokens in 10 s per step: 10 tok/s, a fifth of its bench's 50
                    {"series": f"llamacpp:tokens_predicted_total{{{series}}}", "values": "0+100x28"},
                    {"series": f"llamacpp:tokens_predicted_seconds_total{{{series}}}", "values": "0+10x28"},
                ],
                "alert_rule_test": [
                    {"eval_time": "1m", "alertname": "LlamaServerDown", "exp_alerts": []},
                    {
                        "eval_time": "5m",
                        "alertname": "LlamaServerDown",
                        "exp_alerts": [_expected(rules, "LlamaServerDown", down, "desktop3050")],
                    },
                    {
                        "eval_time": "6m",
                        "alertname": "DraftAcceptanceLow",
                        "exp_alerts": [_expected(rules, "DraftAcceptanceLow", {}, "desktop3050")],
                    },
                    {
                        "eval_time": "6m",
                        "alertname": "DecodeRateLow",
                        "exp_alerts": [_expected(rules, "DecodeRateLow", {}, "desktop3050")],
                    },
                ],
            }
        ],
    }
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests))
    tested = subprocess.run(
        [str(tool), "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_decode_rate_threshold_comes_from_the_rigs_latest_bench(tmp_path: Path):
    assert bench_decode_rate(tmp_path, "desktop3050") is None
    from tests.support import BENCH_FIXTURES

    rate = bench_decode_rate(BENCH_FIXTURES, "gpu-tiny-mtp")
    assert rate is not None and rate > 0


def test_the_status_tables_last_hour_comes_from_prometheus_answers():
    from rigkit.fleet.monitor import QUERIES, history
    from rigkit.fleet.status import render, rows

    answers = [
        {
            "item": {"key": "acceptance_1h", "value": QUERIES["acceptance_1h"]},
            "status": 200,
            "json": {
                "data": {
                    "result": [
                        {"metric": {"rig": "sandbox-mtp"}, "value": [1, "0.875"]},
                        {"metric": {"rig": "sandbox"}, "value": [1, "NaN"]},
                    ]
                }
            },
        },
        {"item": {"key": "decode_tps_1h", "value": QUERIES["decode_tps_1h"]}, "failed": True},
    ]
    last_hour = history(answers)
    assert last_hour == {"sandbox-mtp": {"acceptance_1h": 0.875}}
    fleet = {"sandbox-mtp": {"reachable": False}, "sandbox": {"reachable": False}}
    table = render(rows(fleet, last_hour))
    assert "ACCEPT 1H" in table and "0.88" in table
    assert "ACCEPT 1H" not in render(rows(fleet))  # no Prometheus answered: no such column


def test_observe_prints_a_curl_that_reads_the_sandbox_key_and_the_ready_queries():
    from rigkit.cli.observe import describe
    from rigkit.fleet.monitor import QUERIES

    lines = "\n".join(
        describe(
            "fleet",
            {
                "ansible_connection": "community.docker.docker",
                "ansible_host": "rigkit-fleet",
                "fleet_gateway_port": 18443,
                "fleet_sandbox_key_file": "/k/key",
            },
        )
    )
    assert "docker exec rigkit-fleet cat /etc/haproxy/rigkit/gateway.pem > fleet-gateway.pem" in lines
    assert 'Authorization: Bearer $(cat /k/key)" https://127.0.0.1:18443/v1/models' in lines
    assert all(query in lines for query in QUERIES.values())
    remote = "\n".join(describe("nas", {"ansible_host": "nas.lan", "fleet_gateway_bind": "0.0.0.0"}))
    assert "ssh nas.lan sudo cat" in remote and "$FLEET_KEY" in remote and "https://nas.lan:8443" in remote


def test_observe_without_the_sandbox_fleet_says_how_to_create_it_and_fails(tmp_path: Path):
    """A fleet host in a container that does not run: no URL to a gateway that is not there, what to run, exit 3."""
    hosts = {"all": {"children": {"fleet_services": {"hosts": {"absent-fleet": None}}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(hosts))
    (tmp_path / "host_vars").mkdir()
    container = f"rigkit-observe-absent-{tmp_path.name}"  # no such container exists
    values = {"ansible_connection": "community.docker.docker", "ansible_host": container}
    (tmp_path / "host_vars" / "absent-fleet.yml").write_text(yaml.safe_dump(values))
    done = run(["python", "bin/rigkit", "observe"], ANSIBLE_INVENTORY=str(tmp_path / "hosts.yml"))
    assert done.returncode == 3, done.output
    assert f"fleet services on absent-fleet: not created (no running container {container})" in done.output
    assert "make provision host=absent-fleet" in done.output and "https://" not in done.output


def test_observe_names_the_certificate_the_gateway_role_writes():
    from rigkit.cli.observe import GATEWAY_CERT

    names = yaml.safe_load((Path(__file__).resolve().parents[2] / "roles/fleet_gateway/vars/main.yml").read_text())
    assert names["__fleet_gateway_cert_path"].replace("{{ __fleet_gateway_dir }}", names["__fleet_gateway_dir"]) == (
        GATEWAY_CERT
    )


@pytest.mark.parametrize(
    ("limit", "pattern"),
    [
        ("rigs", "rigs:fleet_services"),
        ("sandbox", "sandbox:fleet_services"),
        ("sandbox,sandbox-mtp,sandbox-3", "sandbox,sandbox-mtp,sandbox-3,fleet_services"),
        ("rigs:!sandbox", "rigs:!sandbox:fleet_services"),
    ],
)
def test_status_asks_the_fleet_hosts_too_in_ansibles_pattern_syntax(limit, pattern):
    from ansible.inventory.manager import split_host_pattern

    from rigkit.cli.fleet import with_fleet_services

    assert with_fleet_services(limit) == pattern
    assert split_host_pattern(pattern) == [*split_host_pattern(limit), "fleet_services"]


# --- the rigs' node exporters and the GPU's alerts ------------------------------------------------------------------
def test_a_rigs_node_exporter_on_loopback_is_scraped_only_from_a_host_sharing_its_network():
    """Elsewhere the rig's server is still scraped and the plan says why its node facts are not."""
    from rigkit.fleet.monitor import node_target

    values = {"node_exporter_host": "127.0.0.1", "node_exporter_port": "19081"}
    node, why = node_target("sandbox-mtp", values, shares_network=True, host="fleet")
    assert why == [] and (node["address"], node["port"], node["tls"], node["username"]) == (
        "127.0.0.1",
        19081,
        False,
        "",
    )
    target, why = node_target("desktop3050", values, shares_network=False, host="nas")
    assert target is None and "Prometheus on nas cannot reach" in why[0]
    assert "its server is" in why[0] and "node_exporter_host" in why[0] and "host_vars/desktop3050.yml" in why[0]


def _rendered(rule: dict, labels: dict[str, str], value: str) -> dict:
    """What promtool expects of one firing alert: the rule's labels over the series', its annotations templated."""
    annotations = {}
    for key, text in rule["annotations"].items():
        for name, label in labels.items():
            text = text.replace(f"{{{{ $labels.{name} }}}}", label)
        annotations[key] = text.replace("{{ $value }}", value)
    return {"exp_labels": {**labels, **rule["labels"]}, "exp_annotations": annotations}


def test_the_gpu_alerts_fire_when_they_should_and_only_then(tool: Path, tmp_path: Path):
    """promtool test rules on the node exporter's GPU series (module_utils/gpu_metrics.py's names): desktop3050's
    server answers while its GPU holds 20 MiB (the model left the GPU), runs at 91 °C with its clocks held down by
    heat, has a kernel pending without the module and a collector that failed; laptop1650ti is healthy under load
    (a power cap is normal); the sandbox is no GPU rig, so its failing collector raises nothing."""
    rigs = {"desktop3050": {"gpu": True}, "laptop1650ti": {"gpu": True}, "sandbox": {"gpu": False}}
    rules = alert_rules(rigs, down_for_s=60, window_s=300, decode_fraction=0.5, gpu_temperature_max=85,
                        gpu_memory_floor_mib=256)  # fmt: skip
    by_name = {rule["alert"]: rule for rule in rules["groups"][0]["rules"]}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    node = {"job": "node-desktop3050", "instance": "127.0.0.1:9100", "rig": "desktop3050", "service": "node"}
    gpu = {**node, "index": "0", "name": "NVIDIA GeForce RTX 3050", "uuid": "GPU-1"}
    laptop = {**gpu, "job": "node-laptop1650ti", "rig": "laptop1650ti", "name": "NVIDIA GeForce GTX 1650 Ti"}

    def series(name: str, labels: dict[str, str], values: str) -> dict:
        return {"series": name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": values}

    guard = {**node, "verdict": "kept-on-6.1.0-56-amd64", "newest": "6.1.0-57-amd64", "with_module": "6.1.0-56-amd64"}
    thermal = {**gpu, "reason": "hw_thermal_slowdown"}
    sandbox = {**node, "job": "node-sandbox", "rig": "sandbox"}
    inputs = [
        series("up", {"job": "j", "instance": "i", "rig": "desktop3050", "service": "llama-server"}, "1x40"),
        series("up", {"job": "k", "instance": "l", "rig": "laptop1650ti", "service": "llama-server"}, "1x40"),
        series("rigkit_gpu_memory_used_bytes", gpu, f"{20 * 2**20}x40"),
        series("rigkit_gpu_memory_used_bytes", laptop, f"{3000 * 2**20}x40"),
        series("rigkit_gpu_temperature_celsius", gpu, "91x40"),
        series("rigkit_gpu_temperature_celsius", laptop, "70x40"),
        series("rigkit_gpu_clock_slowdown", thermal, "1x40"),
        series("rigkit_gpu_clock_slowdown", {**laptop, "reason": "sw_power_cap"}, "1x40"),
        series("rigkit_gpu_clock_slowdown", {**laptop, "reason": "hw_thermal_slowdown"}, "0x40"),
        series("rigkit_nvidia_kernel_guard_ok", guard, "0x40"),
        series("rigkit_nvidia_kernel_guard_ok", {**laptop, "verdict": "ok", "newest": "6.1.0-57-amd64"}, "1x40"),
        series("rigkit_gpu_collector_success", node, "0x40"),
        series("rigkit_gpu_collector_success", {**node, "job": "node-laptop1650ti", "rig": "laptop1650ti"}, "1x40"),
        series(
            "rigkit_gpu_collector_timestamp_seconds",
            {**node, "job": "node-laptop1650ti", "rig": "laptop1650ti"},
            "0+15x40",
        ),
        series("rigkit_gpu_collector_success", sandbox, "0x40"),
        series("up", {**sandbox, "job": "node-sandbox"}, "1x4 0x36"),
    ]
    expected = {
        "GpuModelLeftGpu": [_rendered(by_name["GpuModelLeftGpu"], gpu, str(20 * 2**20))],
        "GpuTemperatureHigh": [_rendered(by_name["GpuTemperatureHigh"], gpu, "91")],
        "GpuClocksSlowedDown": [_rendered(by_name["GpuClocksSlowedDown"], thermal, "1")],
        "NvidiaKernelWithoutModule": [_rendered(by_name["NvidiaKernelWithoutModule"], guard, "0")],
        "GpuCollectorFailing": [_rendered(by_name["GpuCollectorFailing"], node, "0")],
        "NodeExporterDown": [_rendered(by_name["NodeExporterDown"], sandbox, "0")],
    }
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": inputs,
                "alert_rule_test": [
                    *(
                        {"eval_time": "30s", "alertname": name, "exp_alerts": []}
                        for name in expected
                        if name != "NvidiaKernelWithoutModule"
                    ),
                    *(
                        {"eval_time": "5m", "alertname": name, "exp_alerts": alerts}
                        for name, alerts in expected.items()
                    ),
                ],
            }
        ],
    }
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests))
    tested = subprocess.run(
        [str(tool), "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_no_gpu_rig_no_collector_rule():
    names = [rule["alert"] for rule in alert_rules({"sandbox": {"gpu": False}}, down_for_s=60, window_s=300,
                                                   decode_fraction=0.5)["groups"][0]["rules"]]  # fmt: skip
    assert "GpuCollectorFailing" not in names and "GpuModelLeftGpu" in names


def test_an_exposed_node_exporter_is_scraped_over_tls_as_its_user(tool: Path, tmp_path: Path):
    """Off loopback (a monitor on another host): https verified against the certificate the rig made, with the rig's
    inventory name, and basic auth whose password Prometheus reads from a file, never from prometheus.yml."""
    from rigkit.fleet.monitor import NODE_EXPORTER_CERT, node_target

    values = {
        "node_exporter_host": "0.0.0.0",
        "node_exporter_port": 9100,
        "ansible_host": "192.168.1.20",
        "node_exporter_username": "prometheus",
        "node_exporter_password": "p" * 24,
    }
    node, why = node_target("desktop3050", values, shares_network=False, host="nas")
    assert why == [] and node == {
        "rig": "desktop3050",
        "address": "192.168.1.20",
        "port": 9100,
        "tls": True,
        "verify_name": "desktop3050",
        "cert_path": NODE_EXPORTER_CERT,
        "username": "prometheus",
    }  # the password stays in the inventory: a no_log task writes its file from hostvars
    labels = {"desktop3050": lock_labels("desktop3050", LOCK, 3)}
    config = configuration(tmp_path, [], labels, {}, ("desktop3050-node.crt", "desktop3050-node"), nodes=[node])
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "node-desktop3050"]
    assert job["scheme"] == "https" and job["static_configs"][0]["targets"] == ["192.168.1.20:9100"]
    assert job["tls_config"] == {"ca_file": f"{tmp_path}/desktop3050-node.crt", "server_name": "desktop3050"}
    assert job["basic_auth"] == {"username": "prometheus", "password_file": f"{tmp_path}/desktop3050-node"}
    assert "p" * 24 not in json.dumps(config)
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    checked = subprocess.run([str(tool), "check", "config", str(path)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_node_exporter_rule_is_the_one_the_role_and_the_controller_ask():
    from rigkit.validation.rules import node_exporter_problems

    assert node_exporter_problems({}) == []  # loopback, no TLS, no password needed
    assert node_exporter_problems({"node_exporter_host": "127.0.0.2"}) == []  # 127.0.0.0/8 is loopback
    (clear,) = node_exporter_problems({"node_exporter_host": "192.168.1.20", "node_exporter_tls": "false"})
    assert clear[0] == "node_exporter_tls"
    (weak,) = node_exporter_problems({"node_exporter_host": "::", "node_exporter_password": "has a space in it!"})
    assert weak[0] == "node_exporter_password"
    forced = {"node_exporter_host": "127.0.0.1", "node_exporter_tls": True}
    assert [p[0] for p in node_exporter_problems(forced)] == ["node_exporter_password"]
    assert node_exporter_problems({**forced, "node_exporter_password": "x" * 16}) == []


def _matrix(*series: tuple[str, list[list]]) -> dict:
    """A query_range answer as Prometheus writes it: values are [unix time, "string"]."""
    return {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [{"metric": {"rig": rig}, "values": values} for rig, values in series],
        },
    }


def test_the_fleet_graph_reads_prometheus_matrix_and_refuses_anything_else():
    from rigkit.cli.fleet_graph import GraphError, series_of, span_seconds

    answer = _matrix(("sandbox", [[1765100000, "0.99"], [1765100060, "NaN"]]), ("sandbox-mtp", [[1765100000, "1"]]))
    assert series_of(answer) == {"sandbox": [(1765100000.0, 0.99)], "sandbox-mtp": [(1765100000.0, 1.0)]}
    vector = {"status": "success", "data": {"resultType": "vector", "result": []}}
    for hostile in ("<html>", {"status": "error"}, vector, _matrix(("r", [["x", "1"]])), _matrix(("r", [[1, "1x"]]))):
        with pytest.raises(GraphError):
            series_of(hostile)
    assert span_seconds("30m") == 1800 and span_seconds("2d") == 172800
    with pytest.raises(GraphError, match="--range '30 minutes'"):
        span_seconds("30 minutes")


def test_the_fleet_graph_draws_one_titled_line_per_rig_on_a_0_to_1_axis(tmp_path):
    """matplotlib, no browser: one line per rig named in the legend, the acceptance axis fixed at 0-1, a title."""
    from matplotlib import image

    from rigkit.cli.fleet_graph import LOOKS, draw, figure

    series = {"sandbox": [(1765100000.0 + 60 * i, 0.99) for i in range(20)], "sandbox-mtp": [(1765100000.0, 1.0)]}
    axes = figure(series, LOOKS["acceptance"], "last 20m").axes[0]
    assert [text.get_text() for text in axes.get_legend().get_texts()] == ["sandbox", "sandbox-mtp"]
    assert axes.get_ylim() == (0, 1.05) and axes.get_title().startswith("Draft acceptance per rig")
    assert [len(line.get_xdata()) for line in axes.get_lines()] == [20, 1]
    pixels = image.imread(draw(series, LOOKS["acceptance"], tmp_path / "acceptance.png", "last 20m"))
    assert pixels.shape[:2] == (450, 1000) and pixels.std() > 0  # drawn, not blank


def test_a_node_exporters_port_is_9100_on_a_rig_of_its_own_and_beside_the_server_on_the_sandbox():
    from rigkit.fleet.monitor import node_exporter_port, node_target

    assert node_exporter_port("gpu", 8080) == 9100
    assert node_exporter_port("sandbox", "18081") == 19081
    node, _ = node_target("sandbox-mtp", {"rig_kind": "sandbox", "llama_server_port": 18081}, shares_network=True,
                          host="fleet")  # fmt: skip
    assert node["port"] == 19081


# A capability URL: whoever reads it can post alerts (or read the channel); it is a secret like a key.
WEBHOOK = "https://ntfy.example/rigkit-alerts-3f9c1e7a5b2d4c6e"


def test_the_alert_webhook_url_stays_out_of_diffs_and_verbose_output(tmp_path: Path):
    """The role's own task that writes alertmanager.yml, run with --check --diff -vvv and then for real with -vvv:
    the URL reaches the file and nothing printed (its owner, group and amtool check are this machine's to lack)."""
    tasks = yaml.safe_load((REPO / "roles" / "fleet_monitor" / "tasks" / "config.yml").read_text())
    task = next(task for task in tasks if task.get("name") == "Write alertmanager.yml")
    task.pop("notify", None)
    for key in ("owner", "group", "validate"):
        task["ansible.builtin.copy"].pop(key)
    written = tmp_path / "alertmanager.yml"
    task["ansible.builtin.copy"]["dest"] = str(written)
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {
                "fleet_monitor_webhook_url": WEBHOOK,
                "ansible_python_interpreter": str(REPO / ".venv" / "bin" / "python"),
            },
            "tasks": [task],
        }
    ]
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(play))
    base = [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", "localhost,", "-c", "local", "-vvv", str(playbook)]
    for extra in (["--check", "--diff"], ["--diff"]):
        done = subprocess.run([*base, *extra], capture_output=True, text=True, check=False, cwd=REPO)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert "rigkit-alerts" not in done.stdout + done.stderr, extra
    assert WEBHOOK in written.read_text()


def test_the_monitors_plan_names_rigs_and_never_holds_their_secrets(tmp_path, monkeypatch):
    """The plan is a fact (set_fact, shown by -v): keyed rigs and TLS node exporters are named, their API key and
    exporter password stay in the inventory, read only by the no_log tasks that write their files."""
    from filter_plugins.fleet import FilterModule

    monkeypatch.setenv("RIGKIT_LOCK_FILE", str(tmp_path / "rigs.lock.json"))
    key, password = "rig-api-key-" + "9e1b" * 6, "node-password-" + "4c7d" * 6
    catalog = group_vars("all/model_catalog")["model_catalog"]
    hostvars = {
        "desktop3050": {
            "models_target": "tiny-gemma4-target",
            "llama_server_host": "0.0.0.0",
            "ansible_host": "192.168.1.20",
            "llama_server_api_key": key,
            "node_exporter_host": "0.0.0.0",
            "node_exporter_username": "prometheus",
            "node_exporter_password": password,
            "model_catalog": catalog,
        },
        "nas": {"model_catalog": catalog},
    }
    planned = FilterModule().filters()["fleet_monitor_plan"](["desktop3050"], hostvars, "nas", False)
    assert not planned["problems"], planned["problems"]
    assert [u["rig"] for u in planned["upstreams"] if u["keyed"]] == ["desktop3050"]
    assert [n["rig"] for n in planned["nodes"] if n["tls"]] == ["desktop3050"]
    shown = json.dumps(planned)
    assert key not in shown and password not in shown
