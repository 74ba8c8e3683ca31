"""Jinja filters for the nvidia_driver role (logic in module_utils/nvidia_kernels.py, shared with its module)."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

import rigkit  # noqa: F401  (first: it makes module_utils/ importable as ansible.module_utils)

# isort: split
from ansible.module_utils.nvidia_kernels import headers_metapackages


def _headers_metapackages(packages: Any) -> list[str]:
    """package_facts -> apt pins ["linux-headers-FLAVOUR=<version of linux-image-FLAVOUR>", ...]."""
    if not isinstance(packages, dict):
        raise AnsibleFilterError(f"nvidia_headers_metapackages expects package_facts (a dict), got {type(packages)}")
    return [f"{name}={version}" for name, version in headers_metapackages(packages).items()]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"nvidia_headers_metapackages": _headers_metapackages}
