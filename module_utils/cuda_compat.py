"""Which CUDA runtime, driver branch and GPU go together (standard library only).

The rules the controller applies before any rig is contacted (rigkit/validation/rules.py) and that `make plan`
prints (rigkit/validation/compat.py): the image's CUDA runtime needs a minimum driver; the CUDA toolkit compiles for a
range of compute capabilities; each driver branch supports a range of GPU generations; Blackwell needs the open
kernel modules; the image carries compiled code (SASS) or PTX per architecture, and a GPU runs an image only through
SASS of its own generation, or through PTX that its driver can JIT. The module flavour's GeForce rule lives beside
the driver pins (module_utils/nvidia_compat.py).
"""

from __future__ import annotations

import re
from typing import Any

# NVIDIA's CUDA Toolkit release notes, table "CUDA Toolkit and Corresponding Driver Versions" (Linux x86_64): the
# driver a runtime needs for everything it offers (minor-version compatibility runs less: no PTX JIT).
CUDA_MIN_DRIVER: dict[tuple[int, int, int], str] = {
    (11, 8, 0): "520.61.05",
    (12, 0, 0): "525.60.13",
    (12, 0, 1): "525.85.12",
    (12, 1, 0): "530.30.02",
    (12, 1, 1): "530.30.02",
    (12, 2, 0): "535.54.03",
    (12, 2, 1): "535.86.10",
    (12, 2, 2): "535.104.05",
    (12, 3, 0): "545.23.06",
    (12, 3, 1): "545.23.08",
    (12, 3, 2): "545.23.08",
    (12, 4, 0): "550.54.14",
    (12, 4, 1): "550.54.15",
    (12, 5, 0): "555.42.02",
    (12, 5, 1): "555.42.06",
    (12, 6, 0): "560.28.03",
    (12, 6, 1): "560.35.03",
    (12, 6, 2): "560.35.03",
    (12, 6, 3): "560.35.05",
    (12, 8, 0): "570.26",
    (12, 8, 1): "570.124.06",
    (12, 9, 0): "575.51.03",
    (12, 9, 1): "575.57.08",
    (13, 0, 0): "580.65.06",
    (13, 0, 1): "580.82.07",
    (13, 0, 2): "580.95.05",
}

# The compute capabilities nvcc of a CUDA release compiles for (its -arch list): (first, last), by release.
CUDA_ARCH_RANGE: tuple[tuple[tuple[int, int], tuple[int, int], tuple[int, int]], ...] = (
    # (from CUDA release, lowest capability, highest capability)
    ((11, 8), (3, 5), (9, 0)),
    ((12, 0), (5, 0), (9, 0)),
    ((12, 8), (5, 0), (12, 0)),
    ((12, 9), (5, 0), (12, 1)),
    ((13, 0), (7, 5), (12, 1)),
)

# The first driver branch that supports a GPU generation (its lowest compute capability), and the last branch
# that still supports the older ones (Kepler ended with 470; Maxwell, Pascal and Volta end with 580).
FIRST_BRANCH: tuple[tuple[tuple[int, int], int, str], ...] = (
    ((12, 0), 570, "Blackwell (GeForce RTX 50)"),
    ((10, 0), 570, "Blackwell"),
    ((9, 0), 525, "Hopper"),
    ((8, 9), 520, "Ada Lovelace"),
    ((8, 6), 455, "Ampere (GA10x)"),
    ((8, 0), 450, "Ampere (A100)"),
    ((7, 5), 418, "Turing"),
    ((5, 0), 340, "Maxwell to Volta"),
)
LAST_BRANCH: tuple[tuple[tuple[int, int], int, str], ...] = (
    ((5, 0), 470, "Kepler"),  # capabilities below 5.0
    ((7, 5), 580, "Maxwell, Pascal and Volta"),  # capabilities below 7.5
)
# Blackwell's GPUs run on the open kernel modules only.
OPEN_MODULES_ONLY_FROM = (10, 0)

