"""Jinja filters for the llamacpp_image role (logic in module_utils/cuda_compat.py, shared with the controller's
validation and `make plan`)."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

import rigkit  # noqa: F401  (first: it makes module_utils/ importable as ansible.module_utils)

# isort: split
from ansible.module_utils.cuda_compat import cuda_objects, default_architectures


def _cuda_objects(architectures: Any) -> dict[str, list[str]]:
    try:
        return cuda_objects(architectures)
    except ValueError as exc:
        raise AnsibleFilterError(f"llamacpp_image_cuda_architectures: {exc}") from exc


def _apt_pins(packages: Any) -> list[str]:
    """{name: version} -> ["name=version", ...] in name order (an empty version installs the candidate)."""
    if not isinstance(packages, dict):
        raise AnsibleFilterError(f"expected a mapping of Debian package names to versions, got {type(packages)}")
    return [f"{name}={version}" if str(version) else str(name) for name, version in sorted(packages.items())]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "llamacpp_cuda_objects": _cuda_objects,
            "llamacpp_apt_pins": _apt_pins,
            "llamacpp_default_architectures": default_architectures,
        }
