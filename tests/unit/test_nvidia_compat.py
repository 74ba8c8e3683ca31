"""module_utils/nvidia_compat.py: which driver, module flavour, GPU and repository key go together."""

from __future__ import annotations

import pytest
import yaml
from ansible.module_utils.nvidia_compat import (
    CUDA_REPO_KEYS,
    DRIVER_PINS,
    branch_build,
    cuda_repo_key,
    driver_version_problem,
    gpu_identity_problem,
    normalise_gpu_name,
    open_modules_problem,
    pci_device_id,
)

from tests.support import REPO


@pytest.mark.parametrize(
    ("branch", "name", "cc", "refused"),
    [
        ("535", "NVIDIA GeForce GTX 1650 Ti", "7.5", "open kernel module refuses"),
        ("535", "NVIDIA GeForce RTX 3050 OEM", "8.6", "open kernel module refuses"),
        ("550", "NVIDIA RTX A4000", "8.6", None),  # 550 >= 545: GeForce and workstation cards supported
        ("535", "NVIDIA RTX A4000", "8.6", "open kernel module refuses"),
        ("535", "NVIDIA H200", "9.0", None),
        ("535", "NVIDIA A100-SXM4-40GB", "8.0", None),
        ("535", "Tesla T4", "7.5", None),
        ("580", "NVIDIA GeForce RTX 4090", "8.9", None),
        ("580", "NVIDIA GeForce GTX 1080", "6.1", "need Turing"),
        ("535", None, "7.5", None),  # no GPU named yet: only the capability can be judged
    ],
)
def test_open_modules_rule(branch, name, cc, refused):
    problem = open_modules_problem(branch, name, cc)
    if refused is None:
        assert problem is None
    else:
        assert problem is not None and refused in problem and "nvidia_driver_kernel_modules: proprietary" in problem


@pytest.mark.parametrize(
    ("reported", "inventory"),
    [
        ("NVIDIA GeForce GTX 1650 Ti with Max-Q Design", "NVIDIA GeForce GTX 1650 Ti"),
        ("NVIDIA GeForce RTX 3050 OEM", "NVIDIA GeForce RTX 3050"),
        ("NVIDIA GeForce RTX 3050 Laptop GPU", "NVIDIA GeForce RTX 3050"),
        ("NVIDIA  GeForce  RTX 3060", "nvidia geforce rtx 3060"),
    ],
)
def test_names_match_after_normalising_nvidia_smis_suffixes(reported, inventory):
    assert normalise_gpu_name(reported) == normalise_gpu_name(inventory)
    assert gpu_identity_problem({"name": inventory}, {"name": reported}) is None


def test_a_different_card_is_named_as_the_mismatch():
    problem = gpu_identity_problem({"name": "NVIDIA GeForce GTX 1650 Ti"}, {"name": "NVIDIA GeForce GTX 1650"})
    assert problem is not None and "rig_gpu.name" in problem and "GTX 1650'" in problem


def test_the_pci_device_id_decides_when_the_inventory_has_one():
    # nvidia-smi prints pci.device_id as device + vendor (0x1F9510DE); lspci as 1f95 (vendor 10de apart)
    assert pci_device_id("0x1F9510DE") == pci_device_id("1f95") == pci_device_id("0x1f95") == "1f95"
    assert pci_device_id("RTX") is None
    expected = {"name": "some other name", "pci_device_id": "0x1f95"}
    assert gpu_identity_problem(expected, {"name": "NVIDIA GeForce GTX 1650 Ti", "pci_device_id": "0x1F9510DE"}) is None
    problem = gpu_identity_problem(expected, {"name": "x", "pci_device_id": "0x250410DE"})
    assert problem is not None and "2504" in problem and "rig_gpu.pci_device_id" in problem


def test_each_cuda_tree_has_its_own_key():
    assert cuda_repo_key("debian13") == {"id": "8793F200", "fingerprints": ["02182E60104FCDC26EAE1B8597A5D4CB8793F200"]}
    assert cuda_repo_key("debian12")["id"] == "3bf863cc"
    assert set(CUDA_REPO_KEYS) == {"debian12", "debian13", "ubuntu2204", "ubuntu2404"}


