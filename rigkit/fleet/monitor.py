"""What the fleet monitor (roles/fleet_monitor, Prometheus and Alertmanager) scrapes and alerts on, computed on the
controller: one scrape job per rig's llama-server (reached as the gateway reaches it, rigkit/fleet/gateway.py) and
one per rig's node exporter (roles/node_exporter, with the GPU facts of module_utils/gpu_metrics.py), each series
labelled from the lock (what the rig runs: GPU, model sha256s, llama.cpp commit) and the rig's draft length, and
alert rules with each rig's own thresholds (its expected draft acceptance, its latest bench's decode rate) and the
GPU's (temperature, slowdowns, a model that left the GPU, a kernel that would boot without the NVIDIA module).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import rigkit  # noqa: F401  (first: it makes module_utils/ importable as ansible.module_utils)

# isort: split
from ansible.module_utils.net_address import is_loopback, serves_tls

from rigkit.bench.report import summarise
from rigkit.bench.tune import ReportError, current_setting, latest_report, load_report
from rigkit.fleet.gateway import reach_address

SHORT = 12
# Metric names as llama-server exports them (--metrics).
ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
DRAFTED = "llamacpp:spec_decode_num_draft_tokens_total"
PREDICTED = "llamacpp:tokens_predicted_total"
PREDICTED_SECONDS = "llamacpp:tokens_predicted_seconds_total"
# The slowdown reasons that mean trouble (module_utils/gpu_metrics.py's names); a power cap under load is normal.
TROUBLE_SLOWDOWNS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
NODE_EXPORTER_PORT = 9100
# Where roles/node_exporter keeps the certificate it serves with TLS (read from the rig to verify it).
NODE_EXPORTER_CERT = "/etc/prometheus/node-exporter/tls.crt"
# A GPU sample older than this is stale (the collector's timer stopped).
GPU_SAMPLE_MAX_AGE_S = 120

# Ready queries over the last hour, per rig: `make observe` prints them, `make status` shows their values.
QUERIES = {
    "acceptance_1h": f"sum by (rig) (increase({ACCEPTED}[1h])) / sum by (rig) (increase({DRAFTED}[1h]))",
    "decode_tps_1h": f"sum by (rig) (increase({PREDICTED}[1h])) / sum by (rig) (increase({PREDICTED_SECONDS}[1h]))",
    "server_up": 'up{service="llama-server"}',
    "gpu_temperature": "max by (rig) (rigkit_gpu_temperature_celsius)",
}
# Over time, per rig (rigkit fleet-graph draws them from Prometheus's query_range API).
GRAPHS = {
    "acceptance": f"sum by (rig) (rate({ACCEPTED}[5m])) / sum by (rig) (rate({DRAFTED}[5m]))",
    "decode_tps": f"sum by (rig) (rate({PREDICTED}[5m])) / sum by (rig) (rate({PREDICTED_SECONDS}[5m]))",
    "gpu_temperature": QUERIES["gpu_temperature"],
}


def node_exporter_port(rig_kind: object, llama_server_port: object) -> int:
    """A rig's node exporter port when its inventory sets none: 9100 (the exporter's registered port) on a rig of its
    own; the sandbox's rigs share this machine's network, so each listens 1000 above its llama-server. The
    node_exporter role's default (filter node_exporter_default_port) and the monitor's plan both ask this."""
    if str(rig_kind) == "sandbox":
        return int(str(llama_server_port)) + 1000
    return NODE_EXPORTER_PORT


def node_target(
    rig: str, values: Mapping[str, Any], *, shares_network: bool, host: str
) -> tuple[dict[str, Any] | None, list[str]]:
    """Where Prometheus on ``host`` scrapes the rig's node exporter (roles/node_exporter), or why it cannot (the
    monitor then scrapes that rig's server only, and says so). On loopback only from the rig's own network; off
    loopback over TLS verified against the certificate the rig made for it, as its one user (the controller's
    validation refused an exposed node exporter without TLS or a password already)."""
    bind = str(values.get("node_exporter_host") or "127.0.0.1")
    rig_file = f"inventory/host_vars/{rig}.yml"
    tls = serves_tls(values.get("node_exporter_tls", "auto"), bind)
    if is_loopback(bind) and not shares_network:
        return None, [
            f"{rig}: its node exporter listens on loopback ({bind}), which Prometheus on {host} cannot reach, so its "
            f"node and GPU facts are not scraped (its server is): set node_exporter_host (with node_exporter_password "
            f"from Vault) in {rig_file}"
        ]
    try:
        port = int(
            values.get("node_exporter_port")
            or node_exporter_port(values.get("rig_kind"), values.get("llama_server_port", 8080))
        )
    except (TypeError, ValueError):
        return None, [f"{rig}: node_exporter_port must be a number ({rig_file})"]
    address = reach_address(rig, bind, values)
    return {
        "rig": rig,
        "address": address,
        "port": port,
        "tls": tls,
        "verify_name": rig if tls else "",  # the certificate the role makes lists the rig's inventory name
        "cert_path": NODE_EXPORTER_CERT if tls else "",
        "username": str(values.get("node_exporter_username") or "") if tls else "",
    }, []


def lock_labels(rig: str, entry: Mapping[str, Any] | None, draft_n_max: Any) -> dict[str, str]:
    """The labels every series of the rig carries: what the lock says it runs (empty where it has no entry yet)."""
    entry = entry or {}
    models = entry.get("models") or {}
    gpu = entry.get("gpu") or {}
    return {
        "rig": rig,
        "gpu": str(gpu.get("name") or "none") if isinstance(gpu, Mapping) else str(gpu),
        "target_sha256": str((models.get("target") or {}).get("sha256") or "")[:SHORT],
        "drafter_sha256": str((models.get("drafter") or {}).get("sha256") or "")[:SHORT],
        "llamacpp_commit": str((entry.get("image") or {}).get("llamacpp_commit") or "")[:SHORT],
        "draft_n_max": str(draft_n_max),
    }


def bench_decode_rate(reports_dir: Path, rig: str) -> float | None:
    """Decode tokens/s of the rig's latest bench at the draft length it was benched with (None: no bench)."""
    try:
        path = latest_report(reports_dir, rig)
        report = load_report(path)
        current = current_setting(report, path)
    except (ReportError, KeyError, TypeError, ValueError):
        return None
    row = next((row for row in summarise(report)["scores"] if row["draft_n_max"] == current), None)
    return float(row["score"]) if row and row.get("score") else None


