"""Verify the kernel side of nvidia_driver on Debian 13 with modernised (deb822) apt sources: the proprietary
550.163.01 module built and signed for the point release's kernel and trixie-security's newest (not loaded)."""

from __future__ import annotations

import re

import pytest


@pytest.fixture(scope="module")
def scenario(host) -> dict:
    return host.ansible.get_variables()


@pytest.fixture(scope="module")
def driver(scenario) -> str:
    return scenario["nvidia_driver_version"]


def kernels(scenario: dict) -> list[str]:
    return [scenario["dkms_scenario_old_kernel"], scenario["dkms_scenario_newest_kernel"]]


def module_files(host, kernel: str) -> list[str]:
    return host.check_output(f"find /lib/modules/{kernel}/updates/dkms -name 'nvidia-current*.ko*'").split()


def hex_id(text: str) -> str:
    return re.sub(r"[^0-9A-F]", "", text.upper()).lstrip("0")


def test_the_rig_is_debian_13(host):
    assert host.system_info.distribution == "debian" and host.system_info.codename == "trixie"


def test_every_kernel_has_its_headers(host, scenario):
    for kernel in kernels(scenario):
        assert host.file(f"/boot/vmlinuz-{kernel}").exists, kernel
        assert host.file(f"/lib/modules/{kernel}/build/Makefile").exists, f"headers of {kernel}"


def test_the_headers_follow_the_flavour_to_trixie_security(host, scenario):
    image = host.package("linux-image-amd64")
    headers = host.package("linux-headers-amd64")
    assert headers.is_installed, "the role installs the headers metapackage of the installed flavour"
    assert headers.version == image.version == scenario["dkms_scenario_newest_version"]


def test_every_kernel_has_the_pinned_proprietary_module(host, scenario, driver):
    for kernel in kernels(scenario):
        files = module_files(host, kernel)
        assert any(path.endswith("/nvidia-current.ko") or "/nvidia-current.ko." in path for path in files), (
            kernel,
            files,
        )
        assert not any("nvidia-current-open" in path for path in files), (kernel, files)
        for path in files:
            assert host.check_output(f"modinfo -F version {path}") == driver, path


def test_every_module_is_signed_by_dkms_key(host, scenario):
    """nvidia_driver_secure_boot_signing: true: signed with DKMS's key (/var/lib/dkms/mok.pub), which the role
    made before the driver was installed (tasks/signing-key.yml), by DKMS's own recipe."""
    cert = "openssl x509 -inform DER -in /var/lib/dkms/mok.pub -noout"
    ids = {
        hex_id(host.check_output(f"{cert} -serial").split("=", 1)[1]),
        hex_id(host.check_output(f"{cert} -ext subjectKeyIdentifier | tail -n 1")),
    }
    for kernel in kernels(scenario):
        for path in module_files(host, kernel):
            assert hex_id(host.check_output(f"modinfo -F sig_key {path}")) in ids, path


def test_dkms_status_is_installed_for_every_kernel(host, scenario, driver):
    status = host.check_output("dkms status")
    for kernel in kernels(scenario):
        assert f"nvidia-current/{driver}, {kernel}, x86_64: installed" in status, status
    assert all(line.endswith(": installed") for line in status.splitlines() if "nvidia" in line), status


def test_every_driver_package_is_at_the_pin_and_held(host, driver):
    for name in ("nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "firmware-nvidia-gsp"):
        package = host.package(name)
        assert package.is_installed and package.version.startswith(f"{driver}-"), (name, package.version)
    assert not host.package("nvidia-open-kernel-dkms").is_installed
    assert host.check_output("dpkg-query -W -f='${db:Status-Want}' nvidia-kernel-dkms") == "hold"


def test_the_modernised_sources_are_extended_not_contradicted(host):
    """apt modernize-sources named the keyring `.gpg`; the kit's entry names the same one and adds only what the
    rig lacked: apt reads both with no error and no target configured twice."""
    own = host.file("/etc/apt/sources.list.d/debian.sources").content_string
    keyring = next(line.split(": ", 1)[1] for line in own.splitlines() if line.startswith("Signed-By: "))
    kit = host.file("/etc/apt/sources.list.d/debian-nonfree.sources").content_string
    assert kit.startswith("# Managed by rigkit")
    assert f"Signed-By: {keyring}" in kit and "Components: contrib non-free\n" in kit, kit
    update = host.run("apt-get update")
    assert update.rc == 0 and "W:" not in update.stdout + update.stderr and "E:" not in update.stderr, update


def test_the_guard_verdict_is_ok_for_the_newest_kernel(host, scenario):
    state = dict(
        line.split("=", 1) for line in host.file("/var/lib/rigkit/nvidia-kernel-guard").content_string.splitlines()
    )
    assert state["verdict"] == "ok" and state["newest"] == scenario["dkms_scenario_newest_kernel"], state


def test_dkms_found_the_key_the_role_made_before_the_driver_came(host):
    """The key is older than the driver's DKMS package: DKMS, which makes one on a first signed build without it,
    signed with the role's (whose certificate the owner can enrol before the first reboot)."""
    made = int(host.check_output("stat -c %Y /var/lib/dkms/mok.pub"))
    installed = int(host.check_output("stat -c %Y /var/lib/dpkg/info/nvidia-kernel-dkms.list"))
    assert made < installed, (made, installed)
    assert host.file("/var/lib/dkms/mok.key").mode == 0o600
