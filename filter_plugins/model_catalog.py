"""Jinja filters over the model catalog (logic in module_utils/model_catalog.py, shared with the rigs' modules),
and where an entry lives: on the rig (``entry | rig_model_path(models_dir)``) and in the controller's cache
(``entry | controller_cached_model(rig_controller_cache_dir)``, rigkit/paths.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

import rigkit  # noqa: F401  (first: it makes module_utils/ importable as ansible.module_utils)
from rigkit.paths import cached_model_path, model_cache

# isort: split
from ansible.module_utils.model_catalog import (
    CatalogError,
    catalog_entry,
    catalog_problems,
    deployable_entry,
    host_pin_refusal,
    pin_command,
    rig_model_dir,
    rig_model_path,
    usable_entry,
)


def _catalog_entry(name: str, catalog: dict[str, Any]) -> dict[str, Any]:
    try:
        return catalog_entry(catalog, name)
    except CatalogError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def _deployable_entry(name: str, catalog: dict[str, Any], role: str | None = None) -> dict[str, Any]:
    try:
        return deployable_entry(catalog, name, role)
    except CatalogError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def _catalog_refusal(name: Any, catalog: dict[str, Any], role: str | None = None, pinned: bool = True) -> str:
    """Why ``name`` cannot be deployed (in the ``role`` slot), or '' when it can: for asserts with a good message.

    ``pinned=False`` leaves the pins out (known, well formed, right role): the rig's pins are refused all at once
    by ``host_pin_refusal``.
    """
    try:
        (deployable_entry if pinned else usable_entry)(catalog, str(name), role)
    except CatalogError as exc:
        return str(exc)
    return ""


def _host_pin_refusal(catalog: dict[str, Any], host: str, names: list[Any]) -> str:
    """Every unpinned entry ``host`` needs and the one command that pins them, or ''."""
    return host_pin_refusal(str(host), catalog, list(names))


def _catalog_problems(catalog: Any) -> list[str]:
    return catalog_problems(catalog)


def _rig_model_dir(entry: Mapping[str, Any], models_dir: str) -> str:
    return rig_model_dir(str(models_dir), entry)


def _rig_model_path(entry: Any, models_dir: str) -> str:
    """The entry's file on the rig, or '' for no entry ({}) or an unpinned one (it has no path yet)."""
    if not isinstance(entry, Mapping) or not entry.get("sha256"):
        return ""
    return rig_model_path(str(models_dir), entry)


def _controller_model_cache(cache: str) -> str:
    return model_cache(str(cache))


def _controller_cached_model(entry: Mapping[str, Any], cache: str) -> str:
    path = cached_model_path(str(cache), entry)
    if path is None:
        name = entry.get("name")
        raise AnsibleFilterError(
            f"model '{name}' has no repo, revision or file name to cache it by: pin it first ({pin_command(name)})"
        )
    return path


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "catalog_entry": _catalog_entry,
            "deployable_entry": _deployable_entry,
            "catalog_problems": _catalog_problems,
            "catalog_refusal": _catalog_refusal,
            "host_pin_refusal": _host_pin_refusal,
            "rig_model_dir": _rig_model_dir,
            "rig_model_path": _rig_model_path,
            "controller_model_cache": _controller_model_cache,
            "controller_cached_model": _controller_cached_model,
        }
