"""The pure parts of module_utils/nvidia_kernels.py (the real DKMS builds, the kernel hook and the refusal of a
kernel without headers run in roles/nvidia_driver/molecule/dkms), and the status table's kernel column."""

from __future__ import annotations

import pytest
from ansible.module_utils.nvidia_kernels import (
    headers_metapackages,
    make_log_errors,
    version_key,
)

from rigkit.fleet.status import _kernel, render, row


def facts(**versions: str) -> dict:
    """package_facts' shape: name -> [{name, version, ...}]."""
    return {name: [{"name": name, "version": version, "source": "apt"}] for name, version in versions.items()}


def test_debian_flavour_gets_its_headers_at_the_image_version():
    packages = facts(
        **{
            "linux-image-amd64": "6.1.176-1",
            "linux-image-6.1.0-50-amd64": "6.1.176-1",
            "linux-image-6.1.0-50-amd64-dbg": "6.1.176-1",
            "linux-headers-6.1.0-50-amd64": "6.1.176-1",
            "nvidia-open-kernel-dkms": "535.261.03-1",
        }
    )
    assert headers_metapackages(packages) == {"linux-headers-amd64": "6.1.176-1"}


def test_ubuntu_hwe_and_cloud_flavours_each_get_their_twin():
    packages = facts(
        **{
            "linux-image-generic-hwe-24.04": "6.11.0-29.29~24.04.1",
            "linux-image-6.11.0-29-generic": "6.11.0-29.29~24.04.1",
            "linux-image-unsigned-6.11.0-29-generic": "6.11.0-29.29~24.04.1",
            "linux-image-cloud-amd64": "6.1.176-1",
        }
    )
    assert headers_metapackages(packages) == {
        "linux-headers-cloud-amd64": "6.1.176-1",
        "linux-headers-generic-hwe-24.04": "6.11.0-29.29~24.04.1",
    }


def test_a_rig_without_a_flavour_metapackage_needs_none():
    assert headers_metapackages(facts(**{"linux-image-6.1.0-50-amd64": "6.1.176-1"})) == {}
    assert headers_metapackages({"linux-image-amd64": "6.1.176-1"}) == {"linux-headers-amd64": "6.1.176-1"}


def test_kernels_sort_like_grub():
    releases = ["6.1.0-10-amd64", "6.12.33+bpo-amd64", "6.1.0-9-amd64", "6.1.0-57-amd64"]
    expected = ["6.1.0-9-amd64", "6.1.0-10-amd64", "6.1.0-57-amd64", "6.12.33+bpo-amd64"]
    assert sorted(releases, key=version_key) == expected


def test_make_log_errors_keep_the_lines_that_say_why():
    log = "\n".join(
        [
            "make -C /lib/modules/6.1.0-57-amd64/build M=/var/lib/dkms/x/build modules",
            "  CC [M]  nvidia/nv.o",
            "nvidia/nv.c:42:10: fatal error: linux/foo.h: No such file or directory",
            "make[1]: *** [scripts/Makefile.build:250: nvidia/nv.o] Error 1",
        ]
    )
    assert make_log_errors(log) == [
        "nvidia/nv.c:42:10: fatal error: linux/foo.h: No such file or directory",
        "make[1]: *** [scripts/Makefile.build:250: nvidia/nv.o] Error 1",
    ]


def kernels(running: str, newest: str, with_module: set[str]) -> dict:
    releases = sorted({running, newest}, key=version_key)
    return {
        "running": running,
        "newest": newest,
        "kernels": [{"release": r, "has_module": r in with_module} for r in releases],
        "reboot_strands_gpu": newest not in with_module,
    }


def test_status_shows_the_running_kernel_and_the_next_boots():
    assert _kernel(kernels("6.1.0-57-amd64", "6.1.0-57-amd64", {"6.1.0-57-amd64"})) == "6.1.0-57-amd64 nvidia yes"
    both = _kernel(kernels("6.1.0-50-amd64", "6.1.0-57-amd64", {"6.1.0-50-amd64", "6.1.0-57-amd64"}))
    assert both == "6.1.0-50-amd64 nvidia yes -> 6.1.0-57-amd64 nvidia yes"
    assert _kernel(None) == "-"


def test_a_pending_reboot_into_a_kernel_without_the_driver_is_marked():
    stranded = kernels("6.1.0-50-amd64", "6.1.0-57-amd64", {"6.1.0-50-amd64"})
    assert _kernel(stranded) == "6.1.0-50-amd64 nvidia yes -> 6.1.0-57-amd64 nvidia NO !"
    status = {"reachable": True, "expected": {}, "deployed": {"kernels": stranded}}
    table = render([row("desktop3050", status)], wide=True)
    assert "6.1.0-57-amd64 nvidia NO !" in table
    assert "kernel !: the next boot starts a kernel without the NVIDIA module" in table


def test_the_filter_gives_apt_pins():
    from filter_plugins.nvidia_driver import FilterModule

    pins = FilterModule().filters()["nvidia_headers_metapackages"]
    assert pins(facts(**{"linux-image-amd64": "6.1.176-1"})) == ["linux-headers-amd64=6.1.176-1"]


