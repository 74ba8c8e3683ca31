"""A GPU rig's compatibility plan on the controller: image CUDA → driver, GPU → driver branch and module flavour,
pinned driver → the kernels its DKMS module is known to build for. Refusals for the validation play
(``compat_problems``) and the lines ``make plan host=NAME`` prints (``plan_lines``); the rules themselves live in
module_utils/cuda_compat.py and module_utils/nvidia_compat.py.

On a rig that installs Debian's own driver packages, ``archive_report`` adds what Debian's archive says (read on the
controller through rigkit/validation/debian_archive.py, never on the rig): whether the packages the nvidia_driver
role installs are still there at the pinned version (a dropped pin is refused, with the version of the same branch
to move to), and the kernel ``linux-image-amd64`` would install next, against the kernels the DKMS receipts list.
Suites, components and package names are the role's own (roles/nvidia_driver/vars/), rendered for the release.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Callable, Mapping, Sequence
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
from rigkit.validation.debian_archive import ArchiveError, Index, dpkg_key, kernel_abi, mirrors, newest, split_version

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


# ------------------------------------------------------------------------------------ Debian's archive
# (mirror, suite, component) -> that index; ArchiveError when neither the archive nor a cached copy has it.
Lookup = Callable[[str, str, str], Index]
Finding = tuple[str, Any, str]
KERNEL_PACKAGE = "linux-image-amd64"
_INDENT = " " * 12


@dataclass(frozen=True)
class ArchiveReport:
    """The archive's rows of the plan, and the refusals among them (a pin the archive dropped)."""

    lines: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = ()
    # The kernel linux-image-amd64 would install next when no DKMS receipt built the pinned module for it.
    unproven_kernel: str | None = None


@dataclass(frozen=True)
class Source:
    """One suite of the apt sources the role adds, on its mirror, with the components it enables."""

    mirror: str
    suite: str
    components: tuple[str, ...]


def _role_vars(root: Path, name: str) -> dict[str, Any]:
    from ansible.parsing.dataloader import DataLoader

    path = root / "roles" / "nvidia_driver" / "vars" / f"{name}.yml"
    return DataLoader().load_from_file(str(path), trusted_as_template=True) or {}


def debian_release(values: Mapping[str, Any], root: Path = REPO) -> tuple[str | None, str]:
    """(the Debian release whose archive the rig's driver comes from, how that is known), or (None, why not)."""
    source = values.get("nvidia_driver_source")
    if source != "distro":
        return None, f"nvidia_driver_source is {source!r}: the driver does not come from Debian's archive"
    branch = str(values.get("nvidia_driver_branch") or "")
    branches = _role_vars(root, "Debian").get("__nvidia_driver_distro_branches") or {}
    releases = [str(release) for release, carried in branches.items() if str(carried) == branch]
    if not releases:
        return None, (
            f"no Debian release's non-free archive carries branch {branch} (roles/nvidia_driver/vars/Debian.yml): "
            "a Debian rig cannot install it from there, and Ubuntu's archive is not read"
        )
    return releases[0], (
        f"Debian {releases[0]}, the release whose non-free archive carries branch {branch} (the inventory does "
        "not name a rig's distribution)"
    )


def _headless(values: Mapping[str, Any]) -> bool:
    """nvidia_driver_headless as the role resolves it: the inventory's value, else rig_gpu.headless."""
    value = values.get("nvidia_driver_headless")
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and "{{" not in value:
        return value.strip().lower() in ("true", "yes", "1", "on")
    rig_gpu = values.get("rig_gpu") if isinstance(values.get("rig_gpu"), Mapping) else {}
    return str(rig_gpu.get("headless", False)).lower() in ("true", "yes", "1", "on")


