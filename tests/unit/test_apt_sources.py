"""The driver's and the toolkit's apt entries beside the rig's own sources, judged by Debian's real apt.

Each rig layout below is one people have: the installer's sources.list, `apt modernize-sources`' deb822 files
(their keyring is the `.gpg` name, the role's the `.pgp` one), NVIDIA's cuda-keyring package's list, an entry
apt already refuses. The host's own apt reads each result offline (`apt-get indextargets` on a private Dir::Etc):
it must accept it with no error and no "configured multiple times" warning.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.apt_sources import MARKER, SourcesError, parse_deb822, parse_one_line, plan, render

from tests import support

DEBIAN = "http://deb.debian.org/debian"
SECURITY = "http://deb.debian.org/debian-security"
CUDA = "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/"
PGP, GPG = "/usr/share/keyrings/debian-archive-keyring.pgp", "/usr/share/keyrings/debian-archive-keyring.gpg"
NONFREE = ["contrib", "non-free", "non-free-firmware"]


def nonfree(release: str, keyring: str) -> list[dict]:
    """The nvidia_driver role's Debian repositories (roles/nvidia_driver/vars/main.yml) for `release`."""
    return [
        {
            "name": "debian-nonfree",
            "uris": [DEBIAN],
            "suites": [release, f"{release}-updates"],
            "components": NONFREE,
            "signed_by": keyring,
        },
        {
            "name": "debian-security-nonfree",
            "uris": [SECURITY],
            "suites": [f"{release}-security"],
            "components": NONFREE,
            "signed_by": keyring,
        },
    ]


INSTALLER = (
    "deb http://deb.debian.org/debian/ {r} main non-free-firmware\n"
    "deb http://security.debian.org/debian-security {r}-security main non-free-firmware\n"
    "deb http://deb.debian.org/debian/ {r}-updates main non-free-firmware\n"
)
# What apt 3.0's `apt modernize-sources` wrote on a Debian 13 rig whose lists were current.
MODERNISED = (
    "# Modernized from /etc/apt/sources.list\nTypes: deb\nURIs: http://deb.debian.org/debian/\n"
    "Suites: trixie trixie-updates\nComponents: main non-free-firmware\n"
    f"Signed-By: {GPG}\n\n"
    "# Modernized from /etc/apt/sources.list\nTypes: deb deb-src\nURIs: http://deb.debian.org/debian-security/\n"
    f"Suites: trixie-security\nComponents: main non-free-firmware\nSigned-By: {GPG}\n"
)


