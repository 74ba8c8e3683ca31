"""Jinja filters for the nvidia_driver role (logic in module_utils/nvidia_kernels.py and nvidia_compat.py,
shared with its module, the controller's validation and discovery)."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

import rigkit  # noqa: F401  (first: it makes module_utils/ importable as ansible.module_utils)

# isort: split
from ansible.module_utils.nvidia_compat import (
    branch_build,
    cuda_repo_key,
    driver_version_problem,
    gpu_identity_problem,
    open_modules_problem,
)
from ansible.module_utils.nvidia_kernels import headers_metapackages
from ansible.module_utils.secure_boot import enrolment_steps, mok_enrolment, secure_boot_state


def _headers_metapackages(packages: Any) -> list[str]:
    """package_facts -> apt pins ["linux-headers-FLAVOUR=<version of linux-image-FLAVOUR>", ...]."""
    if not isinstance(packages, dict):
        raise AnsibleFilterError(f"nvidia_headers_metapackages expects package_facts (a dict), got {type(packages)}")
    return [f"{name}={version}" for name, version in headers_metapackages(packages).items()]


def _gpu_identity_problem(reported: Any, expected: Any) -> str:
    """nvidia-smi's GPU vs rig_gpu: '' when they match, else what differs."""
    if not isinstance(reported, dict) or not isinstance(expected, dict):
        raise AnsibleFilterError("nvidia_gpu_identity_problem expects two mappings (nvidia-smi's GPU, rig_gpu)")
    return gpu_identity_problem(expected, reported) or ""


def _open_modules_problem(modules: Any, branch: Any, rig_gpu: Any) -> str:
    """'' unless nvidia_driver_kernel_modules is open and that branch's open module would not drive the GPU."""
    if modules != "open" or not isinstance(rig_gpu, dict):
        return ""
    return open_modules_problem(branch, rig_gpu.get("name"), rig_gpu.get("compute_capability")) or ""


def _driver_version_problem(version: Any, source: Any, branch: Any) -> str:
    """'' when nvidia_driver_version can pin the driver from this source and branch, else why not."""
    return driver_version_problem(source, str(branch), version) or ""


def _branch_build(policy: Any, branch: Any, package: Any) -> str:
    """`apt-cache policy PACKAGE` -> the followed branch's upstream version to pin (installed, else candidate)."""
    try:
        return branch_build(str(policy), str(branch), str(package))
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def _secure_boot_state(result: Any) -> str:
    """The registered result of `mokutil --sb-state` -> enforcing or off."""
    try:
        return secure_boot_state(str(result.get("stdout", "")), str(result.get("stderr", "")), int(result["rc"]))
    except (ValueError, KeyError, AttributeError) as exc:
        raise AnsibleFilterError(f"nvidia_secure_boot_state: {exc}") from exc


def _mok_enrolment(result: Any, certificate: Any) -> str:
    """The registered result of `mokutil --ignore-keyring --test-key CERT` -> enrolled, pending, not-enrolled or
    blocked."""
    try:
        return mok_enrolment(str(result.get("stdout", "")), int(result["rc"]), str(certificate))
    except (ValueError, KeyError, AttributeError) as exc:
        raise AnsibleFilterError(f"nvidia_mok_enrolment: {exc}") from exc


def _mok_steps(state: Any, certificate: Any, key: Any, host: Any) -> str:
    """'' when the key is enrolled, else why the run stops and the owner's steps at the console."""
    return enrolment_steps(str(state), str(certificate), str(key), str(host))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "nvidia_headers_metapackages": _headers_metapackages,
            "nvidia_gpu_identity_problem": _gpu_identity_problem,
            "nvidia_open_modules_problem": _open_modules_problem,
            "nvidia_cuda_repo_key": cuda_repo_key,
            "nvidia_driver_version_problem": _driver_version_problem,
            "nvidia_branch_build": _branch_build,
            "nvidia_secure_boot_state": _secure_boot_state,
            "nvidia_mok_enrolment": _mok_enrolment,
            "nvidia_mok_steps": _mok_steps,
        }
