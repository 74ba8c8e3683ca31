"""Jinja filters that validate a rig's description on the controller (logic in rigkit/validation/rules.py).

They run while the validation play templates its tasks: nothing connects to a rig.
``ansible_play_hosts | rig_fleet_validation(hostvars, ansible_inventory_sources)`` lists every problem of every rig
of the play and, for the sound ones, what the pairing and memory preflight finds on the cached GGUF headers (the
validation play); ``rig_fleet_preflight`` runs that preflight alone (provision.yml, once the models play filled
the cache).
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

import jinja2

from rigkit.inventory_files import Sources
from rigkit.validation.debian_archive import Archive
from rigkit.validation.preflight import controller_preflight
from rigkit.validation.rules import (
    Unresolved,
    archive_problems,
    load_specs,
    plain_defaults,
    resolve_values,
    rig_report,
)

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


def _resolved(values: Mapping[str, Any]) -> dict[str, Any]:
    """The values templating could resolve (what the preflight and the archive rule read)."""
    return {name: value for name, value in values.items() if not isinstance(value, Unresolved)}


def _preflight(
    host: str, values: Mapping[str, Any], sources: Sources, cache_dir: str, defaults: Mapping[str, Any]
) -> list[str]:
    merged = {**defaults, **_resolved(values)}
    return controller_preflight(host, merged, sources=sources, catalog=merged.get("model_catalog"), cache_dir=cache_dir)


# For every rig of the play in one task: one process reads the roles' specs and the shared group_vars files once
# for the whole fleet, where a task per rig would read them again in every rig's worker.
def rig_fleet_preflight(
    hosts: list[str], hostvars: Mapping[str, Any], inventory: str | list[str]
) -> dict[str, list[str]]:
    """{rig: problems} of the pairing and memory preflight on the cached GGUF headers (provision.yml, once the
    models play filled the controller's cache)."""
    defaults = plain_defaults(ROLES_DIR, "llama_server")
    return {
        host: _preflight(
            host,
            _values(hostvars[host]),
            Sources(inventory, host, hostvars[host]["group_names"]),
            hostvars[host]["rig_controller_cache_dir"],
            defaults,
        )
        for host in hosts
    }


def rig_fleet_validation(
    hosts: list[str], hostvars: Mapping[str, Any], inventory: str | list[str], scope: str = "deploy"
) -> dict[str, dict[str, list[str]]]:
    """The validation play's one task: {rig: {"problems": [...], "preflight": [...]}}. Each rig's variables are
    templated once; the preflight and the archive rule are read only for a rig whose values are sound (those they
    expect; models not pinned yet do not stop them, so a context that cannot fit is named in the same run).
    ``scope`` "image" (make image) checks every value but asks for no model: no pins, no memory preflight."""
    specs = load_specs(ROLES_DIR)
    defaults = plain_defaults(ROLES_DIR, "llama_server")
    archive = Archive()  # Debian's indexes, read once for the fleet (cached on disk)
    image_only = scope == "image"
    results: dict[str, dict[str, list[str]]] = {}
    for host in hosts:
        host_vars = hostvars[host]
        values = _values(host_vars)
        sources = Sources(inventory, host, host_vars["group_names"])
        report = rig_report(
            host,
            values,
            specs=specs,
            sources=sources,
            catalog=values.get("model_catalog"),
            models_needed=not image_only,
        )
        preflight: list[str] = []
        if report.values_sound and not image_only:
            preflight = _preflight(host, values, sources, host_vars["rig_controller_cache_dir"], defaults)
        if report.values_sound:
            report.problems += archive_problems(host, _resolved(values), sources=sources, lookup=archive.index)
        results[host] = {"problems": report.problems + preflight, "preflight": [] if report.problems else preflight}
    return results


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "rig_fleet_preflight": rig_fleet_preflight,
            "rig_fleet_validation": rig_fleet_validation,
        }
