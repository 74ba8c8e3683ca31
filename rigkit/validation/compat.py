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
import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ansible.module_utils.cuda_compat import (
    MINOR_COMPAT_MIN_DRIVER,
    arch_problem,
    branch_problem,
    cuda_objects,
    cuda_version_of_package,
    default_architectures,
    flavour_problem,
    minor_compat_problem,
    runs_on_gpu_problem,
    shown_cuda,
)
from ansible.module_utils.nvidia_compat import DRIVER_PINS, compute_capability, open_modules_problem

from rigkit import REPO, proofs
from rigkit.validation.debian_archive import ArchiveError, Index, dpkg_key, kernel_abi, mirrors, newest, split_version
from rigkit.validation.driver_support_rows import plan_lines as support_lines
from rigkit.validation.variables import RIG_OS

RUNTIME_PACKAGES = "llamacpp_image_cuda_runtime_packages"
TOOLCHAIN_PACKAGES = "llamacpp_image_cuda_toolchain_packages"
ARCHITECTURES = "llamacpp_image_cuda_architectures"
# The runtime package whose version names the image's CUDA release (Debian: "12.4.127~12.4.1-2" is CUDA 12.4.1).
CUDART = "libcudart12"
_DKMS_LINE_RE = re.compile(r"^nvidia(?:-current)?(?:-open)?/(?P<driver>[0-9.]+), (?P<kernel>[^,\s]+), \S+: installed$")


@dataclass(frozen=True)
class RigCompat:
    """What the plan is computed from: the rig's GPU and driver pins, and the image's CUDA runtime and code."""

    gpu_name: str
    capability_text: str
    capability: tuple[int, int] | None
    branch: str
    version: str
    modules: str
    runtime: str
    cuda: tuple[int, int, int] | None
    builds_cuda: bool
    architectures: str

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> RigCompat:
        rig_gpu = values.get("rig_gpu") if isinstance(values.get("rig_gpu"), Mapping) else {}
        packages = values.get(RUNTIME_PACKAGES) if isinstance(values.get(RUNTIME_PACKAGES), Mapping) else {}
        runtime = str(packages.get(CUDART) or "")
        builds = values.get("llamacpp_image_cuda", True)
        architectures = values.get(ARCHITECTURES)
        if architectures is None or "{{" in str(architectures):  # the role's default: templated, so not read here
            architectures = default_architectures(rig_gpu.get("compute_capability"))
        return cls(
            gpu_name=str(rig_gpu.get("name") or "the GPU"),
            capability_text=str(rig_gpu.get("compute_capability") or ""),
            capability=compute_capability(rig_gpu.get("compute_capability")),
            branch=str(values.get("nvidia_driver_branch") or ""),
            version=str(values.get("nvidia_driver_version") or ""),
            modules=str(values.get("nvidia_driver_kernel_modules") or ""),
            runtime=runtime,
            cuda=cuda_version_of_package(runtime),
            builds_cuda=builds is True or str(builds).lower() in ("true", "yes", "1"),
            architectures=str(architectures),
        )

    def objects(self) -> dict[str, list[str]] | None:
        """What the image's binary carries (cuda_objects), or None when the architectures are not valid."""
        try:
            return cuda_objects(self.architectures)
        except ValueError:
            return None


# The roles whose defaults the rules read when the inventory does not set them.
ROLES = ("nvidia_driver", "llamacpp_image", "docker", "llama_server")


def _modules_problem(rig: RigCompat) -> str | None:
    """The module flavour against the GPU: Blackwell needs open; open needs Turing, and 545 on GeForce."""
    assert rig.capability is not None
    if why := flavour_problem(rig.modules, rig.capability):
        return f"{why}: set nvidia_driver_kernel_modules: open"
    if rig.modules == "open":
        return open_modules_problem(rig.branch, rig.gpu_name, rig.capability_text)
    return None


DEBIAN_CODENAMES = {"12": "bookworm", "13": "trixie"}


def rig_os_problem(values: Mapping[str, Any]) -> tuple[str, Any, str] | None:
    """A driver branch the rig's own release does not package (a Debian 13 laptop carrying Debian 12's 535 pin),
    with the pin to use; None when the rig names no release, takes its driver from NVIDIA, or matches."""
    rig_os = values.get("rig_os")
    if rig_os not in RIG_OS or values.get("nvidia_driver_source") != "distro":
        return None
    pin = DRIVER_PINS[RIG_OS[str(rig_os)]]
    branch = str(values.get("nvidia_driver_branch") or "")
    if branch == pin.branch:
        return None
    version = f' and nvidia_driver_version: "{pin.version}"' if pin.version else ' and nvidia_driver_version: ""'
    return (
        "nvidia_driver_branch",
        branch,
        f"the rig runs {rig_os} (rig_os), whose archive packages branch {pin.branch}, not {branch} "
        f'({pin.source}): set nvidia_driver_branch: "{pin.branch}"{version}',
    )