def _tls_config(upstream: Mapping[str, Any], certs_dir: str) -> dict[str, Any]:
    config: dict[str, Any] = {"ca_file": f"{certs_dir}/{upstream['rig']}.crt"}
    if upstream["verify_name"]:
        config["server_name"] = upstream["verify_name"]
    return config


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


# Every job's bounds on what a target may hand Prometheus (a rig is not trusted to be sane): a scrape over any of
# them fails whole, as the target being down; no redirect takes a scrape (and its key) elsewhere. The kit's own
# targets stay well inside: HAProxy's exporter serves ~130 KB, a node exporter a few thousand series.
SCRAPE_LIMITS: dict[str, Any] = {
    "sample_limit": 20000,
    "label_limit": 64,
    "label_name_length_limit": 128,
    "label_value_length_limit": 1024,
    "body_size_limit": "16MB",
    "follow_redirects": False,
}


def prometheus_config(
    upstreams: list[Mapping[str, Any]],
    labels: Mapping[str, Mapping[str, str]],
    *,
    interval_s: int,
    alertmanager: str,
    rules_file: str,
    certs_dir: str,
    keys_dir: str,
    gateway_metrics: str = "",
    self_target: str = "127.0.0.1:9090",
    config_id: str = "",
    nodes: list[Mapping[str, Any]] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    """prometheus.yml: one job per rig's llama-server (TLS verified against the rig's certificate, its key from a
    root-only file), one per rig's node exporter, the gateway's exporter when there is one, Prometheus itself."""
    scrapes: list[dict[str, Any]] = []
    for upstream in upstreams:
        job: dict[str, Any] = {
            "job_name": f"llama-server-{upstream['rig']}",
            "scheme": "https" if upstream["tls"] else "http",
            "metrics_path": "/metrics",
            "static_configs": [
                {
                    "targets": [f"{_host(upstream['address'])}:{upstream['port']}"],
                    "labels": {**labels[upstream["rig"]], "service": "llama-server"},
                }
            ],
        }
        if upstream["tls"]:
            job["tls_config"] = _tls_config(upstream, certs_dir)
        if upstream["keyed"]:
            job["authorization"] = {"type": "Bearer", "credentials_file": f"{keys_dir}/{upstream['rig']}"}
        scrapes.append(job)
    for node in nodes:
        job = {
            "job_name": f"node-{node['rig']}",
            "static_configs": [
                {
                    "targets": [f"{_host(node['address'])}:{node['port']}"],
                    "labels": {**labels[node["rig"]], "service": "node"},
                }
            ],
        }
        if node.get("tls"):
            job["scheme"] = "https"
            job["tls_config"] = {"ca_file": f"{certs_dir}/{node['rig']}-node.crt", "server_name": node["verify_name"]}
            job["basic_auth"] = {"username": node["username"], "password_file": f"{keys_dir}/{node['rig']}-node"}
        scrapes.append(job)
    if gateway_metrics:
        scrapes.append({"job_name": "fleet-gateway", "static_configs": [{"targets": [gateway_metrics]}]})
    scrapes.append({"job_name": "prometheus", "static_configs": [{"targets": [self_target]}]})
    for job in scrapes:
        job.update(SCRAPE_LIMITS)
    return {
        "global": {
            "scrape_interval": f"{interval_s}s",
            "evaluation_interval": f"{interval_s}s",
            # which configuration the running Prometheus loaded (the role compares it after each change)
            "external_labels": {"rigkit_config": config_id} if config_id else {},
        },
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "rule_files": [rules_file],
        "scrape_configs": scrapes,
    }


def _rule(alert: str, expr: str, for_s: int, severity: str, summary: str, description: str, **labels: str) -> dict:
    return {
        "alert": alert,
        "expr": expr,
        "for": f"{for_s}s",
        "labels": {"severity": severity, **labels},
        "annotations": {"summary": summary, "description": description},
    }


def gpu_rules(
    gpu_rigs: list[str], *, down_for_s: int, temperature_max: float, memory_floor_mib: float
) -> list[dict[str, Any]]:
    """The GPU's alerts, from the node exporter's textfile (module_utils/gpu_metrics.py). Only GPU rigs write those
    series; the collector's own failure is judged on the rigs declared GPU rigs (``gpu_rigs``)."""
    floor = int(memory_floor_mib * 2**20)
    slowdowns = "|".join(TROUBLE_SLOWDOWNS)
    rules = [
        _rule(
            "GpuModelLeftGpu",
            f'rigkit_gpu_memory_used_bytes < {floor} and on (rig) up{{service="llama-server"}} == 1',
            down_for_s,
            "critical",
            "{{ $labels.rig }}: llama-server answers but its GPU holds almost no memory",
            f"GPU {{{{ $labels.index }}}} ({{{{ $labels.name }}}}) has used under {memory_floor_mib:g} MiB for "
            f"{down_for_s} s while the server answered: it serves from the CPU. Check `make status "
            "host={{ $labels.rig }}` and the server's log (the rollout's offload check names the cause).",
        ),
        _rule(
            "GpuTemperatureHigh",
            f"rigkit_gpu_temperature_celsius > {temperature_max:g}",
            down_for_s,
            "warning",
            "{{ $labels.rig }}: GPU at {{ $value }} °C",
            f"GPU {{{{ $labels.index }}}} has been above {temperature_max:g} °C for {down_for_s} s: check its cooling.",
        ),
        _rule(
            "GpuClocksSlowedDown",
            f'rigkit_gpu_clock_slowdown{{reason=~"{slowdowns}"}} == 1',
            down_for_s,
            "warning",
            "{{ $labels.rig }}: GPU clocks held down ({{ $labels.reason }})",
            f"GPU {{{{ $labels.index }}}} has been slowed down by {{{{ $labels.reason }}}} for {down_for_s} s "
            "(heat or power): decoding is slower than benched.",
        ),
        _rule(
            "NvidiaKernelWithoutModule",
            "rigkit_nvidia_kernel_guard_ok == 0",
            0,
            "critical",
            "{{ $labels.rig }}: kernel {{ $labels.newest }} has no NVIDIA module",
            "The newest installed kernel has no NVIDIA module (the boot guard: {{ $labels.verdict }}); a reboot "
            "into it would lose the GPU. Run `make provision host={{ $labels.rig }}`.",
        ),
    ]
    if gpu_rigs:
        selector = f'rig=~"{"|".join(sorted(gpu_rigs))}"'
        rules.append(
            _rule(
                "GpuCollectorFailing",
                f"rigkit_gpu_collector_success{{{selector}}} == 0 "
                f"or (time() - rigkit_gpu_collector_timestamp_seconds{{{selector}}}) > {GPU_SAMPLE_MAX_AGE_S}",
                down_for_s,
                "warning",
                "{{ $labels.rig }}: no GPU facts",
                "The GPU collector (rigkit-gpu-metrics.timer) could not read the GPU or has stopped: "
                "check nvidia-smi on the rig.",
            )
        )
    return rules


def alert_rules(
    rigs: Mapping[str, Mapping[str, Any]],
    *,
    down_for_s: int,
    window_s: int,
    decode_fraction: float,
    gpu_temperature_max: float = 85,
    gpu_memory_floor_mib: float = 256,
) -> dict[str, Any]:
    """Alert rules, per rig where the threshold is the rig's own. ``rigs``: {rig: {"min_acceptance": float|None,
    "bench_tps": float|None, "drafts": bool, "gpu": bool}}."""
    window = f"{window_s}s"
    rules: list[dict[str, Any]] = [
        _rule(
            "LlamaServerDown",
            'up{service="llama-server"} == 0',
            down_for_s,
            "critical",
            "llama-server on {{ $labels.rig }} does not answer",
            f"Prometheus could not scrape {{{{ $labels.instance }}}} for {down_for_s} s: "
            "check `make status host={{ $labels.rig }}`.",
        ),
        _rule(
            "NodeExporterDown",
            'up{service="node"} == 0',
            down_for_s,
            "warning",
            "the node exporter on {{ $labels.rig }} does not answer",
            f"Prometheus could not scrape {{{{ $labels.instance }}}} for {down_for_s} s: the rig's own and its GPU's "
            "facts are missing. Check prometheus-node-exporter.service on the rig.",
        ),
        *gpu_rules(
            [rig for rig, facts in rigs.items() if facts.get("gpu")],
            down_for_s=down_for_s,
            temperature_max=gpu_temperature_max,
            memory_floor_mib=gpu_memory_floor_mib,
        ),
    ]
    for rig, facts in sorted(rigs.items()):
        acceptance = facts.get("min_acceptance")
        if facts.get("drafts") and acceptance is not None:
            # the expression already spans the window: it fires as soon as the window's ratio is low
            rules.append(
                _rule(
                    "DraftAcceptanceLow",
                    f'sum by (rig) (increase({ACCEPTED}{{rig="{rig}"}}[{window}])) '
                    f'/ sum by (rig) (increase({DRAFTED}{{rig="{rig}"}}[{window}])) < {float(acceptance)}',
                    0,
                    "warning",
                    f"{rig}: draft acceptance below its expected {float(acceptance)}",
                    f"Accepted / drafted tokens over the last {window} fell below rig_expected_min_acceptance: "
                    f"bench the drafter (`make bench host={rig}`).",
                    rig=rig,
                )
            )
        bench = facts.get("bench_tps")
        if bench:
            floor = round(float(bench) * decode_fraction, 2)
            rules.append(
                _rule(
                    "DecodeRateLow",
                    f'sum by (rig) (increase({PREDICTED}{{rig="{rig}"}}[{window}])) '
                    f'/ sum by (rig) (increase({PREDICTED_SECONDS}{{rig="{rig}"}}[{window}])) < {floor}',
                    0,
                    "warning",
                    f"{rig}: decoding below {decode_fraction:.0%} of its latest bench ({bench:.1f} tok/s)",
                    f"Generated tokens per second over the last {window} fell below {floor}.",
                    rig=rig,
                )
            )
    return {"groups": [{"name": "rigkit", "rules": rules}]}


def history(results: list[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """{rig: {query name: value}} from the status play's answers to QUERIES (an answer that failed, or a NaN, as
    when nothing was drafted in the hour, is left out)."""
    rigs: dict[str, dict[str, float]] = {}
    for result in results:
        name = (result.get("item") or {}).get("key")
        data = ((result.get("json") or {}).get("data") or {}).get("result") or []
        if name not in QUERIES or result.get("failed"):
            continue
        for sample in data:
            rig = (sample.get("metric") or {}).get("rig")
            try:
                value = float(sample["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            if rig and value == value:  # NaN is not equal to itself
                rigs.setdefault(rig, {})[name] = value
    return rigs
