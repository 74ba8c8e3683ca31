"""The NVIDIA kernel module of the pinned driver for every installed kernel (stdlib only: runs on rigs).

A rig must never boot into a kernel that has no NVIDIA module: an unattended kernel update installs a new
``linux-image-*``, DKMS builds the module for it only when that kernel's headers are there, and the next boot
(the owner's, or the role's) picks the newest kernel. This reads every kernel under ``/boot`` (not only the
running one), says which have the module of the pinned version and which lack their headers, and builds the
missing modules with DKMS. ``module_utils/rig_deployed.py`` uses the same survey for ``make status``; the
role's kernel hook (``roles/nvidia_driver/templates/nvidia-kernel-guard.sh.j2``) applies the same rule at
kernel-install time.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ansible.module_utils.rig_command import run

BOOT_DIR = "/boot"
MODULES_DIR = "/lib/modules"
DKMS_DIR = "/var/lib/dkms"
# The module's file: NVIDIA's and Ubuntu's name, and Debian's (its packages rename it nvidia-current, and
# nvidia-current-open for the open modules).
MODULE_STEMS = ("nvidia", "nvidia-current", "nvidia-current-open")
# The certificate DKMS signs modules with: the one framework.conf names, else Ubuntu's MOK, else DKMS's own
# (DKMS generates /var/lib/dkms/mok.key + mok.pub with openssl on its first signed build).
DKMS_FRAMEWORK_CONF = ("/etc/dkms/framework.conf", "/etc/dkms/framework.conf.d")
SIGNING_CERTIFICATES = ("/var/lib/shim-signed/mok/MOK.der", "/var/lib/dkms/mok.pub")
MODULE_SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")
# Where DKMS and NVIDIA's installers put it, under /lib/modules/<kernel>/.
MODULE_SUBDIRS = ("updates/dkms", "updates", "extra", "kernel/drivers/video")
# Ubuntu's prebuilt, Canonical-signed modules (linux-modules-nvidia-<branch>[-server][-open]-<kernel>) link it
# into a directory per branch: kernel/nvidia-580srv/, kernel/nvidia-570/.
PREBUILT_SUBDIR_GLOB = "kernel/nvidia-*"
# A kernel release, as in /boot/vmlinuz-<release> and linux-image-<release>: it starts X.Y.Z.
_RELEASE_RE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+")
# Image packages that are neither a kernel flavour's metapackage nor a kernel (debug symbols, build templates).
_NOT_A_FLAVOUR_RE = re.compile(r"(-dbg|-dbgsym|-template|-unsigned)$|^(unsigned|extra|signed)-")
# What a person needs from a make.log: compiler errors and make's failure lines, not the flags (-Werror=...).
_ERROR_RE = re.compile(r"(^|\s)(fatal )?error: |\*\*\* .*Error [0-9]|No such file or directory")


class KernelModuleError(Exception):
    """A kernel the rig could boot cannot get the NVIDIA module; the message says which and what to do."""


def version_key(release: str) -> tuple[tuple[int, int | str], ...]:
    """Sort kernel releases the way `sort -V` and GRUB's menu do (6.1.0-9 before 6.1.0-10)."""
    parts = re.split(r"([0-9]+)", release)  # ASCII digits only: str.isdigit() takes '²', which int() refuses
    return tuple((0, int(part)) if re.fullmatch(r"[0-9]+", part) else (1, part) for part in parts if part)


def installed_kernels(boot_dir: str = BOOT_DIR) -> list[str]:
    """Kernel releases with an image under /boot (vmlinuz-<release>), oldest first."""
    try:
        names = os.listdir(boot_dir)
    except OSError:
        return []
    releases = [name[len("vmlinuz-") :] for name in names if name.startswith("vmlinuz-")]
    return sorted((release for release in releases if _RELEASE_RE.match(release)), key=version_key)


