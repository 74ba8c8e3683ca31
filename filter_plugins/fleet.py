"""Jinja filters for the fleet services (logic in rigkit/fleet/gateway.py and rigkit/fleet/monitor.py).

``fleet_gateway_rigs | fleet_gateway_plan(hostvars, gateway_host, shares_network)`` resolves each rig's server
settings (its variables over the llama_server role's defaults) and returns the upstreams, the aliases and the
problems; ``fleet_monitor_plan`` the same upstreams for Prometheus, with each rig's labels from the lock and its
alert thresholds. The roles refuse the problems before the fleet host is touched.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

from rigkit import REPO
from rigkit.fleet.gateway import KeyFileError, client_keys_file, key_file_problems, models_list, plan, rig_keys_file
from rigkit.fleet.monitor import (
    QUERIES,
    alert_rules,
    bench_decode_rate,
    history,
    lock_labels,
    node_target,
    prometheus_config,
)
from rigkit.paths import lock_file
from rigkit.validation.rules import api_key_problem, plain_defaults

ROLES_DIR = str(pathlib.Path(__file__).resolve().parent.parent / "roles")
# What the plan reads of a rig: its server's bind, TLS, key and slots, its target, its address, its node exporter.
RIG_NAMES = (
    "llama_server_instance",
    "llama_server_host",
    "llama_server_port",
    "llama_server_tls",
    "llama_server_tls_cert",
    "llama_server_api_key",
    "llama_server_parallel",
    "models_target",
    "ansible_host",
    "llama_server_spec_type",
    "llama_server_spec_draft_n_max",
    "rig_expected_min_acceptance",
    "rig_kind",
    "node_exporter_host",
    "node_exporter_port",
    "node_exporter_tls",
    "node_exporter_username",
    "node_exporter_password",
)


def _rig_values(rig_vars: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    values = {name: defaults[name] for name in RIG_NAMES if name in defaults}
    for name in RIG_NAMES:
        if name in rig_vars:
            try:
                values[name] = rig_vars[name]
            except Exception as exc:
                raise AnsibleFilterError(f"cannot read {name}: {exc}") from None
    return values


def _resolved(rigs: list[str], hostvars: Mapping[str, Any], host: str, rigs_variable: str) -> dict[str, dict[str, Any]]:
    unknown = [rig for rig in rigs if rig not in hostvars]
    if unknown:
        raise AnsibleFilterError(
            f"{rigs_variable} names {', '.join(unknown)}, not in the inventory: fix it in "
            f"inventory/host_vars/{host}.yml (rigs: {', '.join(sorted(hostvars))})"
        )
    defaults = {**plain_defaults(ROLES_DIR, "llama_server"), **plain_defaults(ROLES_DIR, "node_exporter")}
    return {rig: _rig_values(hostvars[rig], defaults) for rig in rigs}


def _plan(
    values: dict[str, dict[str, Any]], hostvars: Mapping[str, Any], host: str, shares_network: bool, **wording: str
) -> dict[str, Any]:
    return plan(
        values, hostvars[host].get("model_catalog") or {}, shares_network=shares_network, gateway=host, **wording
    )


def fleet_gateway_plan(
    rigs: list[str], hostvars: Mapping[str, Any], gateway: str, shares_network: Any = False, default_alias: str = ""
) -> dict[str, Any]:
    """What the gateway on host ``gateway`` reaches of each rig of fleet_gateway_rigs (rigkit.fleet.gateway)."""
    values = _resolved(rigs, hostvars, gateway, "fleet_gateway_rigs")
    return _plan(values, hostvars, gateway, boolean(shares_network, strict=False), default_alias=default_alias)


def fleet_monitor_plan(
    rigs: list[str], hostvars: Mapping[str, Any], host: str, shares_network: Any = False
) -> dict[str, Any]:
    """The rigs' scrape targets (reached as the gateway reaches them), their labels from the lock and the facts
    their alert thresholds come from."""
    from ansible.module_utils.rig_lock import LockError, read_lock

    values = _resolved(rigs, hostvars, host, "fleet_monitor_rigs")
    shared = boolean(shares_network, strict=False)
    planned = _plan(values, hostvars, host, shared, service="Prometheus", rigs_variable="fleet_monitor_rigs")
    # A node exporter Prometheus cannot reach leaves that rig's server scraped and its node facts out, said aloud.
    nodes, unscraped = [], []
    for rig in sorted(values):
        node, why = node_target(rig, values[rig], shares_network=shared, host=host)
        unscraped += why
        if node is not None:
            nodes.append(node)
    try:
        lock = read_lock(lock_file())
    except LockError as exc:
        raise AnsibleFilterError(str(exc)) from None
    labels = {
        rig: lock_labels(rig, lock.get(rig), values[rig].get("llama_server_spec_draft_n_max", "")) for rig in values
    }
    thresholds = {
        rig: {
            "drafts": str(values[rig].get("llama_server_spec_type", "none")) != "none",
            "min_acceptance": values[rig].get("rig_expected_min_acceptance"),
            "bench_tps": bench_decode_rate(REPO / "reports" / "bench", rig),
            "gpu": values[rig].get("rig_kind") == "gpu",
        }
        for rig in values
    }
    return {**planned, "nodes": nodes, "unscraped_nodes": unscraped, "labels": labels, "thresholds": thresholds}


def api_key_problem_filter(value: Any, variable: str, host: str) -> str:
    """The controller's whole-value rule for an API key (rigkit.validation.rules), as a message naming the host,
    the variable and the file; empty when the key is sound."""
    why = api_key_problem(variable, value)
    return f"{host}: {variable} is <hidden>; {why}: set it in inventory/host_vars/{host}.yml" if why else ""


def _key_file(write: Any, *args: Any) -> str:
    try:
        return write(*args)
    except KeyFileError as exc:
        raise AnsibleFilterError(str(exc)) from None


def _rig_keys(upstreams: list[Mapping[str, Any]], hostvars: Mapping[str, Any]) -> dict[str, Any]:
    """{rig: llama_server_api_key} of the plan's keyed rigs, read from hostvars only here (by a no_log task)."""
    keys: dict[str, Any] = {}
    for item in upstreams:
        if item.get("keyed"):
            try:
                keys[str(item["rig"])] = hostvars[str(item["rig"])]["llama_server_api_key"]
            except Exception as exc:
                raise AnsibleFilterError(f"{item.get('rig')}: cannot read llama_server_api_key ({exc})") from None
    return keys


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "fleet_gateway_plan": fleet_gateway_plan,
            "fleet_gateway_models": models_list,
            # every API key's whole-value rule, for the gateway's and the rigs' own checks alike
            "api_key_problem": api_key_problem_filter,
            "fleet_gateway_client_keys_file": lambda key, gateway: _key_file(client_keys_file, key, gateway),
            "fleet_gateway_rig_keys_file": lambda upstreams, hostvars: _key_file(
                rig_keys_file, upstreams, _rig_keys(upstreams, hostvars)
            ),
            "fleet_gateway_key_file_problems": key_file_problems,
            "fleet_monitor_plan": fleet_monitor_plan,
            "fleet_monitor_prometheus_config": prometheus_config,
            "fleet_monitor_alert_rules": alert_rules,
            "fleet_monitor_history": history,
            "fleet_monitor_queries": lambda names: {name: QUERIES[name] for name in names},
            "fleet_monitor_flag": lambda item: f"--{item['key']}={item['value']}",
        }
