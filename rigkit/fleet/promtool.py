"""Prometheus's promtool on the controller, at the version the fleet monitor deploys: taken from the pinned Debian
package (apt verifies it against the archive's signed indexes) and unpacked into the kit's cache, never installed
(the package's service would start). Used by the tests that check the generated configuration and alert rules."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from rigkit import REPO
from rigkit.discovery.facts import parse_os_release

VERSIONS = REPO / "roles" / "fleet_monitor" / "vars" / "Debian.yml"


def codename() -> str:
    return parse_os_release(Path("/etc/os-release").read_text(encoding="utf-8")).get("VERSION_CODENAME", "")


def promtool(cache: Path) -> Path:
    """The path of promtool for this controller's Debian release (downloaded and unpacked on first use)."""
    release = codename()
    versions = yaml.safe_load(VERSIONS.read_text(encoding="utf-8"))["__fleet_monitor_versions"]
    if release not in versions:
        raise RuntimeError(
            f"promtool: this controller runs {release or 'an unknown release'}; the fleet monitor pins Prometheus for "
            f"{', '.join(versions)} only ({VERSIONS.relative_to(REPO)}): run the check on a Debian 12 or 13 controller"
        )
    root = cache / "tools" / f"prometheus-{release}"
    binary = root / "usr" / "bin" / "promtool"
    if binary.is_file():
        return binary
    download = cache / "tools" / "download"
    download.mkdir(parents=True, exist_ok=True)
    pattern = f"prometheus={versions[release]['prometheus']}"
    subprocess.run(["apt-get", "download", pattern], cwd=download, check=True, capture_output=True, text=True)
    debs = sorted(download.glob("prometheus_*.deb"))
    if not debs:
        raise RuntimeError(f"promtool: apt-get download {pattern} left no package in {download}")
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(root)], check=True)
    for deb in debs:
        deb.unlink()
    return binary
