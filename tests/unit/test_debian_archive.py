"""Debian's archive on the controller (rigkit/validation/debian_archive.py) and the plan's `archive` / `next
kernel` rows, read from a real HTTP stand-in archive on loopback that serves xz-compressed Packages indexes in the
dists/ layout."""

from __future__ import annotations

import lzma
from collections.abc import Iterator
from pathlib import Path

import pytest

from rigkit.validation.compat import archive_report, plan_lines
from rigkit.validation.debian_archive import (
    Archive,
    ArchiveError,
    Stanza,
    dpkg_compare,
    kernel_abi,
    newest,
    parse_packages,
    split_version,
)
from tests.fixtures.debian_archive import COMPONENTS, KERNELS, PIN, StandInArchive, publish_bookworm
from tests.support import seed_values

HOUR = 3600.0


@pytest.fixture
def archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandInArchive]:
    """The stand-in, named by RIGKIT_DEBIAN_MIRROR / RIGKIT_DEBIAN_SECURITY_MIRROR, the cache under tmp_path."""
    standin = StandInArchive()
    monkeypatch.setenv("RIGKIT_DEBIAN_MIRROR", standin.url("debian"))
    monkeypatch.setenv("RIGKIT_DEBIAN_SECURITY_MIRROR", standin.url("debian-security"))
    monkeypatch.setenv("RIGKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("RIGKIT_DEBIAN_KEYRING", str(standin.keyring))
    yield standin
    standin.stop()


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def report(host: str, clock: Clock | None = None, **changes: object) -> tuple[list[str], list]:
    values = {**seed_values(host), **changes}
    found = archive_report(host, values, Archive(clock=clock or Clock()).index)
    return list(found.lines), list(found.findings)


# ------------------------------------------------------------------------------------ dpkg's order
@pytest.mark.parametrize(
    ("older", "newer"),
    [
        ("1.0~rc1", "1.0"),
        ("2.0", "1:0.9"),
        ("535.261.03-1", "535.309.01-0+deb12u1"),
        ("6.1.176-1", "6.1.192-3"),
        ("1.0~~", "1.0~"),
        ("1.0", "1.0a"),
        ("1.0a", "1.0+"),
        ("1.9", "1.10"),
        ("535.309.01-0+deb12u1", "535.309.01-0+deb12u2"),
        ("1.0-1", "1.0-1.1"),
    ],
)
def test_dpkg_orders_versions(older: str, newer: str):
    assert dpkg_compare(older, newer) < 0 and dpkg_compare(newer, older) > 0
    assert newest([newer, older]) == newest([older, newer]) == newer


def test_dpkg_equal_versions_and_parts():
    assert dpkg_compare("1.01", "1.1") == 0 and dpkg_compare("0:1.0", "1.0") == 0
    assert split_version("1:2.0-3-4") == (1, "2.0-3", "4")
    assert split_version("535.309.01") == (0, "535.309.01", "")


def test_packages_stanzas_and_the_kernel_a_metapackage_pulls():
    text = (
        "Package: linux-image-amd64\nSource: linux-signed-amd64 (6.1.192+3)\nVersion: 6.1.192-3\n"
        "Depends: linux-image-6.1.0-57-amd64 (= 6.1.192-3)\nDescription: Linux for\n 64-bit PCs\n\n"
        "Package: nvidia-driver\nVersion: 535.309.01-0+deb12u1\nDepends: nvidia-driver-bin (= 535.309.01-0+deb12u1),\n"
        " xserver-xorg-video-nvidia | nvidia-alternative:amd64\n"
    )
    found = parse_packages(text)
    assert kernel_abi(found["linux-image-amd64"][0]) == "6.1.0-57-amd64"
    assert found["nvidia-driver"][0].depends_on() == [
        "nvidia-driver-bin",
        "xserver-xorg-video-nvidia",
        "nvidia-alternative",
    ]
    assert kernel_abi(Stanza("linux-image-amd64", "1", "linux-image-amd64-signed-template")) is None


# ------------------------------------------------------------------------------------ the plan's rows
def test_a_pin_the_archive_carries_is_ok(archive: StandInArchive):
    publish_bookworm(archive)
    lines, findings = report("desktop3050")
    assert findings == []
    assert "  archive   Debian bookworm, the release whose non-free archive carries branch 535" in lines[0]
    assert f"            nvidia-driver {PIN} (bookworm-security/non-free) -> ok" in lines
    assert f"            nvidia-kernel-dkms {PIN} (bookworm-security/non-free) -> ok" in lines


def test_a_headless_rig_checks_the_compute_packages(archive: StandInArchive):
    publish_bookworm(archive)
    lines, findings = report("laptop1650ti")
    assert findings == []
    checked = [line.split()[0] for line in lines[1:] if line.endswith("-> ok") and not line.startswith("  next")]
    assert checked == ["nvidia-smi", "libcuda1", "nvidia-kernel-dkms"], lines


def test_a_dropped_pin_is_refused_with_the_version_to_move_to(archive: StandInArchive):
    publish_bookworm(archive, driver=("535.261.03-1", "535.320.01-0+deb12u1", "550.163.01-1"))
    lines, findings = report("desktop3050")
    assert (
        "            nvidia-driver=535.309.01-*: not in bookworm, bookworm-updates, bookworm-security -> refused"
        in ("\n".join(lines))
    ), lines
    [(variable, value, why)] = findings
    assert (variable, value) == ("nvidia_driver_version", "535.309.01")
    assert "no longer carries nvidia-driver, nvidia-kernel-dkms at 535.309.01" in why
    assert (
        '(branch 535\'s newest there is 535.320.01): set nvidia_driver_version: "535.320.01" in '
        "inventory/host_vars/desktop3050.yml, then make plan host=desktop3050 and make "
        "proof-nvidia-driver-dkms-debian12" in why
    ), why


def test_a_dropped_pin_with_no_build_of_its_branch_left(archive: StandInArchive):
    publish_bookworm(archive, driver=("550.163.01-1",))
    [(_, _, why)] = report("desktop3050")[1]
    assert "nor any build of branch 535" in why and "nvidia_driver_source: nvidia" in why


def test_the_next_kernel_the_receipt_built_is_ok(archive: StandInArchive):
    publish_bookworm(archive)
    lines, _ = report("desktop3050")
    [kernel] = [line for line in lines if line.startswith("  next kernel")]
    assert kernel.startswith("  next kernel  linux-image-amd64 6.1.192-3 (bookworm-security/main) installs 6.1.0-57")
    assert "-> ok: built by the receipt (reports/proofs/nvidia-driver-dkms-debian12.json)" in kernel


def test_a_next_kernel_the_receipt_does_not_list_is_a_warning(archive: StandInArchive):
    kernels = {**KERNELS, "bookworm-updates": ("6.1.200-1", "6.1.0-60-amd64")}
    publish_bookworm(archive, kernels=kernels)
    lines, findings = report("desktop3050")
    assert findings == []  # a warning, not a refusal
    [kernel] = [line for line in lines if line.startswith("  next kernel")]
    assert "linux-image-amd64 6.1.200-1 (bookworm-updates/main) installs 6.1.0-60-amd64" in kernel
    assert "warning: no known-good module (the receipt lists 6.1.0-47-amd64, 6.1.0-50-amd64, 6.1.0-57-amd64)" in kernel
    assert kernel.endswith("re-run make proof-nvidia-driver-dkms-debian12")


def test_a_followed_branch_has_no_pin_to_check_and_says_what_the_rig_gets(archive: StandInArchive):
    publish_bookworm(archive)
    lines, findings = report("desktop3050", nvidia_driver_version="")
    assert findings == []
    assert (
        'not checked: nvidia_driver_version "" follows branch 535 (the rig keeps the build it has; a new rig gets '
        "the archive's newest, recorded in the lock)" in "\n".join(lines)
    )


def test_a_rig_on_nvidias_repository_is_not_checked(archive: StandInArchive):
    lines, findings = report("desktop3050", nvidia_driver_source="nvidia")
    assert findings == [] and archive.requests == []
    assert (
        lines[0]
        == "  archive   not checked: nvidia_driver_source is 'nvidia': the driver does not come from Debian's archive"
    )


def test_the_plan_shows_the_archive_rows_after_its_own(archive: StandInArchive):
    publish_bookworm(archive)
    values = seed_values("desktop3050")
    found = archive_report("desktop3050", values, Archive(clock=Clock()).index)
    lines = plan_lines("desktop3050", values, archive=found)
    assert lines[-len(found.lines) :] == list(found.lines) and lines[0].startswith("desktop3050: NVIDIA")


# ------------------------------------------------------------------------------------ fetching and the cache
def test_the_cache_is_used_within_its_window_and_refetched_after(archive: StandInArchive):
    publish_bookworm(archive)
    clock = Clock()
    mirror = archive.url("debian-security")
    first = Archive(clock=clock).index(mirror, "bookworm-security", "non-free")
    assert first.versions("nvidia-driver") == [PIN] and len(archive.requests) == 2  # the index and its InRelease
    clock.now += 5 * HOUR
    again = Archive(clock=clock).index(mirror, "bookworm-security", "non-free")
    assert again.versions("nvidia-driver") == [PIN] and len(archive.requests) == 2 and again.note is None
    clock.now += 2 * HOUR
    archive.publish("debian-security", "bookworm-security", "non-free", [{"Package": "nvidia-driver", "Version": "9"}])
    later = Archive(clock=clock).index(mirror, "bookworm-security", "non-free")
    assert later.versions("nvidia-driver") == ["9"] and len(archive.requests) == 4


def test_one_plan_run_reads_each_index_once(archive: StandInArchive):
    publish_bookworm(archive)
    report("desktop3050")
    assert len(archive.requests) == len(set(archive.requests)) == 3 * len(COMPONENTS) + 3  # and 3 suites' InRelease


def test_an_unreachable_archive_with_a_cache_uses_it_and_says_its_age(archive: StandInArchive):
    publish_bookworm(archive)
    clock = Clock()
    report("desktop3050", clock)
    archive.stop()
    clock.now += 7 * HOUR
    lines, findings = report("desktop3050", clock)
    assert findings == [] and f"            nvidia-driver {PIN} (bookworm-security/non-free) -> ok" in lines
    notes = [line for line in lines if "note:" in line]
    assert notes and all("the archive is unreachable" in n and "using the copy fetched 7 h ago" in n for n in notes)


def test_an_unreachable_archive_without_a_cache_cannot_check(archive: StandInArchive):
    archive.stop()
    mirror = archive.url("debian")
    with pytest.raises(ArchiveError, match=r"^cannot check bookworm/main: the archive is unreachable"):
        Archive(clock=Clock()).index(mirror, "bookworm", "main")
    lines, findings = report("desktop3050")
    assert findings == []  # nothing is refused on what could not be read
    assert any(
        "nvidia-driver=535.309.01-*: not in what could be read: cannot check bookworm/contrib:" in line
        for line in lines
    )
    assert any(
        line.startswith("  next kernel  cannot check bookworm/main: the archive is unreachable") for line in lines
    ), lines


def test_a_corrupt_download_is_an_error_and_keeps_the_cached_copy(archive: StandInArchive, tmp_path: Path):
    path = archive.publish("debian", "bookworm", "main", [{"Package": "linux-image-amd64", "Version": "1"}])
    clock = Clock()
    mirror = archive.url("debian")
    Archive(clock=clock).index(mirror, "bookworm", "main")
    [kept] = (tmp_path / "cache" / "archive").glob("*.xz")
    before = kept.read_bytes()
    archive.files[path] = archive.files[path][:-20]  # truncated
    archive.sign("debian", "bookworm")  # as its InRelease lists it: the download verifies, and does not decompress
    clock.now += 7 * HOUR
    stale = Archive(clock=clock).index(mirror, "bookworm", "main")
    assert stale.versions("linux-image-amd64") == ["1"] and kept.read_bytes() == before
    assert "the xz download is truncated or corrupt" in str(stale.note) and "7 h ago" in str(stale.note)
    kept.unlink()
    with pytest.raises(ArchiveError, match=r"cannot check bookworm/main: the xz download is truncated or corrupt"):
        Archive(clock=clock).index(mirror, "bookworm", "main")


def test_a_mirror_without_xz_is_read_as_gz(archive: StandInArchive):
    archive.publish("debian", "bookworm", "non-free", [{"Package": "nvidia-smi", "Version": PIN}], compression="gz")
    index = Archive(clock=Clock()).index(archive.url("debian"), "bookworm", "non-free")
    assert index.versions("nvidia-smi") == [PIN]
    assert [p.rsplit("/", 1)[-1] for p in archive.requests] == ["Packages.xz", "Packages.gz", "InRelease"]


def test_an_index_missing_from_the_mirror_says_what_to_check(archive: StandInArchive):
    with pytest.raises(ArchiveError, match=r"Packages.xz \(nor .gz\) is not on the mirror: check the suite"):
        Archive(clock=Clock()).index(archive.url("debian"), "bookworm", "non-free")


def test_make_status_notes_a_next_kernel_without_a_module_and_a_dropped_pin(
    archive: StandInArchive, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """`make status` adds the archive's word on each GPU rig under its table; a sandbox rig (CPU) reads nothing."""
    from rigkit.cli.plan import archive_notes
    from rigkit.fleet.status import render

    publish_bookworm(archive)
    assert archive_notes(["desktop3050", "sandbox"]) == []
    read = len(archive.requests)
    assert archive_notes(["sandbox"]) == [] and len(archive.requests) == read  # no index read for a CPU rig

    kernels = {**KERNELS, "bookworm-updates": ("6.1.200-1", "6.1.0-60-amd64")}
    publish_bookworm(archive, driver=("535.320.02-0+deb12u1",), kernels=kernels)
    monkeypatch.setenv("RIGKIT_CACHE_DIR", str(tmp_path / "fresh-cache"))
    notes = archive_notes(["desktop3050"])
    assert any(note.startswith("desktop3050: nvidia_driver_version is '535.309.01': ") for note in notes), notes
    assert (
        "desktop3050: the archive's next kernel 6.1.0-60-amd64 has no known-good NVIDIA module "
        "(`make plan host=desktop3050`)"
    ) in notes
    table = render([], notes)
    assert all(note in table for note in notes)


# ------------------------------------------------------------------------------------ what is trusted
def test_an_index_is_trusted_only_as_its_signed_inrelease_lists_it(archive: StandInArchive, tmp_path: Path):
    """A mirror (or anyone on the plain-http path) that changes an index, or signs its own InRelease, is refused;
    the copy kept from before stays in use, saying why."""
    path = archive.publish("debian", "bookworm", "non-free", [{"Package": "nvidia-smi", "Version": PIN}])
    mirror, clock = archive.url("debian"), Clock()
    assert Archive(clock=clock).index(mirror, "bookworm", "non-free").versions("nvidia-smi") == [PIN]
    clock.now += 7 * HOUR
    forged = lzma.compress(b"Package: nvidia-smi\nVersion: 999\n")
    archive.files[path] = forged  # the InRelease still lists the real one
    stale = Archive(clock=clock).index(mirror, "bookworm", "non-free")
    assert stale.versions("nvidia-smi") == [PIN], stale.note
    assert "lists non-free/binary-amd64/Packages.xz with sha256" in str(
        stale.note
    ) and "a changed or corrupt copy" in str(stale.note)
    archive.signer = "attacker"
    archive.sign("debian", "bookworm")  # an InRelease that lists the forged index, signed by another key
    stale = Archive(clock=clock).index(mirror, "bookworm", "non-free")
    assert stale.versions("nvidia-smi") == [PIN] and "InRelease: InRelease is not signed by a key of" in str(stale.note)
    for kept in (tmp_path / "cache" / "archive").glob("*.xz"):
        kept.unlink()
    with pytest.raises(ArchiveError, match=r"cannot check bookworm/non-free: .*InRelease is not signed by a key of"):
        Archive(clock=clock).index(mirror, "bookworm", "non-free")


def test_an_expired_inrelease_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A replayed, once-valid InRelease (bookworm-security's carries a Valid-Until a week ahead) is stale."""
    standin = StandInArchive(valid_until=-60)
    monkeypatch.setenv("RIGKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("RIGKIT_DEBIAN_KEYRING", str(standin.keyring))
    try:
        standin.publish("debian-security", "bookworm-security", "non-free", [{"Package": "nvidia-smi", "Version": PIN}])
        with pytest.raises(ArchiveError, match=r"InRelease: InRelease expired on "):
            Archive().index(standin.url("debian-security"), "bookworm-security", "non-free")
        standin.valid_until = 7 * 24 * HOUR
        standin.sign("debian-security", "bookworm-security")
        assert Archive().index(standin.url("debian-security"), "bookworm-security", "non-free").versions(
            "nvidia-smi"
        ) == [PIN]
    finally:
        standin.stop()


def test_an_index_that_inflates_past_the_bound_is_refused(archive: StandInArchive):
    """A small xz that inflates past MAX_TEXT_BYTES (256 MiB): refused at the bound, never inflated whole."""
    bomb = lzma.compress(bytes(300 << 20), preset=1)
    assert len(bomb) < 200_000
    archive.files["debian/dists/bookworm/main/binary-amd64/Packages.xz"] = bomb
    archive.sign("debian", "bookworm")  # listed in a good InRelease: only the bound stops it
    with pytest.raises(ArchiveError, match=r"decompresses to more than 256 MiB: not an index"):
        Archive(clock=Clock()).index(archive.url("debian"), "bookworm", "main")