def headers_package(release: str) -> str:
    """The package that carries a kernel's headers (the same on Debian and Ubuntu)."""
    return f"linux-headers-{release}"


def headers_present(release: str, modules_dir: str = MODULES_DIR) -> bool:
    """A kernel's headers are installed: /lib/modules/<release>/build leads to a tree with a Makefile."""
    return Path(modules_dir, release, "build", "Makefile").is_file()


def apt_candidate(package: str) -> str | None:
    """The version apt would install of `package` (None when no enabled source carries it)."""
    code, out, _ = run(["apt-cache", "policy", package])
    if code != 0:
        return None
    match = re.search(r"^\s*Candidate:\s*(\S+)\s*$", out, re.MULTILINE)
    return match.group(1) if match and match.group(1) != "(none)" else None


def install_missing_headers(
    driver_version: str,
    *,
    boot_dir: str = BOOT_DIR,
    modules_dir: str = MODULES_DIR,
    install: bool = True,
    timeout: float = 3600.0,
) -> tuple[list[str], str]:
    """Install the headers of every installed kernel that lacks both them and the module, where apt carries them
    (a rig upgraded from an installer's kernel keeps that kernel without headers). Returns the packages
    installed (would install, `install` false) and apt's last line when it failed (DKMS's build runs in the
    headers' hook: its failure is read from DKMS's log afterwards)."""
    _, _, states = _kernel_states(driver_version, boot_dir, modules_dir, None)
    wanted = [s.headers_package for s in states if not s.has_module and not s.headers]
    available = [package for package in wanted if apt_candidate(package)]
    if not available or not install:
        return available, ""
    argv = ["apt-get", "install", "-y", "--no-install-recommends", *available]
    code, out, err = run(argv, timeout=timeout, env={"DEBIAN_FRONTEND": "noninteractive"})
    lines = (out + err).strip().splitlines()
    return available, ("" if code == 0 else (lines[-1] if lines else f"apt-get exit {code}"))


def headers_metapackages(packages: dict[str, Any]) -> dict[str, str]:
    """The headers metapackage of every installed kernel-flavour metapackage, at the image's own version.

    `packages` is Ansible's package_facts (name -> [{version, ...}]) or name -> version. linux-image-amd64
    (Debian), linux-image-cloud-amd64, linux-image-generic, linux-image-generic-hwe-22.04 (Ubuntu, HWE
    included) each get their linux-headers-* twin, so every kernel an update brings gets its headers in the
    same transaction. Versioned kernels (linux-image-6.1.0-50-amd64) are no flavour: their headers are
    checked per kernel instead."""
    found: dict[str, str] = {}
    for name, value in packages.items():
        if not name.startswith("linux-image-"):
            continue
        flavour = name[len("linux-image-") :]
        if _RELEASE_RE.match(flavour) or _NOT_A_FLAVOUR_RE.search(flavour):
            continue
        if isinstance(value, list) and not value:
            continue
        version = value[0]["version"] if isinstance(value, list) else value
        found[f"linux-headers-{flavour}"] = str(version)
    return dict(sorted(found.items()))


def module_file(release: str, modules_dir: str = MODULES_DIR) -> str | None:
    """The NVIDIA module file installed for a kernel (None when there is none): DKMS's or an installer's, else
    Ubuntu's prebuilt one."""
    kernel = Path(modules_dir, release)
    prebuilt = sorted(str(path.relative_to(kernel)) for path in kernel.glob(PREBUILT_SUBDIR_GLOB) if path.is_dir())
    for subdir in (*MODULE_SUBDIRS, *prebuilt):
        for stem in MODULE_STEMS:
            for suffix in MODULE_SUFFIXES:
                path = kernel / subdir / (stem + suffix)
                if path.is_file():
                    return str(path)
    return None


def modinfo_field(path: str, name: str) -> str:
    """One field of a module file's modinfo ('' when modinfo cannot read it or it has none)."""
    code, out, _ = run(["modinfo", "-F", name, path], timeout=20)
    return out.strip() if code == 0 else ""


