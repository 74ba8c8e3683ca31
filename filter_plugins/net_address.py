"""Jinja filters for where a service is reached and its URL (module_utils/net_address.py: the one wildcard rule)."""

from __future__ import annotations

from typing import Any

import rigkit  # noqa: F401  (first: it makes module_utils/ importable as ansible.module_utils)

# isort: split
from ansible.module_utils.net_address import host_port, probe_address, service_url


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"rigkit_probe_address": probe_address, "rigkit_host_port": host_port, "rigkit_url": service_url}
