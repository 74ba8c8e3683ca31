"""Jinja filters for the node_exporter role (its rules live in rigkit/: the exposure rule in rig_validate.py, which
the controller's validation asks too; the default port in fleet_monitor.py, which the monitor's plan asks too)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rigkit.fleet.monitor import node_exporter_port
from rigkit.validation.rules import node_exporter_problems


def _problems(values: Mapping[str, Any]) -> list[str]:
    """The rule's findings as sentences: "VARIABLE: why" (the value itself is not repeated: it may be a secret)."""
    return [f"{variable}: {why}" for variable, _value, why in node_exporter_problems(values)]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"node_exporter_problems": _problems, "node_exporter_default_port": node_exporter_port}
