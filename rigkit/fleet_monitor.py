"""What the fleet monitor (roles/fleet_monitor, Prometheus and Alertmanager) scrapes and alerts on, computed on the
controller: one scrape job per rig's llama-server (reached as the gateway reaches it, rigkit/fleet_gateway.py), each
series labelled from the lock (what the rig runs: GPU, model sha256s, llama.cpp commit) and the rig's draft length,
and alert rules with each rig's own thresholds (its expected draft acceptance, its latest bench's decode rate).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rigkit.bench_report import summarise
from rigkit.bench_tune import ReportError, current_setting, latest_report, load_report

SHORT = 12
# Metric names as llama-server exports them (--metrics).
ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
DRAFTED = "llamacpp:spec_decode_num_draft_tokens_total"
PREDICTED = "llamacpp:tokens_predicted_total"
PREDICTED_SECONDS = "llamacpp:tokens_predicted_seconds_total"

# Ready queries over the last hour, per rig: `make observe` prints them, `make status` shows their values.
QUERIES = {
    "acceptance_1h": f"sum by (rig) (increase({ACCEPTED}[1h])) / sum by (rig) (increase({DRAFTED}[1h]))",
    "decode_tps_1h": f"sum by (rig) (increase({PREDICTED}[1h])) / sum by (rig) (increase({PREDICTED_SECONDS}[1h]))",
    "server_up": 'up{service="llama-server"}',
}


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
) -> dict[str, Any]:
    """prometheus.yml: one job per rig's llama-server (TLS verified against the rig's certificate, its key from a
    root-only file), the gateway's exporter when there is one, Prometheus and Alertmanager themselves."""
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
        if upstream["api_key"]:
            job["authorization"] = {"type": "Bearer", "credentials_file": f"{keys_dir}/{upstream['rig']}"}
        scrapes.append(job)
    if gateway_metrics:
        scrapes.append({"job_name": "fleet-gateway", "static_configs": [{"targets": [gateway_metrics]}]})
    scrapes.append({"job_name": "prometheus", "static_configs": [{"targets": [self_target]}]})
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


def alert_rules(
    rigs: Mapping[str, Mapping[str, Any]], *, down_for_s: int, window_s: int, decode_fraction: float
) -> dict[str, Any]:
    """Alert rules, per rig where the threshold is the rig's own. ``rigs``: {rig: {"min_acceptance": float|None,
    "bench_tps": float|None, "drafts": bool}}."""
    window = f"{window_s}s"
    rules: list[dict[str, Any]] = [
        {
            "alert": "LlamaServerDown",
            "expr": 'up{service="llama-server"} == 0',
            "for": f"{down_for_s}s",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "llama-server on {{ $labels.rig }} does not answer",
                "description": f"Prometheus could not scrape {{{{ $labels.instance }}}} for {down_for_s} s: "
                "check `make status host={{ $labels.rig }}`.",
            },
        }
    ]
    for rig, facts in sorted(rigs.items()):
        acceptance = facts.get("min_acceptance")
        if facts.get("drafts") and acceptance is not None:
            rules.append(
                {
                    "alert": "DraftAcceptanceLow",
                    "expr": (
                        f'sum by (rig) (increase({ACCEPTED}{{rig="{rig}"}}[{window}])) '
                        f'/ sum by (rig) (increase({DRAFTED}{{rig="{rig}"}}[{window}])) < {float(acceptance)}'
                    ),
                    "labels": {"severity": "warning", "rig": rig},
                    "annotations": {
                        "summary": f"{rig}: draft acceptance below its expected {float(acceptance)}",
                        "description": f"Accepted / drafted tokens over the last {window} fell below "
                        f"rig_expected_min_acceptance: bench the drafter (`make bench host={rig}`).",
                    },
                }
            )
        bench = facts.get("bench_tps")
        if bench:
            floor = round(float(bench) * decode_fraction, 2)
            rules.append(
                {
                    "alert": "DecodeRateLow",
                    "expr": (
                        f'sum by (rig) (increase({PREDICTED}{{rig="{rig}"}}[{window}])) '
                        f'/ sum by (rig) (increase({PREDICTED_SECONDS}{{rig="{rig}"}}[{window}])) < {floor}'
                    ),
                    "labels": {"severity": "warning", "rig": rig},
                    "annotations": {
                        "summary": f"{rig}: decoding below {decode_fraction:.0%} of its latest bench "
                        f"({bench:.1f} tok/s)",
                        "description": f"Generated tokens per second over the last {window} fell below {floor}.",
                    },
                }
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