def dkms_module_name(version: str, dkms_dir: str = DKMS_DIR) -> str | None:
    """The DKMS name under which the driver's module source of `version` is registered (Debian:
    nvidia-current or nvidia-current-open; NVIDIA's and Ubuntu's packages: nvidia or nvidia-srv)."""
    try:
        names = sorted(os.listdir(dkms_dir))
    except OSError:
        return None
    for name in names:
        if "nvidia" in name and Path(dkms_dir, name, version).is_dir():
            return name
    return None


def make_log_errors(log_text: str, limit: int = 12) -> list[str]:
    """The lines of a DKMS make.log worth showing: compiler errors, missing files."""
    return [line.strip() for line in log_text.splitlines() if len(line) < 600 and _ERROR_RE.search(line)][:limit]


def build_log(name: str, version: str, release: str, dkms_dir: str = DKMS_DIR) -> Path | None:
    """Where DKMS left the make.log of a build for a kernel (a failed build keeps it under build/)."""
    base = Path(dkms_dir, name, version)
    candidates = [base / release / arch / "log" / "make.log" for arch in ("x86_64", "aarch64", os.uname().machine)]
    for path in [*candidates, base / "build" / "make.log"]:
        if path.is_file():
            return path
    return None


@dataclass
class KernelState:
    release: str
    running: bool
    newest: bool
    headers: bool
    headers_package: str
    module: str | None = None
    module_version: str = ""
    signer: str = ""
    sig_key: str = ""
    # the module's source hash (modinfo srcversion): the loaded module's /sys/module/nvidia/srcversion names its file
    srcversion: str = ""
    # signed by DKMS's certificate (None when signing is not required)
    signed: bool | None = None
    built_now: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def has_module(self) -> bool:
        return self.module is not None

    def as_dict(self) -> dict[str, Any]:
        found = asdict(self)
        found["has_module"] = self.has_module
        return found


def kernel_state(release: str, driver_version: str, *, running: str, newest: str, modules_dir: str) -> KernelState:
    """What one kernel has: headers, the NVIDIA module of the pinned version (a module of another version
    counts as missing: it is not the driver the userspace packages expect), its signer."""
    state = KernelState(
        release=release,
        running=release == running,
        newest=release == newest,
        headers=headers_present(release, modules_dir),
        headers_package=headers_package(release),
    )
    path = module_file(release, modules_dir)
    if path is not None:
        state.module_version = modinfo_field(path, "version")
        if not driver_version or state.module_version == driver_version:
            state.module = path
            state.signer = modinfo_field(path, "signer")
            state.sig_key = modinfo_field(path, "sig_key")
            state.srcversion = modinfo_field(path, "srcversion")
    return state


def signing_certificate(framework: tuple[str, ...] = DKMS_FRAMEWORK_CONF) -> str | None:
    """The certificate DKMS signs with: mok_certificate= in its framework configuration, else the first of
    SIGNING_CERTIFICATES that exists (None when DKMS has none yet)."""
    files: list[Path] = []
    for name in framework:
        path = Path(name)
        files += sorted(path.glob("*.conf")) if path.is_dir() else [path]
    configured = None
    for path in files:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            match = re.match(r"^\s*mok_certificate=[\"']?([^\"'\s]+)", line)
            if match:
                configured = match.group(1)
    for candidate in ([configured] if configured else []) + list(SIGNING_CERTIFICATES):
        if Path(candidate).is_file():
            return candidate
    return None


def _hex_id(text: str) -> str:
    """A key id or serial as bare upper-case hex without leading zeros (modinfo prints AA:BB:.., openssl too)."""
    return re.sub(r"[^0-9A-F]", "", text.upper()).lstrip("0")