# Docker runs CDI devices (--device nvidia.com/gpu=all) from 25.0 when daemon.json sets features.cdi, and by default
# from 28.2; an engine without it stops the container with these words (read from Debian 12's docker.io 20.10 and
# checked against the harness's engine by tests/integration/test_docker_cdi.py).
CDI_OPT_IN = (25, 0)
CDI_BY_DEFAULT = (28, 2)
NO_CDI_ERROR = 'could not select device driver "cdi" with capabilities: []'
_ENGINE_VERSION_RE = re.compile(r"^(?:[0-9]+:)?(?P<major>[0-9]+)\.(?P<minor>[0-9]+)")


def engine_version(values: Mapping[str, Any]) -> tuple[str, str] | None:
    """(version, where it comes from) of the engine the docker role installs on this rig, or None when it depends
    on a release the inventory does not name."""
    if values.get("docker_source", "docker") == "docker":
        return str(values.get("docker_version") or ""), "docker_version (Docker's own repository)"
    rig_os = str(values.get("rig_os") or "")
    if RIG_OS.get(rig_os, ("", ""))[0] != "debian":
        return None
    codename = DEBIAN_CODENAMES[RIG_OS[rig_os][1]]
    version = str(_role_vars(REPO, "Debian", role="docker")["__docker_debian_versions"].get(codename, ""))
    return (version, f"Debian {RIG_OS[rig_os][1]}'s docker.io (docker_source: debian)") if version else None


def cdi_engine_problem(values: Mapping[str, Any]) -> tuple[str, Any, str] | None:
    """A rig whose server takes its GPU through CDI on an engine that cannot, with the fix; None when it can."""
    if values.get("llama_server_gpu_access", "cdi") != "cdi":
        return None
    engine = engine_version(values)
    match = _ENGINE_VERSION_RE.match(engine[0]) if engine else None
    if engine is None or match is None:
        return None
    source = engine[1]
    found = (int(match["major"]), int(match["minor"]))
    shown = f"{found[0]}.{found[1]}"
    stops = f"the server's container would stop with '{NO_CDI_ERROR}'"
    if found < CDI_OPT_IN:
        debian = values.get("docker_source") == "debian"
        fix = "docker_source: docker (Docker's own repository)" if debian else "docker_version to 28.2 or newer"
        variable = "docker_source" if debian else "docker_version"
        return (
            variable,
            values.get(variable),
            f"Docker {shown}, {source}, has no CDI, which llama_server_gpu_access: cdi needs: {stops}. Set {fix} "
            "for this rig",
        )
    options = values.get("docker_daemon_options")
    features = options.get("features") if isinstance(options, Mapping) else None
    enabled = isinstance(features, Mapping) and features.get("cdi") is True
    if found < CDI_BY_DEFAULT and not enabled:
        return (
            "docker_daemon_options",
            options if options else {},
            f"Docker {shown}, {source}, runs CDI devices only when daemon.json enables them: {stops}. Add "
            "features: {cdi: true} to docker_daemon_options for this rig",
        )
    return None


def compat_findings(values: Mapping[str, Any]) -> list[tuple[str, Any, str]]:
    """(variable, value, why and what to do) for every combination the rig's driver, GPU and image cannot run.
    ``values``: the rig's variables over the defaults of ROLES."""
    if values.get("rig_kind") != "gpu":
        return []
    rig = RigCompat.of(values)
    found: list[tuple[str, Any, str]] = []
    if wrong_release := rig_os_problem(values):
        found.append(wrong_release)
    if no_cdi := cdi_engine_problem(values):
        found.append(no_cdi)
    if rig.capability is not None:
        if why := branch_problem(rig.branch, rig.capability):
            found.append(("nvidia_driver_branch", rig.branch, why))
        if why := _modules_problem(rig):
            found.append(("nvidia_driver_kernel_modules", rig.modules, why))
    if not rig.builds_cuda or rig.cuda is None:
        return found
    if rig.capability is not None and (why := arch_problem(rig.cuda, rig.capability)):
        toolkit = (values.get(TOOLCHAIN_PACKAGES) or {}).get("nvidia-cuda-toolkit", shown_cuda(rig.cuda))
        found.append((TOOLCHAIN_PACKAGES, f"nvidia-cuda-toolkit={toolkit}", f"{rig.gpu_name}: {why}"))
    objects = rig.objects()
    why = (
        runs_on_gpu_problem(objects, rig.capability, rig.cuda, rig.branch, rig.version)
        if (objects is not None and rig.capability is not None)
        else None
    )
    if why:
        found.append((ARCHITECTURES, rig.architectures, f"{rig.gpu_name}: {why}"))
    if why := minor_compat_problem(rig.cuda, rig.branch, rig.version):
        variable = "nvidia_driver_version" if rig.version else "nvidia_driver_branch"
        found.append((variable, rig.version or rig.branch, f"{why}: pin a newer driver"))
    return found


