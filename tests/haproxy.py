"""The fleet gateway's HAProxy on the controller, at the version the role pins for this Debian release: the package
and the libraries a bare controller lacks, fetched by apt (verified against the archive's signed indexes) into the
kit's cache and unpacked there, never installed (the package's service would start). The gateway's tests run it
with the configuration and key files the role itself writes (tests/unit/playbooks/render_gateway.yml)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import yaml

from rigkit.fleet.promtool import codename
from tests.support import REPO, unavailable

VERSIONS = REPO / "roles" / "fleet_gateway" / "vars" / "Debian.yml"
# What haproxy links against beyond a minimal Debian (its Lua and OpenTracing libraries), at the release's version.
LIBRARIES = ("liblua5.3-0", "libopentracing-c-wrapper0", "libopentracing1")


def pinned_haproxy() -> tuple[str, str]:
    """(this controller's Debian codename, the role's apt version pattern for it, e.g. 2.6.12-*)."""
    release = codename()
    versions = yaml.safe_load(VERSIONS.read_text(encoding="utf-8"))["__fleet_gateway_haproxy_versions"]
    if release not in versions:
        unavailable(f"the fleet gateway pins HAProxy for {', '.join(versions)}, not {release or 'this system'}")
    return release, versions[release]


def _fetch(download: Path, name: str, version: str) -> Path:
    """The .deb of ``name`` at ``version`` (an apt pattern) in ``download``, fetched into a directory of its own
    first, so that test workers that ask at once never see it half written."""
    found = sorted(download.glob(f"{name}_{version.replace(':', '%3a')}_*.deb"))
    if found:
        return found[-1]
    download.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=download, prefix=".fetch-") as scratch:
        done = subprocess.run(
            ["apt-get", "download", f"{name}={version}"], cwd=scratch, capture_output=True, text=True, check=False
        )
        debs = sorted(Path(scratch).glob(f"{name}_*.deb"))
        if done.returncode != 0 or not debs:
            unavailable(f"apt-get download {name}={version} failed: {done.stderr.strip()[-300:]}")
        target = download / debs[-1].name
        os.replace(debs[-1], target)
    return target


def haproxy(cache: Path) -> tuple[Path, dict[str, str]]:
    """(the haproxy binary, the environment it runs in) for this controller's release, unpacked on first use."""
    release, version = pinned_haproxy()
    tools = cache / "tools"
    root = tools / f"haproxy-{release}"
    binary = root / "usr" / "sbin" / "haproxy"
    env = {**os.environ, "LD_LIBRARY_PATH": str(root / "usr" / "lib" / "x86_64-linux-gnu")}
    if binary.is_file():
        return binary, env
    debs = [_fetch(tools / "download", "haproxy", version)]
    debs += [_fetch(tools / "download", name, "*") for name in LIBRARIES]
    # Unpacked aside, then renamed into place in one step: workers that ask at once never see half a tree.
    with tempfile.TemporaryDirectory(dir=tools, prefix=".unpack-") as scratch:
        unpacked = Path(scratch) / "root"
        for deb in debs:
            subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True)
        if root.exists() and not binary.is_file():
            shutil.rmtree(root)
        try:
            unpacked.rename(root)
        except OSError:
            if not binary.is_file():
                raise
    return binary, env
