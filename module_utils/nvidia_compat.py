"""Which NVIDIA driver, kernel-module flavour, GPU and repository key go together (stdlib only: runs on rigs).

One home for these rules: the nvidia_driver role calls them through filters (filter_plugins/nvidia_driver.py),
the controller's validation (rigkit/validation/rules.py) before any rig is contacted, and discovery
(rigkit/discovery/profile.py) when it writes a host profile.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DriverPin:
    """What an OS's archive carries that installs and builds today, and where it comes from."""

    branch: str
    version: str
    kernel_modules: str
    source: str


# Debian 12: 535.261.03 (bookworm) wants firmware-nvidia-gsp 535.261.03, which loses to the installer-enabled
# bookworm-security candidate, and its open module does not build for 6.1.0-53+; 535.309.01 proprietary exists
# only in bookworm-security non-free. Debian 13: the open 550.163.01 does not build for trixie-security's
# 6.12.97+ (pci_resize_resource); the proprietary one has no such call. Ubuntu keeps only a branch's newest
# build, so there the branch is the pin and the installed version is read back into the lock.
DRIVER_PINS: dict[tuple[str, str], DriverPin] = {
    ("debian", "12"): DriverPin(
        "535", "535.309.01", "proprietary", "Debian 12's bookworm-security non-free (the 535 that builds on 6.1.0-57)"
    ),
    ("debian", "13"): DriverPin(
        "550", "550.163.01", "proprietary", "Debian 13's non-free (the 550 whose module builds on 6.12.118)"
    ),
    ("ubuntu", "22.04"): DriverPin("580", "", "open", "Canonical's -server packages (restricted), 580"),
    ("ubuntu", "24.04"): DriverPin("580", "", "open", "Canonical's -server packages (restricted), 580"),
}

# nvidia_driver_version: an exact upstream version, or "" (distribution packages only) to follow the branch.
DRIVER_VERSION_RE = re.compile(r"^[0-9]+\.[0-9]+(\.[0-9]+)?\Z")
# `apt-cache policy PACKAGE`'s two lines that matter.
_POLICY_LINE_RE = re.compile(r"^\s*(Installed|Candidate):\s*(\S+)\s*$", re.MULTILINE)

# Open kernel modules: Turing (7.5) and newer; on GeForce and workstation cards only from branch 545 (before
# it the open nvidia.ko refuses them unless NVreg_OpenRmEnableUnsupportedGpus=1: "only ready for use on Data
# Center GPUs").
OPEN_MODULES_MIN_COMPUTE_CAPABILITY = (7, 5)
OPEN_MODULES_GEFORCE_MIN_BRANCH = 545
_DATA_CENTER_RE = re.compile(
    r"\b(tesla|[abhl][0-9]{1,3}[gs]?|gh200|gb200|b[0-9]{3}|t4|v100|p100|p40|p4|a800|h800|h20|l20|l40s?)\b",
    re.IGNORECASE,
)
_WORKSTATION_OR_CONSUMER_RE = re.compile(r"\b(geforce|quadro|titan|rtx|gtx)\b", re.IGNORECASE)

# NVIDIA's CUDA repository signs each distribution's tree with its own key: (key file name, fingerprint).
CUDA_REPO_KEYS: dict[str, tuple[str, str]] = {
    "debian12": ("3bf863cc", "EB693B3035CD5710E231E123A4B469963BF863CC"),
    "debian13": ("8793F200", "02182E60104FCDC26EAE1B8597A5D4CB8793F200"),
    "ubuntu2204": ("3bf863cc", "EB693B3035CD5710E231E123A4B469963BF863CC"),
    "ubuntu2404": ("3bf863cc", "EB693B3035CD5710E231E123A4B469963BF863CC"),
}
_DEFAULT_CUDA_REPO_KEY = CUDA_REPO_KEYS["debian12"]

# What nvidia-smi appends to a card's name that the box and the inventory leave out.
_NAME_SUFFIXES_RE = re.compile(r"\s+(with max-q design|max-q|laptop gpu|oem)$", re.IGNORECASE)
_PCI_DEVICE_ID_RE = re.compile(r"^(?:0x)?([0-9a-f]{4})(?:10de)?$", re.IGNORECASE)