def certificate_identity(path: str) -> tuple[str, set[str]]:
    """(subject CN, ids) of a DER or PEM certificate, by openssl. ids: its serial number and subject key
    identifier, as bare hex: modinfo's sig_key of a module its key signed is one of them (sign-file names the
    signer by issuer and serial, or with -k by the key identifier)."""
    for form in ("DER", "PEM"):
        code, out, _ = run(
            ["openssl", "x509", "-inform", form, "-in", path, "-noout", "-subject", "-nameopt", "RFC2253",
             "-serial", "-ext", "subjectKeyIdentifier"],
            timeout=20,
        )  # fmt: skip
        if code == 0:
            cn = re.search(r"subject=.*?CN=([^,\n]+)", out)
            serial = re.search(r"^serial=([0-9A-Fa-f]+)", out, re.MULTILINE)
            skid = re.search(r"Subject Key Identifier:\s*\n\s*([0-9A-Fa-f:]+)", out)
            ids = {_hex_id(match.group(1)) for match in (serial, skid) if match}
            return (cn.group(1).strip() if cn else "", ids)
    return "", set()


def signed_by(state: KernelState, identity: tuple[str, set[str]]) -> bool:
    """The kernel's module carries a signature of that certificate's key (signer CN and key id)."""
    cn, ids = identity
    if not state.signer:
        return False
    if cn and state.signer != cn:
        return False
    return not (ids and state.sig_key and _hex_id(state.sig_key) not in ids)


def _kernel_states(
    driver_version: str, boot_dir: str, modules_dir: str, running: str | None
) -> tuple[str, str, list[KernelState]]:
    """(running kernel, newest installed kernel, the state of each installed kernel, oldest first)."""
    kernels = installed_kernels(boot_dir)
    running = running or os.uname().release
    newest = kernels[-1] if kernels else ""
    return (
        running,
        newest,
        [kernel_state(k, driver_version, running=running, newest=newest, modules_dir=modules_dir) for k in kernels],
    )


def survey(
    driver_version: str, *, boot_dir: str = BOOT_DIR, modules_dir: str = MODULES_DIR, running: str | None = None
) -> dict[str, Any]:
    """Every installed kernel and whether it has the module; read-only (make status, check mode)."""
    running, newest, states = _kernel_states(driver_version, boot_dir, modules_dir, running)
    return {
        "running": running,
        "running_installed": any(state.running for state in states),
        "newest": newest,
        "kernels": [state.as_dict() for state in states],
        # A reboot now would land in the newest kernel: without the module the rig comes back without its GPU.
        "reboot_strands_gpu": bool(states) and not states[-1].has_module,
    }


@dataclass
class EnsureResult:
    kernels: list[KernelState]
    running: str
    newest: str
    built: list[str]
    dkms_name: str | None
    certificate: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "kernels": [state.as_dict() for state in self.kernels],
            "running": self.running,
            "newest": self.newest,
            "built": self.built,
            "dkms_name": self.dkms_name,
            "certificate": self.certificate,
        }


def _dkms_install(name: str, version: str, release: str, timeout: float, force: bool) -> tuple[int, str]:
    argv = ["dkms", "install", "-m", name, "-v", version, "-k", release] + (["--force"] if force else [])
    code, out, err = run(argv, timeout=timeout)
    return code, (out + err).strip()