# CUDA 12.x and 13.x binaries run on any driver from these on through minor-version compatibility, when they carry
# SASS for the GPU (NVIDIA's "CUDA Compatibility"); PTX needs the driver of the toolkit that produced it.
MINOR_COMPAT_MIN_DRIVER: dict[int, str] = {12: "525.60.13", 13: "580.65.06"}
# An architecture of CMAKE_CUDA_ARCHITECTURES: "86" (SASS and PTX), "86-real" (SASS), "86-virtual" (PTX).
_ARCH_RE = re.compile(r"^([0-9]{2,3})([a-z]?)(-real|-virtual)?$")
# Debian's CUDA package versions: "12.4.127~12.4.1-2" -> the toolkit release after "~".
_PACKAGE_CUDA_RE = re.compile(r"~([0-9]{1,2})\.([0-9]{1,2})\.([0-9]{1,2})-")
_VERSION_RE = re.compile(r"[0-9]{1,4}(?:\.[0-9]{1,4}){0,2}")


def cuda_version_of_package(version: Any) -> tuple[int, int, int] | None:
    """The CUDA release (major, minor, update) of a Debian CUDA package's version: '12.4.127~12.4.1-2' -> (12, 4, 1)."""
    match = _PACKAGE_CUDA_RE.search(str(version or ""))
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def cuda_objects(architectures: Any) -> dict[str, list[str]]:
    """What CMAKE_CUDA_ARCHITECTURES puts into the binary, as cuobjdump names it: {"sass": ["sm_75", "sm_86"],
    "ptx": ["compute_86"]}. ValueError names an entry that is not an architecture."""
    sass: set[str] = set()
    ptx: set[str] = set()
    for entry in [part.strip() for part in str(architectures or "").split(";") if part.strip()]:
        match = _ARCH_RE.fullmatch(entry)
        if not match:
            raise ValueError(f"{entry!r} is not a CUDA architecture such as 86, 86-real or 86-virtual")
        number, kind = match[1] + match[2], match[3]
        if kind != "-virtual":
            sass.add(f"sm_{number}")
        if kind != "-real":
            ptx.add(f"compute_{number}")
    return {"sass": sorted(sass), "ptx": sorted(ptx)}


def _arch_tuple(name: str) -> tuple[int, int]:
    """'sm_86' / 'compute_86' -> (8, 6); 'sm_120' -> (12, 0)."""
    digits = re.sub(r"[^0-9]", "", name.split("_", 1)[1])
    return int(digits[:-1]), int(digits[-1])


def runs_on_gpu_problem(
    objects: dict[str, list[str]],
    capability: tuple[int, int],
    cuda: tuple[int, int, int] | None,
    branch: Any,
    version: Any,
) -> str | None:
    """Why a binary holding ``objects`` (cuda_objects) cannot run on a GPU of ``capability`` under this driver (an
    exact version, or only a branch); None when it can. SASS runs on GPUs of its major generation and a minor at
    least its own; PTX is JIT-compiled by the driver, which must know the toolkit's CUDA (``cuda``)."""
    shown = f"{capability[0]}.{capability[1]}"
    if any(_arch_tuple(name)[0] == capability[0] and _arch_tuple(name) <= capability for name in objects["sass"]):
        return None
    listed = " ".join(objects["sass"]) or "none"
    usable_ptx = [name for name in objects["ptx"] if _arch_tuple(name) <= capability]
    if not usable_ptx:
        return (
            f"the image holds compiled code for {listed} and no PTX a compute capability {shown} GPU can use: add "
            f"{capability[0]}{capability[1]}-real to llamacpp_image_cuda_architectures"
        )
    if cuda is None:
        return None
    needed = min_driver(cuda)
    if needed is None:
        known = ", ".join(shown_cuda(key) for key in CUDA_MIN_DRIVER)
        return (
            f"the image's CUDA {shown_cuda(cuda)} is not in the kit's table of minimum drivers, which PTX needs "
            f"(module_utils/cuda_compat.py CUDA_MIN_DRIVER, from NVIDIA's release notes; known: {known}): add it"
        )
    if _older_than(needed, branch, version):
        return (
            f"a compute capability {shown} GPU would run the image's PTX ({' '.join(usable_ptx)}) only, which the "
            f"driver must JIT-compile, and PTX from CUDA {shown_cuda(cuda)} needs driver {needed} or newer: add "
            f"{capability[0]}{capability[1]}-real to llamacpp_image_cuda_architectures (compiled code runs on "
            f"driver {MINOR_COMPAT_MIN_DRIVER.get(cuda[0], needed)} and newer)"
        )
    return None


