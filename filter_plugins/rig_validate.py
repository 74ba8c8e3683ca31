"""Jinja filters that validate a rig's description on the controller (logic in rigkit/rig_validate.py).

They run while the validation play templates its tasks: nothing connects to a rig.
``ansible_play_hosts | rig_fleet_problems(hostvars, ansible_inventory_sources)`` lists every problem of every rig of
the play ({rig: problems}); ``rig_fleet_preflight`` runs the pairing and memory preflight on cached GGUF headers for
each (provision.yml, once the models play filled the cache); ``rig_fleet_validation`` both, for the validation play.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

import jinja2

from rigkit.controller_preflight import controller_preflight
from rigkit.inventory_files import Sources
from rigkit.rig_validate import Unresolved, load_specs, plain_defaults, resolve_values
from rigkit.rig_validate import rig_problems as _rig_problems

ROLES_DIR = str(pathlib.Path(__file__).resolve().parent.parent / "roles")


def _undefined(value: Any) -> bool:
    """Whether templating left an undefined value anywhere in it (Ansible 2.19 returns markers, not errors)."""
    if isinstance(value, jinja2.Undefined):
        return True
    if isinstance(value, Mapping):
        return any(_undefined(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return any(_undefined(item) for item in value)
    return False


def _values(hostvars: Mapping[str, Any]) -> dict[str, Any]:
    values = resolve_values(list(hostvars.keys()), lambda name: hostvars[name])
    for name, value in list(values.items()):
        if _undefined(value):
            values[name] = Unresolved(f"{name} depends on a variable not defined yet")
    return values


def _problems(
    host_vars: Mapping[str, Any], host: str, groups: list[str], inventory: str | list[str], specs: Any
) -> list[str]:
    values = _values(host_vars)
    sources = Sources(inventory, host, groups)
    return _rig_problems(host, values, specs=specs, sources=sources, catalog=values.get("model_catalog"))


def _preflight(
    host_vars: Mapping[str, Any],
    host: str,
    groups: list[str],
    inventory: str | list[str],
    cache_dir: str,
    defaults: Mapping[str, Any],
) -> list[str]:
    resolved = {k: v for k, v in _values(host_vars).items() if not isinstance(v, Unresolved)}
    values = {**defaults, **resolved}
    sources = Sources(inventory, host, groups)
    return controller_preflight(host, values, sources=sources, catalog=values.get("model_catalog"), cache_dir=cache_dir)


# The same for every rig of the play in one task (``ansible_play_hosts | rig_fleet_problems(hostvars, ...)``):
# {rig: problems}. One process reads the roles' specs and the shared group_vars files once for the whole fleet,
# where a task per rig would read them again in every rig's worker.
def rig_fleet_problems(
    hosts: list[str], hostvars: Mapping[str, Any], inventory: str | list[str]
) -> dict[str, list[str]]:
    specs = load_specs(ROLES_DIR)
    return {host: _problems(hostvars[host], host, hostvars[host]["group_names"], inventory, specs) for host in hosts}


def rig_fleet_preflight(
    hosts: list[str], hostvars: Mapping[str, Any], inventory: str | list[str]
) -> dict[str, list[str]]:
    defaults = plain_defaults(ROLES_DIR, "llama_server")
    return {
        host: _preflight(
            hostvars[host],
            host,
            hostvars[host]["group_names"],
            inventory,
            hostvars[host]["rig_controller_cache_dir"],
            defaults,
        )
        for host in hosts
    }


# The validation play's one fleet-wide task: {rig: {"problems": [...], "preflight": [...]}}; the preflight is read
# only for a rig whose description is sound (its values are the ones the preflight expects).
def rig_fleet_validation(
    hosts: list[str], hostvars: Mapping[str, Any], inventory: str | list[str]
) -> dict[str, dict[str, list[str]]]:
    problems = rig_fleet_problems(hosts, hostvars, inventory)
    sound = [host for host in hosts if not problems[host]]
    preflight = rig_fleet_preflight(sound, hostvars, inventory)
    return {host: {"problems": problems[host], "preflight": preflight.get(host, [])} for host in hosts}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "rig_fleet_problems": rig_fleet_problems,
            "rig_fleet_preflight": rig_fleet_preflight,
            "rig_fleet_validation": rig_fleet_validation,
        }
