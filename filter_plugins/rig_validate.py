"""Jinja filters that validate a rig's description on the controller (logic in rigkit/rig_validate.py).

They run while the validation play templates its assert: nothing connects to a rig.
``hostvars[inventory_hostname] | rig_problems(inventory_hostname, group_names, ansible_inventory_sources)`` lists every
problem of one rig; ``rig_controller_preflight`` runs the pairing and memory preflight on cached GGUF headers.
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


def rig_problems(hostvars: Mapping[str, Any], host: str, groups: list[str], inventory: str | list[str]) -> list[str]:
    values = _values(hostvars)
    sources = Sources(inventory, host, groups)
    catalog = values.get("model_catalog")
    return _rig_problems(host, values, specs=load_specs(ROLES_DIR), sources=sources, catalog=catalog)


def rig_controller_preflight(
    hostvars: Mapping[str, Any], host: str, groups: list[str], inventory: str | list[str], cache_dir: str
) -> list[str]:
    resolved = {k: v for k, v in _values(hostvars).items() if not isinstance(v, Unresolved)}
    values = {**plain_defaults(ROLES_DIR, "llama_server"), **resolved}
    sources = Sources(inventory, host, groups)
    return controller_preflight(host, values, sources=sources, catalog=values.get("model_catalog"), cache_dir=cache_dir)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"rig_problems": rig_problems, "rig_controller_preflight": rig_controller_preflight}
