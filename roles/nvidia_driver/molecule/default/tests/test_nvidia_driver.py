"""Verify the nvidia_driver role inside a systemd rig container (Debian 12 with an installer's apt sources, no
GPU: userspace packages), and that the full install plans of both rigs resolve to exactly the pin."""

from __future__ import annotations

import re

import pytest

VERSION = "535.309.01"
PACKAGES = ["nvidia-smi", "libcuda1", "libnvidia-ml1"]
# What a desktop and a laptop rig install (the role's package sets, proprietary modules), and the dependencies
# that must follow the pin rather than their own candidates.
PLANS = {
    "desktop": ["nvidia-driver", "nvidia-kernel-dkms"],
    "laptop": ["nvidia-smi", "libcuda1", "nvidia-kernel-dkms"],
}
FOLLOWERS = ["firmware-nvidia-gsp", "nvidia-kernel-support", "libcuda1", "libnvidia-ml1", "nvidia-alternative"]
INST_RE = re.compile(r"^Inst (\S+) (?:\[[^]]*\] )?\((\S+) ", re.MULTILINE)


def simulate(host, *packages: str, extra: str = "") -> tuple[int, dict[str, str], str]:
    result = host.run(f"apt-get -s -q install --no-install-recommends {extra} {' '.join(packages)}")
    return result.rc, dict(INST_RE.findall(result.stdout)), result.stdout + result.stderr


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


def sources_fields(host, name: str) -> dict[str, str]:
    sources = host.file(f"/etc/apt/sources.list.d/{name}.sources")
    assert sources.exists, name
    return dict(line.split(": ", 1) for line in sources.content_string.splitlines() if ": " in line)


def test_nonfree_sources_signed(host):
    fields = sources_fields(host, "debian-nonfree")
    assert fields["URIs"] == "http://deb.debian.org/debian"
    assert fields["Suites"].split() == ["bookworm", "bookworm-updates"]
    # the installer's entries list non-free-firmware already: the kit adds only what they lack
    assert fields["Components"].split() == ["contrib", "non-free"]
    assert fields["Signed-By"] == "/usr/share/keyrings/debian-archive-keyring.gpg"
    security = sources_fields(host, "debian-security-nonfree")
    assert security["URIs"] == "http://deb.debian.org/debian-security"
    assert security["Suites"].split() == ["bookworm-security"]
    assert security["Components"].split() == ["contrib", "non-free", "non-free-firmware"]
    assert security["Signed-By"] == fields["Signed-By"]
    # the installer's own sources stay as they were, and apt accepts both (no conflicting Signed-By)
    assert "bookworm-security main non-free-firmware" in host.file("/etc/apt/sources.list").content_string
    update = host.run("apt-get update")
    assert update.rc == 0 and "W:" not in update.stdout + update.stderr and "E:" not in update.stderr, update
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


def test_apt_preferences_pin_every_driver_package(host):
    prefs = host.file("/etc/apt/preferences.d/rigkit-nvidia-driver.pref").content_string
    assert f"Pin: version {VERSION}-*" in prefs and "Pin-Priority: 1001" in prefs
    policy = host.check_output("apt-cache policy firmware-nvidia-gsp")
    assert re.search(rf"Candidate: {re.escape(VERSION)}-", policy), policy


@pytest.mark.parametrize("rig", sorted(PLANS))
def test_full_install_plan_resolves_to_exactly_the_pin(host, rig):
    """What the role installs on a real rig of this kind, simulated against today's archive with an installer's
    sources: apt resolves it (no "held broken packages") and every driver package is at the pinned version."""
    code, installs, output = simulate(host, *PLANS[rig])
    assert code == 0, output[-3000:]
    for name in PLANS[rig] + [name for name in FOLLOWERS if name in installs]:
        version = installs.get(name) or host.package(name).version
        assert version.startswith(f"{VERSION}-"), (name, version)
    stale = {name: version for name, version in installs.items() if "535.261.03" in version}
    assert not stale, stale


def test_the_old_open_pin_is_what_apt_refuses(host):
    """The pin this replaced: 535.261.03's open module wants firmware-nvidia-gsp (= 535.261.03), which the
    installer-enabled security candidate outranks. Simulated without the kit's preferences file."""
    code, _, output = simulate(
        host, "nvidia-open-kernel-dkms=535.261.03-1", extra="-o Dir::Etc::PreferencesParts=/nonexistent"
    )
    assert code != 0
    assert "firmware-nvidia-gsp" in output and "held broken packages" in output, output[-2000:]