def default_architectures(capability: Any) -> str:
    """The image's architectures for a GPU of compute capability '8.6': its compiled code only, "86-real"."""
    text = str(capability or "").strip()
    return f"{text.replace('.', '')}-real" if text else ""


def minor_compat_problem(cuda: tuple[int, int, int], branch: Any, version: Any) -> str | None:
    """Why this driver cannot run CUDA ``cuda``'s compiled code at all (minor-version compatibility's floor)."""
    floor = MINOR_COMPAT_MIN_DRIVER.get(cuda[0])
    if floor is None:
        known = ", ".join(str(major) for major in MINOR_COMPAT_MIN_DRIVER)
        return f"the kit knows no driver floor for CUDA {cuda[0]} (module_utils/cuda_compat.py; known: {known})"
    if _older_than(floor, branch, version):
        return f"CUDA {shown_cuda(cuda)} (the image's runtime) runs on driver {floor} or newer"
    return None


def _older_than(needed: str, branch: Any, version: Any) -> bool:
    """Is this driver (an exact version, or only a branch: its newest build may do) older than ``needed``?"""
    need = _driver_tuple(needed)
    if need is None:
        return False
    exact = _driver_tuple(version) if version not in (None, "") else None
    if exact is not None:
        return exact < need
    have = _driver_tuple(branch)
    return have is not None and have[0] < need[0]


def _driver_tuple(version: Any) -> tuple[int, ...] | None:
    text = str(version or "").strip()
    if not _VERSION_RE.fullmatch(text):
        return None
    return tuple(int(part) for part in text.split("."))


def shown_cuda(version: tuple[int, int, int]) -> str:
    return ".".join(str(part) for part in version)


def min_driver(cuda: tuple[int, int, int]) -> str | None:
    """The driver CUDA ``cuda`` needs, or None for a release the table does not know."""
    return CUDA_MIN_DRIVER.get(cuda)


def arch_problem(cuda: tuple[int, int, int], capability: tuple[int, int]) -> str | None:
    """Why CUDA ``cuda``'s nvcc cannot compile for ``capability``; None when it can."""
    ranges = [entry for entry in CUDA_ARCH_RANGE if entry[0] <= cuda[:2]]
    if not ranges:
        return f"the kit knows no compute capability range for CUDA {shown_cuda(cuda)} (module_utils/cuda_compat.py)"
    _, low, high = ranges[-1]
    if low <= capability <= high:
        return None
    shown = f"{capability[0]}.{capability[1]}"
    if capability > high:
        later = next((release for release, _, top in CUDA_ARCH_RANGE if top >= capability), None)
        hint = f"a CUDA {later[0]}.{later[1]} toolchain or newer" if later else "a newer CUDA than the kit knows"
        top = f"{high[0]}.{high[1]}"
        return f"CUDA {shown_cuda(cuda)} compiles for compute capability {top} at most, not {shown}: use {hint}"
    return f"CUDA {shown_cuda(cuda)} no longer compiles for compute capability {shown}: use an older CUDA toolchain"


def branch_problem(branch: Any, capability: tuple[int, int]) -> str | None:
    """Why driver branch ``branch`` does not support a GPU of ``capability``; None when it does."""
    text = str(branch or "").strip()
    if not re.fullmatch(r"[0-9]{3}", text):
        return None
    number = int(text)
    shown = f"{capability[0]}.{capability[1]}"
    for lowest, first, generation in FIRST_BRANCH:
        if capability >= lowest:
            if number < first:
                return f"{generation} GPUs (compute capability {shown}) need driver branch {first} or newer"
            break
    for below, last, generation in LAST_BRANCH:
        if capability < below and number > last:
            return f"{generation} GPUs (compute capability {shown}) end with driver branch {last}: pin {last} or older"
    return None


def flavour_problem(modules: Any, capability: tuple[int, int]) -> str | None:
    """Blackwell and newer run on the open kernel modules only."""
    if str(modules or "") == "proprietary" and capability >= OPEN_MODULES_ONLY_FROM:
        shown = f"{capability[0]}.{capability[1]}"
        return f"a GPU of compute capability {shown} (Blackwell or newer) runs on the open kernel modules only"
    return None
