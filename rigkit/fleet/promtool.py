"""Prometheus's promtool on the controller, at the version the fleet monitor deploys: taken from the pinned Debian
package (apt verifies it against the archive's signed indexes) and unpacked into the kit's cache, never installed
(the package's service would start). Used by the tests that check the generated configuration and alert rules."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import yaml

from rigkit import REPO
from rigkit.discovery.facts import parse_os_release

VERSIONS = REPO / "roles" / "fleet_monitor" / "vars" / "Debian.yml"


def codename() -> str:
    return parse_os_release(Path("/etc/os-release").read_text(encoding="utf-8")).get("VERSION_CODENAME", "")


def pinned_prometheus() -> tuple[str, str]:
    """(this controller's Debian codename, the Prometheus version the fleet monitor pins for it)."""
    release = codename()
    versions = yaml.safe_load(VERSIONS.read_text(encoding="utf-8"))["__fleet_monitor_versions"]
    if release not in versions:
        raise RuntimeError(
            f"promtool: this controller runs {release or 'an unknown release'}; the fleet monitor pins Prometheus for "
            f"{', '.join(versions)} only ({VERSIONS.relative_to(REPO)}): run the check on a Debian 12 or 13 controller"
        )
    return release, versions[release]["prometheus"]


def prometheus_deb(cache: Path) -> Path:
    """The pinned Prometheus package in the kit's cache (fetched on first use)."""
    return _package(cache / "tools" / "download", "prometheus=" + pinned_prometheus()[1])


def promtool(cache: Path) -> Path:
    """The path of promtool for this controller's Debian release (downloaded and unpacked on first use)."""
    release, _ = pinned_prometheus()
    tools = cache / "tools"
    root = tools / f"prometheus-{release}"
    binary = root / "usr" / "bin" / "promtool"
    if binary.is_file():
        return binary
    deb = prometheus_deb(cache)
    # Unpacked aside, then renamed into place in one step: test workers that ask at once never see half a tree.
    with tempfile.TemporaryDirectory(dir=tools, prefix=".unpack-") as scratch:
        unpacked = Path(scratch) / "root"
        subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True)
        if root.exists() and not binary.is_file():
            shutil.rmtree(root)
        try:
            unpacked.rename(root)
        except OSError:
            if not binary.is_file():
                raise
    return binary


def _package(download: Path, pattern: str) -> Path:
    """The .deb of ``pattern`` (``name=version``) in ``download``, fetched by apt (which verifies it against the
    archive's signed indexes) into a directory of its own first, so that a concurrent fetch never sees it half
    written or removed."""
    name, _, version = pattern.partition("=")
    found = sorted(download.glob(f"{name}_{version.replace(':', '%3a')}_*.deb"))
    if found:
        return found[-1]
    download.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=download, prefix=".fetch-") as scratch:
        subprocess.run(["apt-get", "download", pattern], cwd=scratch, check=True, capture_output=True, text=True)
        debs = sorted(Path(scratch).glob(f"{name}_*.deb"))
        if not debs:
            raise RuntimeError(f"promtool: apt-get download {pattern} left no package in {scratch}")
        target = download / debs[-1].name
        os.replace(debs[-1], target)
    return target