def compute_capability(value: Any) -> tuple[int, int] | None:
    """'7.5' -> (7, 5); None when the value is not MAJOR.MINOR."""
    match = re.fullmatch(r"([0-9]+)\.([0-9]+)", str(value).strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def is_data_center_gpu(name: str) -> bool:
    """Tesla, A100, H200, L4…: the cards branch 535's open module supports without the opt-in."""
    text = str(name)
    return bool(_DATA_CENTER_RE.search(text)) and not _WORKSTATION_OR_CONSUMER_RE.search(text)


def open_modules_problem(branch: Any, gpu_name: Any, capability: Any) -> str | None:
    """Why the open kernel modules of `branch` would not drive this GPU, or None when they would (or when the
    GPU is not named yet: the capability alone is checked then)."""
    cc = compute_capability(capability)
    if cc is not None and cc < OPEN_MODULES_MIN_COMPUTE_CAPABILITY:
        return (
            f"the open kernel modules need Turing (compute capability 7.5) or newer; this GPU is {capability}: "
            "set nvidia_driver_kernel_modules: proprietary"
        )
    try:
        branch_number = int(str(branch))
    except ValueError:
        return None
    if gpu_name and branch_number < OPEN_MODULES_GEFORCE_MIN_BRANCH and not is_data_center_gpu(str(gpu_name)):
        return (
            f"branch {branch}'s open kernel module refuses the {gpu_name} "
            f'("Open nvidia.ko is only ready for use on Data Center GPUs"; GeForce support starts at '
            f"{OPEN_MODULES_GEFORCE_MIN_BRANCH}): set nvidia_driver_kernel_modules: proprietary, or a branch >= "
            f"{OPEN_MODULES_GEFORCE_MIN_BRANCH}"
        )
    return None


def driver_version_problem(source: Any, branch: Any, version: Any) -> str | None:
    """Why nvidia_driver_version cannot pin the driver, or None. "" follows the branch: the build installed on the
    rig, else the archive's newest at the first install (Ubuntu's archive keeps only that one); the build is then
    pinned, held and recorded in the lock. NVIDIA's repository keeps every build: there the pin is exact."""
    if version == "":
        if source == "distro":
            return None
        return (
            'expected an exact driver version: "" (follow the branch) is for nvidia_driver_source: distro; '
            "NVIDIA's repository keeps every build, pin one"
        )
    if not isinstance(version, str) or not DRIVER_VERSION_RE.fullmatch(version):
        return 'expected an exact driver version such as 535.309.01, or "" to follow the branch (distro packages)'
    if isinstance(branch, str) and not is_of_branch(version, branch):
        return f"expected a version of nvidia_driver_branch {branch} ({branch}.x.y); change one of the two"
    return None


def is_of_branch(version: str, branch: Any) -> bool:
    """'535.309.01' is of branch 535: the branch is the version's first field."""
    return version.split(".")[0] == str(branch)


def upstream_version(package_version: str) -> str:
    """'1:580.95.05-0ubuntu0.24.04.2' -> '580.95.05': the driver's own version, without epoch and revision."""
    return package_version.split(":", 1)[-1].rsplit("-", 1)[0]


def branch_build(policy: str, branch: str, package: str) -> str:
    """The upstream version to pin when following ``branch``, from ``apt-cache policy PACKAGE``: the build installed
    here when it is of the branch (a rig never moves on its own), else the archive's candidate. ValueError names
    what is missing."""
    lines = dict(_POLICY_LINE_RE.findall(policy))
    for field in ("Installed", "Candidate"):
        value = lines.get(field, "(none)")
        if value != "(none)" and is_of_branch(upstream_version(value), branch):
            return upstream_version(value)
    raise ValueError(
        f"apt has no build of NVIDIA branch {branch} for {package} (installed {lines.get('Installed', '(none)')}, "
        f"candidate {lines.get('Candidate', '(none)')}): check the rig's apt sources (Ubuntu: restricted enabled), "
        "or set an exact nvidia_driver_version"
    )


def normalise_gpu_name(name: Any) -> str:
    """'NVIDIA GeForce GTX 1650 Ti with Max-Q Design' -> 'geforce gtx 1650 ti' (what the inventory names)."""
    text = " ".join(str(name or "").split()).lower()
    text = re.sub(r"^nvidia\s+", "", text)
    previous = None
    while previous != text:
        previous, text = text, _NAME_SUFFIXES_RE.sub("", text)
    return text


def pci_device_id(value: Any) -> str | None:
    """'0x1F9510DE' (nvidia-smi's pci.device_id), '0x1f95' or '1f95' (lspci) -> '1f95'; None if not an id."""
    match = _PCI_DEVICE_ID_RE.fullmatch(str(value or "").strip())
    return match.group(1).lower() if match else None


def gpu_identity_problem(expected: Mapping[str, Any], reported: Mapping[str, Any]) -> str | None:
    """Does the GPU nvidia-smi reports match the rig's rig_gpu? By PCI device id when the inventory has one,
    else by the normalised name (nvidia-smi's suffixes such as "with Max-Q Design" ignored)."""
    want_id = pci_device_id(expected.get("pci_device_id")) if expected.get("pci_device_id") else None
    if want_id:
        got_id = pci_device_id(reported.get("pci_device_id"))
        if got_id != want_id:
            return (
                f"PCI device id {got_id or reported.get('pci_device_id')!r}, expected {want_id} (rig_gpu.pci_device_id)"
            )
        return None
    if expected.get("name"):
        want, got = normalise_gpu_name(expected["name"]), normalise_gpu_name(reported.get("name"))
        if want != got:
            return f"GPU {reported.get('name')!r}, expected {expected['name']!r} (rig_gpu.name)"
    return None


def cuda_repo_key(dist: str) -> dict[str, Any]:
    """NVIDIA's CUDA repository key for a repository dist (debian12, debian13, ubuntu2404…)."""
    key_id, fingerprint = CUDA_REPO_KEYS.get(dist, _DEFAULT_CUDA_REPO_KEY)
    return {"id": key_id, "fingerprints": [fingerprint]}