def apt_reads(etc: Path) -> subprocess.CompletedProcess:
    """Debian's apt reading the sources under `etc`, offline: its errors and warnings are what a rig would print."""
    apt = shutil.which("apt-get")
    if apt is None:
        support.not_applicable("no apt-get on this controller: the kit's CI machine is Debian 12")
    state = etc.parent / "state"
    (state / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (state / "cache").mkdir(exist_ok=True)
    options = [f"Dir::Etc={etc}", f"Dir::State::Lists={state / 'lists'}", f"Dir::Cache={state / 'cache'}"]
    return subprocess.run(
        [apt, *(a for o in options for a in ("-o", o)), "indextargets"], capture_output=True, text=True, timeout=60
    )


def rig_etc(tmp_path: Path, files: dict[str, str]) -> Path:
    etc = tmp_path / "etc"
    (etc / "sources.list.d").mkdir(parents=True)
    for name, text in files.items():
        (etc / name).write_text(text)
    return etc


def converge(etc: Path, repositories: list[dict], *extra: str) -> dict:
    result, printed = support.run_module("apt_sources", {"repositories": repositories, "apt_dir": str(etc)}, *extra)
    assert not result.get("failed"), printed
    return result


def fields(path: Path) -> list[dict[str, str]]:
    return [
        {
            "Types": " ".join(e.types),
            "URIs": " ".join(e.uris),
            "Suites": " ".join(e.suites),
            "Components": " ".join(e.components),
            "Signed-By": e.signed_by,
        }
        for e in parse_deb822(path.read_text(), str(path))
    ]


def test_modernised_trixie_sources_are_extended_under_their_own_keyring(tmp_path: Path) -> None:
    etc = rig_etc(tmp_path, {"sources.list.d/debian.sources": MODERNISED})
    # What the role wrote before: one fixed entry with its own keyring. apt refuses every run after it.
    old = rig_etc(tmp_path / "old", {"sources.list.d/debian.sources": MODERNISED})
    (old / "sources.list.d/debian-nonfree.sources").write_text(
        f"Types: deb\nURIs: {DEBIAN}\nSuites: trixie trixie-updates\nComponents: {' '.join(NONFREE)}\n"
        f"Signed-By: {PGP}\n"
    )
    refused = apt_reads(old)
    assert refused.returncode != 0 and "Conflicting values set for option Signed-By" in refused.stderr

    first = converge(etc, nonfree("trixie", PGP))
    assert first["changed"]
    written = etc / "sources.list.d/debian-nonfree.sources"
    assert written.read_text().startswith(MARKER)
    assert fields(written) == [
        {
            "Types": "deb",
            "URIs": DEBIAN,
            "Suites": "trixie trixie-updates",
            "Components": "contrib non-free",
            "Signed-By": GPG,
        }
    ]
    assert fields(etc / "sources.list.d/debian-security-nonfree.sources")[0]["Signed-By"] == GPG
    read = apt_reads(etc)
    assert (read.returncode, read.stderr) == (0, "")
    assert converge(etc, nonfree("trixie", PGP))["changed"] is False


def test_the_installers_sources_get_only_the_components_they_lack(tmp_path: Path) -> None:
    etc = rig_etc(tmp_path, {"sources.list": INSTALLER.format(r="bookworm")})
    # The fixed entry lists non-free-firmware a second time: apt warns on every run.
    old = rig_etc(tmp_path / "old", {"sources.list": INSTALLER.format(r="bookworm")})
    (old / "sources.list.d/debian-nonfree.sources").write_text(
        f"Types: deb\nURIs: {DEBIAN}\nSuites: bookworm\nComponents: {' '.join(NONFREE)}\nSigned-By: {GPG}\n"
    )
    assert "is configured multiple times" in apt_reads(old).stderr

    converge(etc, nonfree("bookworm", GPG))
    assert fields(etc / "sources.list.d/debian-nonfree.sources") == [
        {
            "Types": "deb",
            "URIs": DEBIAN,
            "Suites": "bookworm bookworm-updates",
            "Components": "contrib non-free",
            "Signed-By": GPG,
        }
    ]
    # the installer's security entry is another URI (security.debian.org): the role's suite there is whole
    assert fields(etc / "sources.list.d/debian-security-nonfree.sources")[0]["Components"] == " ".join(NONFREE)
    read = apt_reads(etc)
    assert (read.returncode, read.stderr) == (0, "")


def test_a_file_the_rigs_own_sources_make_needless_is_removed(tmp_path: Path) -> None:
    etc = rig_etc(tmp_path, {"sources.list": INSTALLER.format(r="bookworm")})
    converge(etc, nonfree("bookworm", GPG))
    assert (etc / "sources.list.d/debian-nonfree.sources").exists()
    # the owner enables contrib and non-free themselves: the kit's file goes, in check mode only when asked
    (etc / "sources.list").write_text(INSTALLER.format(r="bookworm").replace("non-free-firmware", " ".join(NONFREE)))
    checked = converge(etc, nonfree("bookworm", GPG), "--check")
    assert checked["changed"] and (etc / "sources.list.d/debian-nonfree.sources").exists()
    assert converge(etc, nonfree("bookworm", GPG))["changed"]
    assert not (etc / "sources.list.d/debian-nonfree.sources").exists()
    read = apt_reads(etc)
    assert (read.returncode, read.stderr) == (0, "")


def test_nvidias_own_cuda_keyring_list_is_reused_not_contradicted(tmp_path: Path) -> None:
    cuda = {
        "name": "nvidia-cuda",
        "uris": [CUDA],
        "suites": ["/"],
        "components": [],
        "signed_by": "/etc/apt/keyrings/nvidia-cuda.asc",
    }
    etc = rig_etc(tmp_path, {})
    converge(etc, [cuda])
    assert fields(etc / "sources.list.d/nvidia-cuda.sources")[0]["Signed-By"] == "/etc/apt/keyrings/nvidia-cuda.asc"
    # the owner installed NVIDIA's cuda-keyring package before the kit came: its list already has the repository
    (etc / "sources.list.d/cuda-debian12-x86_64.list").write_text(
        f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] {CUDA} /\n"
    )
    assert converge(etc, [cuda])["changed"]
    assert not (etc / "sources.list.d/nvidia-cuda.sources").exists()
    read = apt_reads(etc)
    assert (read.returncode, read.stderr) == (0, "")


