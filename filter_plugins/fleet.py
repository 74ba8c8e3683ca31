"""Jinja filters for the fleet services (logic in rigkit/fleet_gateway.py): what the gateway fronts.

``fleet_gateway_rigs | fleet_gateway_plan(hostvars, gateway_host, shares_network)`` resolves each rig's server
settings (its variables over the llama_server role's defaults) and returns the upstreams, the aliases and the
problems; the fleet play refuses the problems before the gateway host is touched.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

from rigkit.fleet_gateway import models_list, plan
from rigkit.rig_validate import plain_defaults

ROLES_DIR = str(pathlib.Path(__file__).resolve().parent.parent / "roles")
# What the plan reads of a rig: its server's bind, TLS, key and slots, its target, its address.
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


def fleet_gateway_plan(
    rigs: list[str], hostvars: Mapping[str, Any], gateway: str, shares_network: Any = False, default_alias: str = ""
) -> dict[str, Any]:
    unknown = [rig for rig in rigs if rig not in hostvars]
    if unknown:
        raise AnsibleFilterError(
            f"fleet_gateway_rigs names {', '.join(unknown)}, not in the inventory: fix it in "
            f"inventory/host_vars/{gateway}.yml (rigs: {', '.join(sorted(hostvars))})"
        )
    defaults = plain_defaults(ROLES_DIR, "llama_server")
    values = {rig: _rig_values(hostvars[rig], defaults) for rig in rigs}
    catalog = hostvars[gateway].get("model_catalog") or {}
    return plan(
        values,
        catalog,
        shares_network=boolean(shares_network, strict=False),
        gateway=gateway,
        default_alias=default_alias,
    )


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"fleet_gateway_plan": fleet_gateway_plan, "fleet_gateway_models": models_list}