def ensure_modules(
    driver_version: str,
    *,
    build: bool,
    require_signed: bool = False,
    boot_dir: str = BOOT_DIR,
    modules_dir: str = MODULES_DIR,
    dkms_dir: str = DKMS_DIR,
    running: str | None = None,
    build_timeout: float = 1800.0,
) -> EnsureResult:
    """Make sure every installed kernel has the NVIDIA module of `driver_version`, building it with DKMS where
    it is missing (`build` false: check mode, report what would be built). Refuses before building anything
    when a kernel lacks its headers or DKMS does not know the driver, naming the kernel and what to install."""
    running, newest, states = _kernel_states(driver_version, boot_dir, modules_dir, running)
    if not states:
        raise KernelModuleError(
            f"no kernel image under {boot_dir} (vmlinuz-*): the NVIDIA module {driver_version} is built per "
            "installed kernel. Install the kernel (Debian: linux-image-amd64, Ubuntu: linux-image-generic) first."
        )
    without_headers = [state for state in states if not state.has_module and not state.headers]
    if without_headers:
        listed = "; ".join(
            f"kernel {state.release} ({boot_dir}/vmlinuz-{state.release}) has no headers, and no enabled apt "
            f"source carries {state.headers_package}"
            for state in without_headers
        )
        packages = " ".join(state.headers_package for state in without_headers)
        raise KernelModuleError(
            f"the NVIDIA module {driver_version} cannot be built for every installed kernel: {listed}. "
            f"Enable the source that carries them and run `apt-get install {packages}` on the rig, or remove "
            "that kernel, then provision again; nothing was built or changed."
        )
    name = dkms_module_name(driver_version, dkms_dir)
    identity: tuple[str, set[str]] = ("", set())
    if require_signed:
        certificate = signing_certificate()
        identity = certificate_identity(certificate) if certificate else ("", set())
    # Missing, or (Secure Boot signing on) not signed by DKMS's key: built again, signed.
    todo = [state for state in states if not state.has_module or (require_signed and not signed_by(state, identity))]
    if todo and name is None:
        raise KernelModuleError(
            f"DKMS knows no NVIDIA module of version {driver_version} ({dkms_dir}/nvidia*/{driver_version} is "
            "absent): the driver's DKMS package (nvidia-open-kernel-dkms / nvidia-kernel-dkms) is not installed."
        )
    built = []
    for state in todo:
        if not build:
            state.problems.append(f"would build the NVIDIA module {driver_version} with DKMS ({name})")
            continue
        assert name is not None
        code, output = _dkms_install(name, driver_version, state.release, build_timeout, force=state.has_module)
        rebuilt = kernel_state(state.release, driver_version, running=running, newest=newest, modules_dir=modules_dir)
        if code != 0 or not rebuilt.has_module:
            log = build_log(name, driver_version, state.release, dkms_dir)
            lines = make_log_errors(log.read_text(errors="replace")) if log else []
            detail = "; ".join(lines) if lines else (output.splitlines()[-1] if output else f"exit {code}")
            raise KernelModuleError(
                f"DKMS could not build the NVIDIA module {name}/{driver_version} for kernel {state.release} "
                f"(exit {code}): {detail}" + (f" (log: {log})" if log else "") + ". Fix the build (a newer driver "
                "branch for this kernel, or remove the kernel), then provision again."
            )
        rebuilt.built_now = True
        states[states.index(state)] = rebuilt
        built.append(state.release)
    certificate = None
    if require_signed:
        # read again: DKMS makes its key and certificate (/var/lib/dkms/mok.*) on a first signed build without one
        certificate = signing_certificate()
        identity = certificate_identity(certificate) if certificate else ("", set())
        for state in states:
            state.signed = signed_by(state, identity)
        unsigned = [state for state in states if not state.signed]
        if unsigned and build:
            found = ", ".join(
                f"{state.release}: {state.signer or 'unsigned'} (key {state.sig_key or '-'})" for state in unsigned
            )
            raise KernelModuleError(
                "Secure Boot signing is on (Secure Boot enforces it, or nvidia_driver_secure_boot_signing) but the "
                "NVIDIA module is not "
                f"signed by DKMS's key ({certificate or 'no certificate: /var/lib/dkms/mok.pub'}, "
                f"CN {identity[0] or '?'}) for {found}: Secure Boot would refuse it. DKMS signs with openssl and "
                "sign-file (linux-kbuild); check `dkms install` output for 'Signing module', then provision again."
            )
    return EnsureResult(
        kernels=states, running=running, newest=newest, built=built, dkms_name=name, certificate=certificate
    )
