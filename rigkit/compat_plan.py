"""A GPU rig's compatibility plan on the controller: image CUDA → driver, GPU → driver branch and module flavour,
pinned driver → the kernels its DKMS module is known to build for. Refusals for the validation play
(``compat_problems``) and the lines ``make plan host=NAME`` prints (``plan_lines``); the rules themselves live in
module_utils/cuda_compat.py and module_utils/nvidia_compat.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ansible.module_utils.cuda_compat import (
    arch_problem,
    branch_problem,
    cuda_version_of_image,
    driver_problem,
    flavour_problem,
    min_driver,
    shown_cuda,
)
from ansible.module_utils.nvidia_compat import compute_capability, open_modules_problem

from rigkit import REPO, proofs

IMAGE_BASE = "llamacpp_image_runtime_base"
_DKMS_LINE_RE = re.compile(r"^nvidia(?:-current)?(?:-open)?/(?P<driver>[0-9.]+), (?P<kernel>[^,\s]+), \S+: installed$")


@dataclass(frozen=True)
class RigCompat:
    """What the plan is computed from: the rig's GPU and driver pins, and the image's CUDA runtime."""

    gpu_name: str
    capability_text: str
    capability: tuple[int, int] | None
    branch: str
    version: str
    modules: str
    image: str
    cuda: tuple[int, int, int] | None
    builds_cuda: bool

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> RigCompat:
        rig_gpu = values.get("rig_gpu") if isinstance(values.get("rig_gpu"), Mapping) else {}
        image = str(values.get(IMAGE_BASE) or "")
        builds = values.get("llamacpp_image_cuda", True)
        return cls(
            gpu_name=str(rig_gpu.get("name") or "the GPU"),
            capability_text=str(rig_gpu.get("compute_capability") or ""),
            capability=compute_capability(rig_gpu.get("compute_capability")),
            branch=str(values.get("nvidia_driver_branch") or ""),
            version=str(values.get("nvidia_driver_version") or ""),
            modules=str(values.get("nvidia_driver_kernel_modules") or ""),
            image=image,
            cuda=cuda_version_of_image(image),
            builds_cuda=builds is True or str(builds).lower() in ("true", "yes", "1"),
        )


# The roles whose defaults the rules read when the inventory does not set them.
ROLES = ("nvidia_driver", "llamacpp_image")


def _modules_problem(rig: RigCompat) -> str | None:
    """The module flavour against the GPU: Blackwell needs open; open needs Turing, and 545 on GeForce."""
    assert rig.capability is not None
    if why := flavour_problem(rig.modules, rig.capability):
        return f"{why}: set nvidia_driver_kernel_modules: open"
    if rig.modules == "open":
        return open_modules_problem(rig.branch, rig.gpu_name, rig.capability_text)
    return None


def compat_findings(values: Mapping[str, Any]) -> list[tuple[str, Any, str]]:
    """(variable, value, why and what to do) for every combination the rig's driver, GPU and image cannot run.
    ``values``: the rig's variables over the defaults of ROLES."""
    if values.get("rig_kind") != "gpu":
        return []
    rig = RigCompat.of(values)
    found: list[tuple[str, Any, str]] = []
    if rig.capability is not None:
        if why := branch_problem(rig.branch, rig.capability):
            found.append(("nvidia_driver_branch", rig.branch, why))
        if why := _modules_problem(rig):
            found.append(("nvidia_driver_kernel_modules", rig.modules, why))
        if rig.cuda is not None and rig.builds_cuda and (why := arch_problem(rig.cuda, rig.capability)):
            found.append((IMAGE_BASE, rig.image, f"{rig.gpu_name}: {why}"))
    if rig.cuda is not None and rig.builds_cuda and (why := driver_problem(rig.cuda, rig.branch, rig.version)):
        variable = "nvidia_driver_version" if rig.version else "nvidia_driver_branch"
        found.append((variable, rig.version or rig.branch, f"{why}: pin a newer driver, or an older CUDA base image"))
    return found


def known_good_kernels(root: Path = REPO) -> dict[str, dict[str, Any]]:
    """{driver version: {"kernels": [...], "receipt": path, "valid": bool}} from the DKMS proofs' receipts."""
    found: dict[str, dict[str, Any]] = {}
    for item in proofs.PROOFS:
        path = root / "reports" / "proofs" / f"{item.name}.json"
        if "dkms" not in item.name or not path.is_file():
            continue
        try:
            receipt = json.loads(path.read_text())
        except ValueError:
            continue
        valid = proofs.receipt_problem(item, root) is None
        for line in receipt.get("decisive_lines", []):
            match = _DKMS_LINE_RE.match(str(line))
            if match:
                entry = found.setdefault(
                    match["driver"],
                    {"kernels": [], "receipt": str(path.relative_to(root)), "valid": valid, "target": item.make_target},
                )
                entry["kernels"].append(match["kernel"])
    return found


def _verdict(problem: str | None) -> str:
    return f"refused: {problem}" if problem else "ok"


def plan_lines(host: str, values: Mapping[str, Any], root: Path = REPO) -> list[str]:
    """What `make plan host=NAME` prints: every pairing of the rig's pins, with its verdict."""
    rig = RigCompat.of(values)
    if values.get("rig_kind") != "gpu":
        return [f"{host}: a {values.get('rig_kind') or 'sandbox'} rig (CPU): no driver, CUDA or kernel module to plan"]
    shown_cc = f"{rig.capability[0]}.{rig.capability[1]}" if rig.capability else "unknown"
    lines = [f"{host}: {rig.gpu_name}, compute capability {shown_cc}"]
    if rig.cuda is not None:
        needed = min_driver(rig.cuda)
        verdict = _verdict(driver_problem(rig.cuda, rig.branch, rig.version))
        lines.append(
            f"  image     CUDA {shown_cuda(rig.cuda)} runtime ({rig.image.split('@')[0]}): needs driver "
            f"{needed or 'unknown'} or newer -> {verdict}"
        )
        if rig.capability is not None:
            lines.append(f"  compile   for {shown_cc}: {_verdict(arch_problem(rig.cuda, rig.capability))}")
    elif rig.builds_cuda:
        lines.append(f"  image     {rig.image or '(no base image)'}: not an nvidia/cuda image, its CUDA is unknown")
    pinned = rig.version or f"branch {rig.branch} (newest build)"
    lines.append(f"  driver    {pinned}, {rig.modules or 'default'} kernel modules")
    if rig.capability is not None:
        lines.append(f"  branch    for {shown_cc}: {_verdict(branch_problem(rig.branch, rig.capability))}")
        lines.append(f"  modules   {rig.modules or 'default'}: {_verdict(_modules_problem(rig))}")
    kernels = known_good_kernels(root).get(rig.version)
    if kernels is None:
        lines.append(f"  kernels   no DKMS proof for {rig.version or rig.branch} yet (make proofs)")
    else:
        state = "" if kernels["valid"] else f" (receipt stale: make {kernels['target']})"
        lines.append(
            f"  kernels   DKMS built {rig.version} for {', '.join(kernels['kernels'])} ({kernels['receipt']}){state}"
        )
    return lines