def unproven_pin_findings(host: str, values: Mapping[str, Any], root: Path = REPO) -> list[Finding]:
    """`make plan`'s refusal of an exact driver pin that no valid DKMS receipt built (a branch followed without a
    version, as on Ubuntu, has no exact pin to prove)."""
    rig = RigCompat.of(values)
    if values.get("rig_kind") != "gpu" or not rig.version:
        return []
    entry = known_good_kernels(root).get(rig.version)
    if entry and entry["valid"]:
        return []
    target = entry["target"] if entry else _dkms_target(rig.version, root)
    why = (
        f"the receipt that built {rig.version} ({entry['receipt']}) was made from other inputs: run make {target}"
        if entry
        else f"no DKMS receipt built {rig.version}: prove it (make {target}, its scenario at this pin) before a rig "
        "gets it"
    )
    return [("nvidia_driver_version", rig.version, why)]


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


def _role_vars(root: Path, name: str, role: str = "nvidia_driver") -> dict[str, Any]:
    """A role's vars/NAME.yml, as Ansible loads it (templates kept as text)."""
    from ansible.parsing.dataloader import DataLoader

    path = root / "roles" / role / "vars" / f"{name}.yml"
    return DataLoader().load_from_file(str(path), trusted_as_template=True) or {}


def debian_release(values: Mapping[str, Any], root: Path = REPO) -> tuple[str | None, str]:
    """(the Debian release whose archive the rig's driver comes from, how that is known), or (None, why not)."""
    source = values.get("nvidia_driver_source")
    if source != "distro":
        return None, f"nvidia_driver_source is {source!r}: the driver does not come from Debian's archive"
    rig_os = str(values.get("rig_os") or "")
    if rig_os in RIG_OS:
        distro, version = RIG_OS[rig_os]
        if distro != "debian":
            return None, f"the rig runs {rig_os} (rig_os): its driver comes from Ubuntu's archive, which is not read"
        return DEBIAN_CODENAMES[version], f"Debian {version} ({DEBIAN_CODENAMES[version]}), the rig's release (rig_os)"
    branch = str(values.get("nvidia_driver_branch") or "")
    branches = _role_vars(root, "Debian").get("__nvidia_driver_distro_branches") or {}
    releases = [str(release) for release, carried in branches.items() if str(carried) == branch]
    if not releases:
        return None, (
            f"no Debian release's non-free archive carries branch {branch} (roles/nvidia_driver/vars/Debian.yml): "
            "a Debian rig cannot install it from there, and Ubuntu's archive is not read"
        )
    return releases[0], (
        f"Debian {releases[0]}, the release whose non-free archive carries branch {branch} (the rig's host_vars name "
        "no rig_os; make discover writes it)"
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


def image_archive_report(host: str, values: Mapping[str, Any], lookup: Lookup) -> ArchiveReport:
    """The plan's `packages` rows for a GPU rig's CUDA image: each pinned toolchain and runtime package against the
    suite the image is built from (the controller's cached indexes), and a refusal for a pin the archive dropped,
    with the version it carries now."""
    rig = RigCompat.of(values)
    if values.get("rig_kind") != "gpu" or not rig.builds_cuda:
        return ArchiveReport()
    mirror = os.environ.get("RIGKIT_DEBIAN_MIRROR") or str(values.get("llamacpp_image_debian_mirror") or "")
    suite = str(values.get("llamacpp_image_debian_suite") or "")
    components = [str(name) for name in values.get("llamacpp_image_apt_components") or []]
    indexes, errors = _indexes(lookup, [(mirror, suite, component) for component in components])
    rows: list[str] = []
    findings: list[Finding] = []
    for variable in (TOOLCHAIN_PACKAGES, RUNTIME_PACKAGES):
        pins = values.get(variable) if isinstance(values.get(variable), Mapping) else {}
        for package, version in sorted(pins.items()):
            carried = [(v, index.where) for index in indexes for v in index.versions(package)]
            found = [where for v, where in carried if v == str(version)]
            if found:
                rows.append(f"{package} {version} ({found[0]}) -> ok")
            elif errors:
                rows.append(f"{package}={version}: not in what could be read: {'; '.join(errors)}")
            else:
                now = newest(v for v, _ in carried)
                move = f"{suite} carries {now} now" if now else f"{suite} carries no {package} at all"
                why = (
                    f"Debian's archive no longer carries {package} {version} ({move}): set {package}: "
                    f'"{now or "?"}" under {variable} in inventory/group_vars/gpu_rigs.yml, then make plan '
                    f"host={host} and make image host={host} (docs: rebuilding an old image exactly)"
                )
                rows.append(f"{package}={version}: not in {suite} -> refused")
                findings.append((variable, f"{package}={version}", why))
    lines = [f"  packages  the image's pins in Debian {suite} ({', '.join(components)})"]
    lines += [f"{_INDENT}{row}" for row in rows]
    return ArchiveReport(tuple(lines), tuple(findings))


_SASS_LINE_RE = re.compile(r"^sass: (?P<sass>[a-z0-9_ ]+?) \(cuobjdump")


def built_code(host: str, root: Path = REPO) -> tuple[str, str] | None:
    """(the compiled code cuobjdump found in the rig's image, where that was read) from the rig's CUDA image
    receipt, else from an image of the rig's architectures in this machine's engine; None when neither has it."""
    for item in proofs.PROOFS:
        path = root / "reports" / "proofs" / f"{item.name}.json"
        if not item.name.startswith("cuda-image-") or f"RIGKIT_CUDA_PROOF_RIG={host}" not in item.steps[-1].argv:
            continue
        try:
            lines = json.loads(path.read_text()).get("decisive_lines", [])
        except (OSError, ValueError):
            continue
        for line in lines:
            if match := _SASS_LINE_RE.match(str(line)):
                stale = "" if proofs.receipt_problem(item, root) is None else f", stale: make {item.make_target}"
                return match["sass"], f"{path.relative_to(root)}{stale}"
    return None


def _engine_code(architectures: str) -> tuple[str, str] | None:
    """The cuobjdump-checked code of an image built for ``architectures`` in this machine's Docker engine."""
    try:
        listed = subprocess.run(
            ["docker", "image", "ls", "--filter", f"label=io.rigkit.cuda-architectures={architectures}",
             "--format", "{{.Repository}}:{{.Tag}}"],
            capture_output=True, text=True, timeout=20, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    for image in listed.stdout.split():
        label = subprocess.run(
            ["docker", "image", "inspect", "--format", '{{index .Config.Labels "io.rigkit.cuda-sass"}}', image],
            capture_output=True, text=True, timeout=20, check=False,
        )  # fmt: skip
        if label.returncode == 0 and label.stdout.strip():
            return label.stdout.strip(), f"image {image}"
    return None


def _compile_row(host: str, rig: RigCompat, root: Path) -> str:
    """The `compile` row: what the toolkit can compile for the GPU, the code asked, and what a build really holds."""
    assert rig.capability is not None and rig.cuda is not None
    objects = rig.objects()
    asked = " ".join([*(objects or {}).get("sass", []), *(objects or {}).get("ptx", [])]) or "nothing"
    problem = arch_problem(rig.cuda, rig.capability) or (
        runs_on_gpu_problem(objects, rig.capability, rig.cuda, rig.branch, rig.version) if objects else None
    )
    built = built_code(host, root) or _engine_code(rig.architectures)
    seen = f"built: {built[0]} ({built[1]})" if built else f"not built here yet (make image host={host})"
    return f"{rig.architectures or '(none)'} -> {asked}; {seen} -> {_verdict(problem)}"


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
    if rig.builds_cuda and rig.cuda is not None:
        floor = MINOR_COMPAT_MIN_DRIVER.get(rig.cuda[0], "unknown")
        lines.append(
            f"  image     CUDA {shown_cuda(rig.cuda)} runtime (Debian's {CUDART} {rig.runtime}): its compiled code "
            f"runs on driver {floor} or newer -> {_verdict(minor_compat_problem(rig.cuda, rig.branch, rig.version))}"
        )
        if rig.capability is not None:
            lines.append(f"  compile   {_compile_row(host, rig, root)}")
    elif rig.builds_cuda:
        lines.append(f"  image     {RUNTIME_PACKAGES} names no {CUDART}: the image's CUDA is unknown")
    pinned = rig.version or f"branch {rig.branch} (newest build)"
    lines.append(f"  driver    {pinned}, {rig.modules or 'default'} kernel modules")
    if rig.capability is not None:
        lines.append(f"  branch    for {shown_cc}: {_verdict(branch_problem(rig.branch, rig.capability))}")
        lines.append(f"  modules   {rig.modules or 'default'}: {_verdict(_modules_problem(rig))}")
    kernels = known_good_kernels(root).get(rig.version)
    if kernels is None:
        verdict = "refused" if rig.version else "not proven (a branch followed: no exact pin)"
        lines.append(f"  kernels   no DKMS proof for {rig.version or rig.branch} -> {verdict}")
    else:
        state = "" if kernels["valid"] else f" (receipt stale: make {kernels['target']})"
        lines.append(
            f"  kernels   DKMS built {rig.version} for {', '.join(kernels['kernels'])} ({kernels['receipt']}){state}"
        )
    lines.extend(support_lines(host, values))
    if archive is not None:
        lines.extend(archive.lines)
    return lines
