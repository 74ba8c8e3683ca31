"""`rigkit plan --host NAME` (make plan): the rig's compatibility plan, from the inventory, the repository and
Debian's archive (read on the controller, cached; no rig is contacted): image CUDA and driver, GPU and driver
branch, module flavour, the kernels the pinned driver's DKMS module is known to build for, whether the archive
still carries the pinned packages, and the kernel it would install next. Exit 1 when the validation play would
refuse a combination, when the archive dropped a pin, or when no valid DKMS receipt proves the pinned driver."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import Any

from rigkit.cli.inventory import host_values

NAMES = (
    "rig_kind",
    "rig_gpu",
    "rig_os",
    "nvidia_driver_branch",
    "nvidia_driver_version",
    "nvidia_driver_kernel_modules",
    "llamacpp_image_cuda",
    "llamacpp_image_cuda_architectures",
    "llamacpp_image_cuda_toolchain_packages",
    "llamacpp_image_cuda_runtime_packages",
    "llamacpp_image_debian_suite",
    "llamacpp_image_debian_mirror",
    "llamacpp_image_apt_components",
    "nvidia_driver_source",
    "nvidia_driver_headless",
    "nvidia_driver_debian_mirror",
    "nvidia_driver_debian_security_mirror",
)


def plan_values(host: str) -> dict[str, Any]:
    """What a rig's plan is computed from: the roles' defaults and the inventory's values (LookupError: an unknown
    host)."""
    from rigkit.validation.compat import ROLES
    from rigkit.validation.rules import role_defaults

    kind = host_values(host, ("rig_kind",)).get("rig_kind")
    return {**role_defaults(*ROLES), **host_values(host, NAMES if kind == "gpu" else ("rig_kind",))}


def archive_notes(hosts: Iterable[str]) -> list[str]:
    """`make status`'s notes from the archive, for the GPU rigs among ``hosts``: a pinned driver the archive dropped,
    and a next kernel without a known-good module (the controller's cached indexes; no rig contacted)."""
    from rigkit.validation.compat import archive_report
    from rigkit.validation.debian_archive import Archive

    lookup, notes = Archive().index, []
    for host in sorted(hosts):
        try:
            values = plan_values(host)
        except LookupError:
            continue
        report = archive_report(host, values, lookup)
        notes += [f"{host}: {variable} is {value!r}: {why}" for variable, value, why in report.findings]
        if report.unproven_kernel:
            notes.append(
                f"{host}: the archive's next kernel {report.unproven_kernel} has no known-good NVIDIA module "
                f"(`make plan host={host}`)"
            )
    return notes


def run(args: argparse.Namespace) -> int:
    from rigkit.validation.compat import (
        archive_report,
        compat_findings,
        image_archive_report,
        plan_lines,
        unproven_pin_findings,
    )
    from rigkit.validation.debian_archive import Archive

    try:
        values = plan_values(args.host)
    except LookupError as exc:
        print(f"rigkit plan: {exc}", file=sys.stderr)
        return 2
    read = Archive().index
    archive, packages = archive_report(args.host, values, read), image_archive_report(args.host, values, read)
    print("\n".join([*plan_lines(args.host, values, archive=archive), *packages.lines]))
    refused = [
        *compat_findings(values),
        *unproven_pin_findings(args.host, values),
        *archive.findings,
        *packages.findings,
    ]
    for variable, value, why in refused:
        print(f"rigkit plan: {args.host}: {variable} is {value!r}: {why}", file=sys.stderr)
    return 1 if refused else 0


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("plan", help="a rig's driver / CUDA / GPU / kernel compatibility plan")
    parser.add_argument("--host", required=True)
    parser.set_defaults(func=run)
