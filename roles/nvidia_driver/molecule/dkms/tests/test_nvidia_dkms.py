"""Verify the kernel side of nvidia_driver after real kernel updates (Debian 12 with an installer's sources: the
proprietary 535.309.01 module built for every kernel, bookworm-security's newest included; not loaded)."""

from __future__ import annotations

import re

import pytest

DRIVER = "535.309.01"
HOOK_DIRS = ("postinst.d", "header_postinst.d", "postrm.d")
HOOK = "zz-rigkit-nvidia-driver"


@pytest.fixture(scope="module")
def scenario(host) -> dict:
    return host.ansible.get_variables()


def kernels(scenario: dict) -> list[str]:
    return [
        scenario["dkms_scenario_old_kernel"],
        scenario["dkms_scenario_new_kernel"],
        scenario["dkms_scenario_newest_kernel"],
    ]


def module_files(host, kernel: str) -> list[str]:
    found = host.check_output(f"find /lib/modules/{kernel}/updates/dkms -name 'nvidia-current*.ko*'")
    return found.split()


def test_both_kernels_are_installed(host, scenario):
    for kernel in kernels(scenario):
        assert host.file(f"/boot/vmlinuz-{kernel}").exists, kernel
        assert host.file(f"/lib/modules/{kernel}/build/Makefile").exists, f"headers of {kernel}"


def test_every_kernel_has_the_pinned_module(host, scenario):
    for kernel in kernels(scenario):
        files = module_files(host, kernel)
        assert any(path.endswith("/nvidia-current.ko") for path in files), (kernel, files)
        assert not any("nvidia-current-open" in path for path in files), (kernel, files)
        for path in files:
            assert host.check_output(f"modinfo -F version {path}") == DRIVER, path


def hex_id(text: str) -> str:
    return re.sub(r"[^0-9A-F]", "", text.upper()).lstrip("0")


def test_every_module_is_signed_by_dkms_key(host, scenario):
    """nvidia_driver_secure_boot_signing: true: signed with DKMS's key (/var/lib/dkms/mok.pub), which the role
    made before the driver was installed (tasks/signing-key.yml), by DKMS's own recipe."""
    cert = "openssl x509 -inform DER -in /var/lib/dkms/mok.pub -noout"
    assert host.check_output(f"{cert} -subject -nameopt RFC2253") == "subject=CN=DKMS module signing key"
    # sign-file names the signer by the certificate's serial (or, with -k, its subject key identifier)
    ids = {
        hex_id(host.check_output(f"{cert} -serial").split("=", 1)[1]),
        hex_id(host.check_output(f"{cert} -ext subjectKeyIdentifier | tail -n 1")),
    }
    for kernel in kernels(scenario):
        for path in module_files(host, kernel):
            assert host.check_output(f"modinfo -F signer {path}") == "DKMS module signing key", path
            assert hex_id(host.check_output(f"modinfo -F sig_key {path}")) in ids, path


def test_dkms_status_is_clean_for_both_kernels(host, scenario):
    lines = [line for line in host.check_output("dkms status").splitlines() if "nvidia" in line]
    for kernel in kernels(scenario):
        mine = [line for line in lines if f", {kernel}," in line]
        assert mine, (kernel, lines)
        assert all(line.endswith(": installed") and f"/{DRIVER}," in line for line in mine), mine
    assert all(line.endswith(": installed") for line in lines), lines


def test_the_pinned_driver_came_from_bookworm_security(host):
    for name in ("nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "firmware-nvidia-gsp"):
        package = host.package(name)
        assert package.is_installed and package.version.startswith(f"{DRIVER}-"), (name, package.version)
    assert not host.package("nvidia-open-kernel-dkms").is_installed


def test_headers_follow_the_kernel_flavour(host, scenario):
    image = host.package("linux-image-amd64")
    headers = host.package("linux-headers-amd64")
    assert headers.is_installed, "the role installs the headers metapackage of the installed flavour"
    assert headers.version == image.version == scenario["dkms_scenario_new_version"]


def test_bookworm_securitys_newest_kernel_has_the_module(host, scenario):
    newest = scenario["dkms_scenario_newest_kernel"]
    assert host.file(f"/boot/vmlinuz-{newest}").exists
    assert f"nvidia-current/{DRIVER}, {newest}, x86_64: installed" in host.check_output("dkms status")
    # the headers the scenario broke are whole again
    common = newest.removesuffix("-amd64") + "-common"
    assert "rigkit scenario" not in host.file(f"/usr/src/linux-headers-{common}/include/linux/pci.h").content_string


def test_the_guard_runs_after_dkms_in_every_kernel_hook_dir_and_after_dpkg(host):
    guard = host.file("/usr/local/lib/rigkit/nvidia-kernel-guard")
    assert guard.exists and guard.mode == 0o755
    assert "/usr/local/lib/rigkit/nvidia-kernel-guard apt" in host.check_output("apt-config dump DPkg::Post-Invoke")
    for directory in HOOK_DIRS:
        hook = host.file(f"/etc/kernel/{directory}/{HOOK}")
        assert hook.exists and hook.mode == 0o755 and hook.user == "root", directory
        listed = host.check_output(f"run-parts --test /etc/kernel/{directory}").split()
        order = [line.rsplit("/", 1)[-1] for line in listed]
        if "dkms" in order:
            assert order.index("dkms") < order.index(HOOK), (directory, order)


def test_the_guard_said_what_it_kept_and_when_it_let_go(host, scenario):
    old, new, newest = kernels(scenario)
    journal = host.check_output("journalctl -t rigkit-nvidia-driver --no-pager -o cat")
    missing = "has no NVIDIA " + re.escape(DRIVER) + r" module \([^)]*\): boot default kept on"
    kept_old = re.search(rf"kernel {new} {missing} {old}", journal)
    let_new = re.search(rf"kernel {new} has the NVIDIA {DRIVER} module \([^)]*\)", journal)
    kept_new = re.search(rf"kernel {newest} {missing} {new}", journal)
    let_newest = re.search(rf"kernel {newest} has the NVIDIA {DRIVER} module \([^)]*\)", journal)
    assert kept_old and let_new and kept_new and let_newest, journal
    assert kept_old.start() < let_new.start() < kept_new.start() < let_newest.start(), journal


def test_the_last_verdict_is_ok_and_nothing_pins_grub(host, scenario):
    state = dict(
        line.split("=", 1) for line in host.file("/var/lib/rigkit/nvidia-kernel-guard").content_string.splitlines()
    )
    assert state["verdict"] == "ok" and state["newest"] == scenario["dkms_scenario_newest_kernel"], state
    assert not host.file("/etc/default/grub.d/zz-rigkit-nvidia-driver.cfg").exists


def test_the_module_packages_are_held(host):
    assert host.check_output("dpkg-query -W -f='${db:Status-Want}' nvidia-kernel-dkms") == "hold"


def test_dkms_found_the_key_the_role_made_before_the_driver_came(host):
    """The key is older than the driver's DKMS package: DKMS, which makes one on a first signed build without it,
    signed with the role's (whose certificate the owner can enrol before the first reboot)."""
    made = int(host.check_output("stat -c %Y /var/lib/dkms/mok.pub"))
    installed = int(host.check_output("stat -c %Y /var/lib/dpkg/info/nvidia-kernel-dkms.list"))
    assert made < installed, (made, installed)
    assert host.file("/var/lib/dkms/mok.key").mode == 0o600
