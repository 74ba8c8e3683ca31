#!/usr/bin/python
"""Ansible module: the pinned NVIDIA kernel module built for every installed kernel, before any reboot."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_kernel_modules
short_description: Make sure every installed kernel has the NVIDIA module of the pinned driver version
description:
  - Reads every kernel image under O(boot_dir) (C(vmlinuz-*)), not only the running kernel, and for each one
    whether its headers are installed and whether the NVIDIA module of O(version) is installed for it (DKMS puts
    it under C(/lib/modules/KERNEL/updates/dkms/); Debian names it C(nvidia-current), C(nvidia-current-open) for
    the open modules).
  - Builds the module with C(dkms install -m NAME -v VERSION -k KERNEL) for each kernel that lacks it, so the next
    boot, into whichever kernel, finds the driver.
  - Installs the headers (C(linux-headers-KERNEL)) of every kernel that lacks them and the module, where an
    enabled apt source carries them (O(install_headers)); refuses before building anything when a kernel's
    headers cannot be had (naming the kernel and the package), and fails with the DKMS log's error lines when a
    build fails.
  - With O(require_signed=true) (Secure Boot), every module must be signed by DKMS's key (C(modinfo -F signer) and
    C(sig_key) against the certificate DKMS signs with, C(/var/lib/dkms/mok.pub) by default); a module that is
    not is built again (signed), and the run fails when it still is not.
attributes:
  check_mode:
    support: full
    details: Reports which kernels would get the module built (C(changed)); builds nothing.
  diff_mode:
    support: none
options:
  version:
    description: The driver's version the role pins (nvidia_driver_version or the branch's build).
    type: str
    required: true
  require_signed:
    description: Every module must be signed by DKMS's key (Secure Boot with that key enrolled).
    type: bool
    default: false
  boot_dir:
    description: Where the kernel images are.
    type: path
    default: /boot
  modules_dir:
    description: Where each kernel's modules and its C(build) link to the headers are.
    type: path
    default: /lib/modules
  build_timeout:
    description: Seconds one DKMS build may take.
    type: int
    default: 1800
  install_headers:
    description: Install the missing headers of installed kernels from apt where a source carries them.
    type: bool
    default: true
seealso:
  - name: DKMS
    description: Dynamic Kernel Module Support, which builds the driver's module for each kernel.
    link: https://github.com/dell/dkms
author: rigkit
"""

EXAMPLES = r"""
- name: Build the NVIDIA module for every installed kernel
  nvidia_kernel_modules:
    version: "535.261.03"
    require_signed: "{{ nvidia_driver_secure_boot_signing }}"
  register: kernels
"""

RETURN = r"""
kernels:
  description: Every installed kernel, oldest first.
  returned: always
  type: list
  elements: dict
  contains:
    release:
      description: The kernel release (as C(uname -r) prints it).
      type: str
      sample: 6.1.0-57-amd64
    running:
      description: Whether the rig runs this kernel now.
      type: bool
    newest:
      description: Whether this is the newest installed kernel (the one a default boot starts).
      type: bool
    headers:
      description: Whether its headers are installed.
      type: bool
    headers_package:
      description: The package with its headers.
      type: str
      sample: linux-headers-6.1.0-57-amd64
    has_module:
      description: Whether the NVIDIA module of O(version) is installed for it.
      type: bool
    module:
      description: The module file.
      type: str
      sample: /lib/modules/6.1.0-57-amd64/updates/dkms/nvidia-current.ko.xz
    signer:
      description: The module's signer (empty when unsigned).
      type: str
      sample: DKMS module signing key
    srcversion:
      description: The module's source hash; the loaded module's C(/sys/module/nvidia/srcversion) names its file.
      type: str
    signed:
      description: Whether DKMS's certificate signed it (null unless O(require_signed)).
      type: bool
    built_now:
      description: Whether this run built it.
      type: bool
running:
  description: The running kernel.
  returned: always
  type: str
  sample: 6.1.0-50-amd64
newest:
  description: The newest installed kernel.
  returned: always
  type: str
  sample: 6.1.0-57-amd64
built:
  description: The kernels this run built the module for (would build, in check mode).
  returned: always
  type: list
  elements: str
  sample: [6.1.0-57-amd64]
headers_installed:
  description: The headers packages this run installed (would install, in check mode).
  returned: always
  type: list
  elements: str
  sample: [linux-headers-6.1.0-50-amd64]
certificate:
  description: The certificate DKMS signs with (null unless O(require_signed), or when DKMS has none yet).
  returned: always
  type: str
  sample: /var/lib/dkms/mok.pub
dkms_name:
  description: The DKMS name of the driver's module source.
  returned: always
  type: str
  sample: nvidia-current-open
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.nvidia_kernels import (
    KernelModuleError,
    ensure_modules,
    install_missing_headers,
    survey,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "version": {"type": "str", "required": True},
            "require_signed": {"type": "bool", "default": False},
            "boot_dir": {"type": "path", "default": "/boot"},
            "modules_dir": {"type": "path", "default": "/lib/modules"},
            "build_timeout": {"type": "int", "default": 1800},
            "install_headers": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    params = module.params
    headers: list[str] = []
    apt_failure = ""
    if params["install_headers"]:
        headers, apt_failure = install_missing_headers(
            params["version"],
            boot_dir=params["boot_dir"],
            modules_dir=params["modules_dir"],
            install=not module.check_mode,
        )
    try:
        if module.check_mode and headers:
            # the headers would come first: report what a converge would build, without refusing
            found = survey(params["version"], boot_dir=params["boot_dir"], modules_dir=params["modules_dir"])
            built = [kernel["release"] for kernel in found["kernels"] if not kernel["has_module"]]
            module.exit_json(
                changed=True,
                kernels=found["kernels"],
                running=found["running"],
                newest=found["newest"],
                built=built,
                headers_installed=headers,
                dkms_name=None,
                certificate=None,
            )
        result = ensure_modules(
            params["version"],
            build=not module.check_mode,
            require_signed=params["require_signed"],
            boot_dir=params["boot_dir"],
            modules_dir=params["modules_dir"],
            build_timeout=float(params["build_timeout"]),
        )
    except KernelModuleError as exc:
        module.fail_json(
            msg=str(exc) + (f" (apt, installing {' '.join(headers)}: {apt_failure})" if apt_failure else "")
        )
    report = {**result.as_dict(), "headers_installed": headers}
    if module.check_mode:
        report["built"] = [state.release for state in result.kernels if not state.has_module]
    module.exit_json(changed=bool(report["built"] or headers), **report)


if __name__ == "__main__":
    main()