def role_sources(values: Mapping[str, Any], release: str, root: Path = REPO) -> tuple[list[str], list[Source]]:
    """The packages the role installs on this rig (a GPU is present: full, or headless) and the suites it adds,
    rendered from roles/nvidia_driver/vars/ for ``release`` over the rig's variables and the mirrors."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    common, debian = _role_vars(root, "main"), _role_vars(root, "Debian")
    facts = {"distribution": "Debian", "distribution_release": release}
    templar = Templar(
        loader=DataLoader(), variables={**common, **debian, **values, **mirrors(values), "ansible_facts": facts}
    )
    flavour = "headless" if _headless(values) else "full"
    packages = [str(name) for name in templar.template(debian["__nvidia_driver_package_sets"]["distro"][flavour])]
    sources = [
        Source(str(uri), str(suite), tuple(str(c) for c in templar.template(repo["components"])))
        for repo in common["__nvidia_driver_debian_nonfree"]
        for uri in templar.template(repo["uris"])
        for suite in templar.template(repo["suites"])
    ]
    return packages, sources


def _indexes(lookup: Lookup, wanted: Sequence[tuple[str, str, str]]) -> tuple[list[Index], list[str]]:
    """The indexes that could be read, and why each other one could not."""
    found: list[Index] = []
    errors: list[str] = []
    for mirror, suite, component in dict.fromkeys(wanted):
        try:
            found.append(lookup(mirror, suite, component))
        except ArchiveError as exc:
            errors.append(str(exc))
    return found, errors


def _dkms_target(version: str, root: Path) -> str:
    """The make target of the DKMS proof that covers ``version`` (else the first DKMS proof, else all proofs)."""
    if entry := known_good_kernels(root).get(version):
        return str(entry["target"])
    return next((item.make_target for item in proofs.PROOFS if "dkms" in item.name), "proofs")


def _move_to(rig: RigCompat, packages: Sequence[str], indexes: Sequence[Index]) -> str | None:
    """The newest upstream version of the pinned branch that the archive carries for every package."""
    common: set[str] | None = None
    for package in packages:
        upstreams = {
            split_version(version)[1]
            for index in indexes
            for version in index.versions(package)
            if split_version(version)[1].startswith(f"{rig.branch}.")
        }
        common = upstreams if common is None else common & upstreams
    return newest(common or ())


def _dropped_finding(host: str, rig: RigCompat, dropped: Sequence[str], target: str | None, proof: str) -> Finding:
    missing = f"Debian's archive no longer carries {', '.join(dropped)} at {rig.version}"
    if target is None:
        why = (
            f"{missing}, nor any build of branch {rig.branch} for all the driver's packages: pin another "
            "nvidia_driver_branch / nvidia_driver_version, or set nvidia_driver_source: nvidia"
        )
    else:
        why = (
            f'{missing} (branch {rig.branch}\'s newest there is {target}): set nvidia_driver_version: "{target}" in '
            f"inventory/host_vars/{host}.yml, then make plan host={host} and make {proof}"
        )
    return ("nvidia_driver_version", rig.version, why)


def _pin_rows(
    host: str, rig: RigCompat, packages: Sequence[str], sources: Sequence[Source], lookup: Lookup, root: Path
) -> tuple[list[str], list[Finding], list[Index]]:
    """A row per package the role pins: the version the archive carries for the pin, or the refusal."""
    indexes, errors = _indexes(lookup, [(s.mirror, s.suite, c) for s in sources for c in s.components])
    suites = ", ".join(dict.fromkeys(source.suite for source in sources))
    rows: list[str] = []
    dropped: list[str] = []
    for package in packages:
        carried = [(v, index.where) for index in indexes for v in index.versions(package)]
        pinned = [(v, where) for v, where in carried if fnmatch.fnmatchcase(v, f"{rig.version}-*")]
        if pinned:
            version, where = max(pinned, key=lambda pair: dpkg_key(pair[0]))
            rows.append(f"{package} {version} ({where}) -> ok")
        elif errors:
            rows.append(f"{package}={rig.version}-*: not in what could be read: {'; '.join(errors)}")
        else:
            dropped.append(package)
            rows.append(f"{package}={rig.version}-*: not in {suites} -> refused: the archive dropped this pin")
    if not dropped:
        return rows, [], indexes
    proof = _dkms_target(rig.version, root)
    finding = _dropped_finding(host, rig, dropped, _move_to(rig, packages, indexes), proof)
    return [*rows, f"refused: {finding[2]}"], [finding], indexes


def _kernel_verdict(rig: RigCompat, abi: str, root: Path) -> tuple[str, bool]:
    """(the row's verdict, whether a DKMS receipt built the pinned module for kernel ``abi``)."""
    entry = known_good_kernels(root).get(rig.version)
    if entry and abi in entry["kernels"]:
        stale = "" if entry["valid"] else f" (receipt stale: make {entry['target']})"
        return f"ok: built by the receipt ({entry['receipt']}){stale}", True
    listed = f"the receipt lists {', '.join(entry['kernels'])}" if entry else f"no DKMS receipt for {rig.version}"
    return f"warning: no known-good module ({listed}): re-run make {_dkms_target(rig.version, root)}", False


def _kernel_row(
    rig: RigCompat, sources: Sequence[Source], lookup: Lookup, root: Path
) -> tuple[str, list[Index], str | None]:
    """The kernel ABI linux-image-amd64 pulls in the newest of the rig's suites, against the DKMS receipt; and
    that ABI when no receipt built the pinned module for it."""
    indexes, errors = _indexes(lookup, [(source.mirror, source.suite, "main") for source in sources])
    if errors:
        return "; ".join(errors), indexes, None
    candidates = [(stanza, index) for index in indexes for stanza in index.stanzas(KERNEL_PACKAGE)]
    if not candidates:
        suites = ", ".join(index.suite for index in indexes)
        return f"cannot check: no {KERNEL_PACKAGE} in {suites} (main)", indexes, None
    stanza, index = max(candidates, key=lambda pair: dpkg_key(pair[0].version))
    abi = kernel_abi(stanza)
    if abi is None:
        text = f"cannot check: {KERNEL_PACKAGE} {stanza.version} names no kernel (Depends: {stanza.depends})"
        return text, indexes, None
    verdict, proven = _kernel_verdict(rig, abi, root)
    return (
        f"{KERNEL_PACKAGE} {stanza.version} ({index.where}) installs {abi} -> {verdict}",
        indexes,
        (None if proven else abi),
    )


def archive_report(host: str, values: Mapping[str, Any], lookup: Lookup, root: Path = REPO) -> ArchiveReport:
    """The plan's `archive` and `next kernel` rows for a GPU rig, read from Debian's archive through ``lookup``
    (the controller's cached indexes; the rig is never contacted), and the refusal of a pin the archive dropped."""
    if values.get("rig_kind") != "gpu":
        return ArchiveReport()
    rig = RigCompat.of(values)
    release, how = debian_release(values, root)
    if release is None:
        return ArchiveReport((f"  archive   not checked: {how}", f"  next kernel  not checked: {how}"))
    packages, sources = role_sources(values, release, root)
    if rig.version:
        pins, findings, read = _pin_rows(host, rig, packages, sources, lookup, root)
    else:
        pins, findings, read = (
            [
                f'not checked: nvidia_driver_version "" follows branch {rig.branch} (the rig keeps the build it has; '
                "a new rig gets the archive's newest, recorded in the lock)"
            ],
            [],
            [],
        )
    kernel, kernel_read, unproven = _kernel_row(rig, sources, lookup, root)
    notes = dict.fromkeys(f"{index.where}: {index.note}" for index in [*read, *kernel_read] if index.note)
    lines = [f"  archive   {how}", *(f"{_INDENT}{row}" for row in pins), f"  next kernel  {kernel}"]
    lines += [f"{_INDENT}note: {note}" for note in notes]
    return ArchiveReport(tuple(lines), tuple(findings), unproven)


def archive_findings(host: str, values: Mapping[str, Any], lookup: Lookup, root: Path = REPO) -> list[Finding]:
    """The validation play's archive rule: a pinned driver that Debian's archive (the controller's cached indexes)
    no longer carries, with the version to move to. An archive that cannot be read refuses nothing (make plan says
    why); a rig whose driver does not come from Debian's archive is not checked."""
    if values.get("rig_kind") != "gpu":
        return []
    rig = RigCompat.of(values)
    release, _ = debian_release(values, root)
    if release is None or not rig.version:
        return []
    packages, sources = role_sources(values, release, root)
    return _pin_rows(host, rig, packages, sources, lookup, root)[1]


def _verdict(problem: str | None) -> str:
    return f"refused: {problem}" if problem else "ok"


def plan_lines(
    host: str, values: Mapping[str, Any], root: Path = REPO, archive: ArchiveReport | None = None
) -> list[str]:
    """What `make plan host=NAME` prints: every pairing of the rig's pins, with its verdict (and ``archive``'s rows,
    from archive_report, when the archive was read)."""
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
    if archive is not None:
        lines.extend(archive.lines)
    return lines