def test_a_module_counts_as_signed_only_by_the_certificates_key():
    from ansible.module_utils.nvidia_kernels import KernelState, signed_by

    def module(signer: str, sig_key: str) -> KernelState:
        return KernelState(
            "6.1.0-50-amd64", False, True, True, "linux-headers-6.1.0-50-amd64", "/m", "x", signer, sig_key
        )

    dkms_key = ("DKMS module signing key", {"1F0A9C", "AB12CD"})  # serial, subject key identifier
    assert signed_by(module("DKMS module signing key", "1F:0A:9C"), dkms_key)
    assert signed_by(module("DKMS module signing key", "00:1f:0a:9c"), dkms_key)  # leading zero, lower case
    assert not signed_by(module("DKMS module signing key", "99:99"), dkms_key)  # same name, another key
    assert not signed_by(module("Debian Secure Boot CA", "1F:0A:9C"), dkms_key)
    assert not signed_by(module("", ""), dkms_key)


def test_make_log_errors_skip_the_compiler_flags():
    log = "\n".join(
        [
            "  gcc-12 -Wp,-MMD -Werror=strict-prototypes -Werror=implicit-int -c -o nv-pci.o nv-pci.c",
            "/var/lib/dkms/nvidia-current-open/535.261.03/build/nvidia/nv-pci.c:223:9: error: too few arguments "
            "to function 'pci_resize_resource'",
            "make[3]: *** [/usr/src/linux-headers-6.1.0-57-common/scripts/Makefile.build:255: nv-pci.o] Error 1",
        ]
    )
    errors = make_log_errors(log)
    assert len(errors) == 2 and "pci_resize_resource" in errors[0] and errors[1].startswith("make[3]: ***")


def test_survey_and_ensure_on_this_machine_s_own_boot(tmp_path):
    """The read-only survey (make status) and the refusal when no kernel is installed, on real directories:
    this machine's /boot (a container host or CI machine may have no kernel there) and an empty one."""
    from ansible.module_utils.nvidia_kernels import KernelModuleError, ensure_modules, survey

    found = survey("535.261.03")
    assert set(found) == {"running", "running_installed", "newest", "kernels", "reboot_strands_gpu"}
    assert found["reboot_strands_gpu"] == (bool(found["kernels"]) and not found["kernels"][-1]["has_module"])
    empty = survey("535.261.03", boot_dir=str(tmp_path))
    assert empty["kernels"] == [] and empty["newest"] == "" and not empty["reboot_strands_gpu"]
    with pytest.raises(KernelModuleError, match=r"no kernel image under .* Install the kernel"):
        ensure_modules("535.261.03", build=False, boot_dir=str(tmp_path))


def test_missing_headers_are_looked_up_in_apt(tmp_path):
    """apt's own answer decides whether a kernel's missing headers can be installed: a package apt carries has a
    candidate, a kernel no source knows has none (and nothing is installed in check mode)."""
    from ansible.module_utils.nvidia_kernels import apt_candidate, install_missing_headers

    assert apt_candidate("bash")  # installed on every Debian machine: its candidate is a version
    assert apt_candidate("linux-headers-9.9.9-rigkit-none") is None
    boot, modules = tmp_path / "boot", tmp_path / "modules"
    boot.mkdir()
    (boot / "vmlinuz-9.9.9-rigkit-none").write_bytes(b"")
    (modules / "9.9.9-rigkit-none").mkdir(parents=True)
    assert install_missing_headers("535.309.01", boot_dir=str(boot), modules_dir=str(modules), install=False) == (
        [],
        "",
    )


def ubuntu_rig(root, kernels: dict[str, str | None]) -> tuple[str, str]:
    """/boot and /lib/modules as an Ubuntu rig lays them out: each kernel's image, and its NVIDIA module where
    ``kernels`` names one (a path under /lib/modules/<kernel>/)."""
    boot, modules = root / "boot", root / "modules"
    boot.mkdir()
    for release, module in kernels.items():
        (boot / f"vmlinuz-{release}").write_text("")
        (modules / release / "kernel").mkdir(parents=True)
        if module:
            (modules / release / module).parent.mkdir(parents=True, exist_ok=True)
            (modules / release / module).write_text("")
    return str(boot), str(modules)


def test_ubuntus_prebuilt_module_of_a_followed_branch_counts(tmp_path):
    """An Ubuntu rig follows a branch (nvidia_driver_version: ""): Canonical's prebuilt module
    (linux-modules-nvidia-580-server-<kernel>, linked under kernel/nvidia-580srv/) or a DKMS one counts, whatever
    its version; the next boot's kernel without one is marked."""
    from ansible.module_utils.nvidia_kernels import module_file, survey

    boot, modules = ubuntu_rig(
        tmp_path,
        {
            "6.8.0-85-generic": "kernel/nvidia-580srv/nvidia.ko",
            "6.8.0-87-generic": "updates/dkms/nvidia.ko.zst",
            "6.8.0-90-generic": None,
        },
    )
    assert module_file("6.8.0-85-generic", modules) == f"{modules}/6.8.0-85-generic/kernel/nvidia-580srv/nvidia.ko"
    assert module_file("6.8.0-90-generic", modules) is None
    found = survey("", boot_dir=boot, modules_dir=modules, running="6.8.0-85-generic")
    assert [(k["release"], k["has_module"]) for k in found["kernels"]] == [
        ("6.8.0-85-generic", True),
        ("6.8.0-87-generic", True),
        ("6.8.0-90-generic", False),
    ]
    assert found["reboot_strands_gpu"] and found["newest"] == "6.8.0-90-generic"
    assert _kernel(found) == "6.8.0-85-generic nvidia yes -> 6.8.0-90-generic nvidia NO !"
    # an exact pin counts only its own version's module (modinfo reads it; these files carry none)
    assert not any(k["has_module"] for k in survey("580.95.05", boot_dir=boot, modules_dir=modules)["kernels"])