def test_sources_apt_already_refuses_are_named_and_nothing_is_written(tmp_path: Path) -> None:
    etc = rig_etc(
        tmp_path,
        {
            "sources.list": f"deb [signed-by={GPG}] {DEBIAN} trixie main\n",
            "sources.list.d/mirror.sources": f"Types: deb\nURIs: {DEBIAN}/\nSuites: trixie\nSigned-By: /etc/k.gpg\n",
        },
    )
    result, printed = support.run_module("apt_sources", {"repositories": nonfree("trixie", PGP), "apt_dir": str(etc)})
    assert result.get("failed"), printed
    assert "different keyrings for http://deb.debian.org/debian trixie" in result["msg"]
    assert "/etc/k.gpg" in result["msg"] and "sources.list:1" in result["msg"]
    assert "apt-get update" in result["msg"]
    assert not (etc / "sources.list.d/debian-nonfree.sources").exists()


def test_parsers_read_what_apt_reads() -> None:
    lines = parse_one_line(
        "# comment\ndeb [ arch=amd64 signed-by=/k.gpg ] http://x/debian/ bookworm main contrib # tail\n"
        "deb-src http://x/debian bookworm main\ndeb cdrom:[Debian]/ bookworm main\n",
        "sources.list",
    )
    assert (lines[0].types, lines[0].uris, lines[0].suites, lines[0].components, lines[0].signed_by) == (
        ("deb",),
        ("http://x/debian/",),
        ("bookworm",),
        ("main", "contrib"),
        "/k.gpg",
    )
    assert lines[1].types == ("deb-src",) and lines[0].where == "sources.list:2"
    key = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEZ\n-----END PGP PUBLIC KEY BLOCK-----"
    stanzas = parse_deb822(
        "Types: deb\nURIs: http://a/ http://b/\nSuites: s1 s2\nComponents: main\nEnabled: no\n\n"
        "# a comment\nTypes: deb\nURIs: http://c/\nSuites: s\nComponents: main\nSigned-By:\n"
        " -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n mDMEZ\n -----END PGP PUBLIC KEY BLOCK-----\n",
        "x.sources",
    )
    assert stanzas[0].enabled is False and stanzas[0].uris == ("http://a/", "http://b/")
    assert stanzas[1].signed_by == key and stanzas[1].where == "x.sources:8"
    # an inline key the rig names is written back as deb822 continuation lines, and reads back the same
    stanza = plan(
        [DEBIAN],
        ["s"],
        ["contrib"],
        PGP,
        parse_deb822(
            f"Types: deb\nURIs: {DEBIAN}\nSuites: s\n"
            "Components: main\nSigned-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n mDMEZ\n"
            " -----END PGP PUBLIC KEY BLOCK-----\n",
            "y",
        ),
    )
    assert parse_deb822(render("n", stanza), "n")[0].signed_by == key
    with pytest.raises(SourcesError):
        plan(
            [DEBIAN],
            ["s"],
            ["contrib"],
            PGP,
            parse_one_line(f"deb [signed-by=/a] {DEBIAN} s main\ndeb [signed-by=/b] {DEBIAN}/ s main\n", "l"),
        )


def test_the_roles_repositories_go_through_apt_sources() -> None:
    """The driver and toolkit roles add their apt entries only through this module, never a fixed deb822 file."""
    for path in ("roles/nvidia_driver/tasks/setup-Debian.yml", "roles/cuda/tasks/main.yml"):
        text = (support.REPO / path).read_text()
        assert "deb822_repository" not in text, path
        assert any("apt_sources" in task for task in yaml.safe_load(text)), path