def test_the_seed_rigs_and_the_role_defaults_use_debian_12s_pin():
    """One pin, written in four places a person reads (role defaults, host_vars, group_vars), equal to the table."""
    pin = DRIVER_PINS[("debian", "12")]
    defaults = yaml.safe_load((REPO / "roles/nvidia_driver/defaults/main.yml").read_text())
    assert (defaults["nvidia_driver_branch"], defaults["nvidia_driver_version"]) == (pin.branch, pin.version)
    assert defaults["nvidia_driver_kernel_modules"] == pin.kernel_modules
    group = yaml.safe_load((REPO / "inventory/group_vars/gpu_rigs.yml").read_text())
    assert group["nvidia_driver_kernel_modules"] == pin.kernel_modules
    for rig in ("desktop3050", "laptop1650ti"):
        host = yaml.safe_load((REPO / f"inventory/host_vars/{rig}.yml").read_text())
        assert (host["nvidia_driver_branch"], host["nvidia_driver_version"]) == (pin.branch, pin.version), rig
        assert open_modules_problem(pin.branch, host["rig_gpu"]["name"], host["rig_gpu"]["compute_capability"])


def test_every_pin_is_buildable_with_its_flavour():
    """Debian's open 535/550 modules do not build for today's security kernels; Ubuntu's 580 open ones do."""
    assert {key: pin.kernel_modules for key, pin in DRIVER_PINS.items()} == {
        ("debian", "12"): "proprietary",
        ("debian", "13"): "proprietary",
        ("ubuntu", "22.04"): "open",
        ("ubuntu", "24.04"): "open",
    }
    for (os_id, _), pin in DRIVER_PINS.items():
        # Debian pins an exact build (proven by the DKMS receipts); Ubuntu keeps only a branch's newest: the branch
        assert pin.version.split(".")[0] == pin.branch if os_id == "debian" else pin.version == ""
        assert driver_version_problem("distro", pin.branch, pin.version) is None


@pytest.mark.parametrize(
    ("source", "branch", "version", "expected"),
    [
        ("distro", "580", "", None),
        ("nvidia", "580", "", "is for nvidia_driver_source: distro"),
        ("distro", "535", "535.309.01", None),
        ("distro", "535", "550.163.01", "expected a version of nvidia_driver_branch 535"),
        ("distro", "535", "latest", "expected an exact driver version"),
        ("distro", "535", "535.309.01\n", "expected an exact driver version"),
        ("nvidia", "590", 590, "expected an exact driver version"),
    ],
)
def test_the_driver_version_rule(source, branch, version, expected):
    problem = driver_version_problem(source, branch, version)
    assert problem is None if expected is None else expected in problem


# `apt-cache policy` as apt 2.x prints it (the Installed/Candidate lines are what the role reads).
UBUNTU_POLICY = """nvidia-headless-580-server-open:
  Installed: {installed}
  Candidate: 580.105.08-0ubuntu0.24.04.1
  Version table:
     580.105.08-0ubuntu0.24.04.1 500
        500 http://archive.ubuntu.com/ubuntu noble-updates/restricted amd64 Packages
"""


def test_a_followed_branch_keeps_the_build_installed_on_the_rig():
    policy = UBUNTU_POLICY.format(installed="580.95.05-0ubuntu0.24.04.2")
    assert branch_build(policy, "580", "nvidia-headless-580-server-open") == "580.95.05"


def test_a_followed_branch_takes_the_archives_newest_on_a_new_rig():
    policy = UBUNTU_POLICY.format(installed="(none)")
    assert branch_build(policy, "580", "nvidia-headless-580-server-open") == "580.105.08"
    # Debian's revision and an epoch are not part of the driver's version
    debian = "nvidia-smi:\n  Installed: (none)\n  Candidate: 1:535.309.01-0+deb12u1\n"
    assert branch_build(debian, "535", "nvidia-smi") == "535.309.01"


def test_a_branch_apt_does_not_have_is_named_with_what_apt_said():
    with pytest.raises(ValueError) as caught:
        branch_build("nvidia-smi:\n  Installed: (none)\n  Candidate: (none)\n", "580", "nvidia-smi")
    assert "no build of NVIDIA branch 580 for nvidia-smi (installed (none), candidate (none))" in str(caught.value)
    # another branch's build is not this branch's
    with pytest.raises(ValueError):
        branch_build("x:\n  Installed: 550.163.01-2\n  Candidate: 550.163.01-2\n", "580", "x")
