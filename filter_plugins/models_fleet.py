"""Jinja filter of the models_fleet role: the run's download plan from the play's rigs (rigkit/mirror/plan.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import rigkit  # noqa: F401  (first: it makes module_utils/ importable as ansible.module_utils)
from rigkit.mirror.plan import fleet_download_plan
from rigkit.paths import cached_model_path


def models_fleet_plan(hosts: Sequence[str], hostvars: Mapping[str, Any], cache_dir: str) -> dict[str, Any]:
    """What each play host noted (its models, those it lacks, the controller's address as it reaches it, its own
    addresses), planned once for the fleet."""
    rigs = []
    for host in hosts:
        values = hostvars[host]
        facts = values.get("ansible_facts") or {}
        rigs.append(
            {
                "needs": values.get("__models_fleet_needs") or [],
                "wants": values.get("__models_fleet_wants") or [],
                "address": values.get("__models_fleet_address") or "",
                "addresses": list(facts.get("all_ipv4_addresses") or []) + list(facts.get("all_ipv6_addresses") or []),
            }
        )

    def cached(entry: Mapping[str, Any]) -> bool:
        path = cached_model_path(str(cache_dir), entry)
        return path is not None and os.path.exists(path)

    return fleet_download_plan(rigs, cached)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"models_fleet_plan": models_fleet_plan}
