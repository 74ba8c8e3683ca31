"""Verify the nvidia_driver role inside a systemd rig container (Debian 12, no GPU: userspace packages)."""

from __future__ import annotations

import pytest

VERSION = "535.261.03"
PACKAGES = ["nvidia-smi", "libcuda1", "libnvidia-ml1"]


@pytest.mark.parametrize("name", PACKAGES)
def test_driver_packages_installed_at_the_pin_and_held(host, name):
    package = host.package(name)
    assert package.is_installed
    assert package.version.startswith(f"{VERSION}-")
    assert host.check_output(f"dpkg-query -W -f='${{db:Status-Want}}' {name}") == "hold"


def test_no_kernel_build_in_a_container(host):
    # The container path installs userspace only: no DKMS module package, no kernel headers.
    for name in ("nvidia-kernel-dkms", "nvidia-open-kernel-dkms", "dkms"):
        assert not host.package(name).is_installed, name


def test_nonfree_sources_signed(host):
    sources = host.file("/etc/apt/sources.list.d/debian-nonfree.sources")
    assert sources.exists
    fields = dict(line.split(": ", 1) for line in sources.content_string.splitlines() if ": " in line)
    assert fields["URIs"] == "http://deb.debian.org/debian"
    assert fields["Suites"].split() == ["bookworm", "bookworm-updates"]
    assert fields["Components"].split() == ["contrib", "non-free", "non-free-firmware"]
    assert fields["Signed-By"] == "/usr/share/keyrings/debian-archive-keyring.gpg"
    # The distro source fetches no NVIDIA key and writes no NVIDIA repository.
    assert not host.file("/etc/apt/keyrings/nvidia-cuda.asc").exists
    assert not host.file("/etc/apt/sources.list.d/nvidia-cuda.sources").exists


def test_nouveau_blacklisted(host):
    conf = host.file("/etc/modprobe.d/rigkit-blacklist-nouveau.conf").content_string.splitlines()
    assert "blacklist nouveau" in conf
    assert "options nouveau modeset=0" in conf


def test_unattended_upgrades_blacklist(host):
    conf = host.file("/etc/apt/apt.conf.d/51rigkit-nvidia-driver").content_string
    assert "Unattended-Upgrade::Package-Blacklist" in conf
    for pattern in ("^nvidia-", "^libnvidia-", "^libcuda1"):
        assert f'"{pattern}";' in conf
    # apt itself parses the drop-in into the list unattended-upgrades reads.
    dump = host.check_output("apt-config dump Unattended-Upgrade::Package-Blacklist")
    assert '"^nvidia-"' in dump


def test_nvidia_smi_binary_installed(host):
    smi = host.file("/usr/bin/nvidia-smi")
    assert smi.exists
    assert smi.mode & 0o111
    # Without a GPU it must fail the way a missing device fails, not because a library is missing.
    result = host.run("nvidia-smi")
    assert result.rc != 0
    assert "error while loading shared libraries" not in result.stderr


def test_container_is_seen_as_no_hardware(host):
    facts = host.ansible("setup", "filter=ansible_virtualization_*")["ansible_facts"]
    assert facts["ansible_virtualization_role"] == "guest"
    assert facts["ansible_virtualization_type"] in ("docker", "container", "podman", "lxc")
