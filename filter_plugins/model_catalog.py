"""Jinja filters over the model catalog (logic in module_utils/model_catalog.py, shared with the rigs' modules)."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

import rigkit  # noqa: F401  (first: it makes module_utils/ importable as ansible.module_utils)

# isort: split
from ansible.module_utils.model_catalog import (
    CatalogError,
    catalog_entry,
    catalog_problems,
    deployable_entry,
    host_pin_refusal,
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


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "catalog_entry": _catalog_entry,
            "deployable_entry": _deployable_entry,
            "catalog_problems": _catalog_problems,
            "catalog_refusal": _catalog_refusal,
            "host_pin_refusal": _host_pin_refusal,
        }
