"""Repository signing keys are pinned by fingerprint: a real OpenPGP key made by gpg,
served on loopback, is installed only when its fingerprint is the pinned one; a file holding the vendor's key
and then another is refused, and only the checked key is ever written, proven with gpgv
signatures made by both keys."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.module_utils.nvidia_compat import cuda_repo_key
from ansible.module_utils.openpgp_key import (
    KeyFileError,
    Packet,
    PublicKey,
    normalise_fingerprint,
    read_public_key,
)

from tests import support

REPO = Path(__file__).resolve().parents[2]


def gpg(home: Path, *args: str, input: bytes | None = None) -> bytes:
    found = shutil.which("gpg")
    if found is None:
        pytest.fail("gpg is not installed: apt-get install gnupg to run the signing-key tests")
    return subprocess.run(
        [found, "--homedir", str(home), "--batch", "--yes", *args],
        input=input,
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two real keys (one RSA, one ed25519; the attacker's with a signing subkey too), exported armored and
    binary, with gpg's own fingerprints, and a detached signature of the same file by each (the attacker's by
    its subkey): what apt's gpgv checks a repository's Release file with."""
    home = tmp_path_factory.mktemp("gnupg")
    os.chmod(home, 0o700)
    out = tmp_path_factory.mktemp("keys")
    made: dict[str, Any] = {"home": home, "dir": out}
    (out / "Release").write_bytes(b"Origin: a repository\nSuite: stable\n")
    for name, algo in (("vendor", "rsa2048"), ("attacker", "ed25519")):
        uid = f"{name}@example.invalid"
        gpg(home, "--passphrase", "", "--quick-gen-key", f"{name} <{uid}>", algo, "sign", "never")
        listing = gpg(home, "--with-colons", "--fingerprint", uid).decode()
        fpr = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
        signer = fpr
        if name == "attacker":
            gpg(home, "--passphrase", "", "--quick-add-key", fpr, "ed25519", "sign", "never")
            listing = gpg(home, "--with-colons", "--with-subkey-fingerprints", "--fingerprint", uid).decode()
            signer = [line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:")][1]
            made["attacker_subkey"] = signer
        (out / f"{name}.asc").write_bytes(gpg(home, "--armor", "--export", uid))
        (out / f"{name}.gpg").write_bytes(gpg(home, "--export", uid))
        gpg(home, "--local-user", f"{signer}!", "--output", str(out / f"Release.{name}.sig"), "--detach-sign",
            str(out / "Release"))  # fmt: skip
        made[name] = fpr
    # What a compromised vendor web host serves: the vendor's key, then the attacker's (armored, or binary).
    (out / "vendor-then-attacker.asc").write_bytes(
        (out / "vendor.asc").read_bytes() + (out / "attacker.asc").read_bytes()
    )
    (out / "vendor-then-attacker.gpg").write_bytes(
        (out / "vendor.gpg").read_bytes() + (out / "attacker.gpg").read_bytes()
    )
    return made


def keyring(keys: dict[str, Any], key_file: Path, tmp_path: Path) -> Path:
    """A binary keyring of every armor block in ``key_file``, as apt reads an .asc signed-by file."""
    text = key_file.read_bytes()
    end = b"-----END PGP PUBLIC KEY BLOCK-----"
    blocks = [block + end + b"\n" for block in text.split(end) if block.strip()]
    ring = tmp_path / f"{key_file.name}.keyring.gpg"
    ring.write_bytes(b"".join(gpg(keys["home"], "--dearmor", input=block) for block in blocks))
    return ring


def gpgv_accepts(keys: dict[str, Any], ring: Path, signer: str) -> bool:
    """Whether gpgv, with only ``ring`` as its keyring, finds a good signature of the Release file by ``signer``."""
    found = shutil.which("gpgv")
    if found is None:
        pytest.fail("gpgv is not installed: apt-get install gpgv to run the signing-key tests")
    sig, data = keys["dir"] / f"Release.{signer}.sig", keys["dir"] / "Release"
    done = subprocess.run([found, "--keyring", str(ring), str(sig), str(data)], capture_output=True, check=False)
    return done.returncode == 0 and b"Good signature" in done.stderr


@pytest.fixture(scope="module")
def served(keys: dict[str, Any]) -> Iterator[str]:
    handler = partial(SimpleHTTPRequestHandler, directory=str(keys["dir"]))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_fingerprints_match_gpg(keys: dict[str, Any]) -> None:
    for name in ("vendor", "attacker"):
        for ext in ("asc", "gpg"):
            assert read_public_key((keys["dir"] / f"{name}.{ext}").read_bytes()).fingerprint == keys[name]
    assert normalise_fingerprint("9dc8 5822 9fc7 dd38 854a  e2d8 8d81 803c 0ebf cd88") == (
        "9DC858229FC7DD38854AE2D88D81803C0EBFCD88"
    )


@pytest.mark.parametrize("data", [b"<html>not found</html>", b"", b"\xff" * 64])
def test_not_a_key_is_refused(data: bytes) -> None:
    with pytest.raises(KeyFileError):
        read_public_key(data)


def run_module(args: dict[str, Any]) -> dict[str, Any]:
    return support.run_module("apt_signing_key", args)[0]


def test_module_installs_the_pinned_key_and_refuses_another(keys: dict[str, Any], served: str, tmp_path: Path) -> None:
    dest = tmp_path / "keyrings" / "vendor.asc"
    pinned = [" ".join(keys["vendor"][i : i + 4] for i in range(0, 40, 4)).lower()]  # as vendors print it
    first = run_module({"url": f"{served}/vendor.asc", "fingerprints": pinned, "dest": str(dest)})
    assert not first.get("failed"), first.get("msg")
    assert first["changed"] and first["fingerprints"] == [keys["vendor"]]
    assert dest.read_bytes() == read_public_key((keys["dir"] / "vendor.asc").read_bytes()).armored()
    assert oct(dest.stat().st_mode & 0o777) == "0o644"
    again = run_module({"url": f"{served}/vendor.asc", "fingerprints": pinned, "dest": str(dest)})
    assert again["changed"] is False

    swapped = run_module({"url": f"{served}/attacker.gpg", "fingerprints": pinned, "dest": str(dest)})
    assert swapped["failed"] and "refusing the signing key" in swapped["msg"] and keys["attacker"] in swapped["msg"]
    assert dest.read_bytes() == read_public_key((keys["dir"] / "vendor.asc").read_bytes()).armored()  # kept

    short = run_module({"url": f"{served}/vendor.asc", "fingerprints": [keys["vendor"][-8:]], "dest": str(dest)})
    assert short["failed"] and "not key ids" in short["msg"]
    missing = run_module({"url": f"{served}/nope.asc", "fingerprints": pinned, "dest": str(tmp_path / "x.asc")})
    assert missing["failed"] and "HTTP 404" in missing["msg"] and not (tmp_path / "x.asc").exists()


# --- a key file with a second key -------------------------------------------------------------------------------
def test_a_file_with_the_vendors_key_then_another_is_refused(keys: dict[str, Any], served: str, tmp_path: Path) -> None:
    """The attack: the file starts with the pinned key, so checking its first block passes; apt trusts every
    block, so installing the whole file lets the second key sign the repository."""
    both = keys["dir"] / "vendor-then-attacker.asc"
    whole = keyring(keys, both, tmp_path)
    assert gpgv_accepts(keys, whole, "attacker")  # what the whole file, once installed, would let in
    dest = tmp_path / "keyrings" / "vendor.asc"
    dest.parent.mkdir()
    dest.write_bytes(b"the key installed by an earlier run\n")
    for name in ("vendor-then-attacker.asc", "vendor-then-attacker.gpg"):
        refused = run_module({"url": f"{served}/{name}", "fingerprints": [keys["vendor"]], "dest": str(dest)})
        installed = dest.read_bytes()
        if installed.startswith(b"-----BEGIN"):  # an armored keyring: the file as served
            assert not gpgv_accepts(keys, keyring(keys, dest, tmp_path), "attacker"), name
        else:
            assert not gpgv_accepts(keys, dest, "attacker"), name
        assert refused.get("failed"), (name, refused)
        assert installed == b"the key installed by an earlier run\n", name  # untouched
        expected = "a second armor block after the first" if name.endswith(".asc") else "2 primary keys in one file"
        assert expected in refused["msg"], refused
        if name.endswith(".gpg"):
            assert keys["attacker"] in refused["msg"], refused  # the second key, named
        assert "Nothing was installed" in refused["msg"], refused
    # The vendor's file alone: what is installed verifies the vendor's signature and nothing else.
    accepted = run_module({"url": f"{served}/vendor.asc", "fingerprints": [keys["vendor"]], "dest": str(dest)})
    assert not accepted.get("failed"), accepted.get("msg")
    ring = keyring(keys, dest, tmp_path)
    assert gpgv_accepts(keys, ring, "vendor") and not gpgv_accepts(keys, ring, "attacker")


def test_only_the_checked_packets_are_written(keys: dict[str, Any], tmp_path: Path) -> None:
    """Armor headers and the original framing are not carried over; what gpg reads back is the same key."""
    original = (keys["dir"] / "vendor.asc").read_bytes()
    with_headers = original.replace(
        b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n", b"-----BEGIN PGP PUBLIC KEY BLOCK-----\nComment: anything\n"
    )
    key = read_public_key(with_headers)
    assert key.fingerprint == keys["vendor"] and key == read_public_key((keys["dir"] / "vendor.gpg").read_bytes())
    written = key.armored()
    assert b"Comment" not in written and read_public_key(written) == key
    shown = gpg(keys["home"], "--show-keys", "--with-colons", input=written).decode()
    assert [line.split(":")[9] for line in shown.splitlines() if line.startswith("fpr:")] == [keys["vendor"]]


def test_a_grafted_subkey_is_not_trusted_by_gpgv(keys: dict[str, Any], tmp_path: Path) -> None:
    """What one-key parsing leaves to OpenPGP itself: a subkey appended to the vendor's key passes the framing
    check (one primary key), but its binding signature is not the vendor's, so gpgv never trusts it."""
    vendor = read_public_key((keys["dir"] / "vendor.gpg").read_bytes())
    attacker = read_public_key((keys["dir"] / "attacker.gpg").read_bytes())
    at = next(i for i, packet in enumerate(attacker.packets) if packet.tag == 14)
    grafted = PublicKey(vendor.fingerprint, vendor.packets + attacker.packets[at : at + 2])
    assert read_public_key(grafted.binary()) == grafted  # accepted as one key...
    ring = tmp_path / "grafted.gpg"
    ring.write_bytes(grafted.binary())
    assert not gpgv_accepts(keys, ring, "attacker")  # ...whose stolen subkey signs nothing


@pytest.mark.parametrize(
    ("mangle", "expected"),
    [
        (lambda asc, gpgkey: asc + b"trailing words\n", "more bytes after the first armor block"),
        (lambda asc, gpgkey: b"hello\n" + asc, "before the armor block"),
        (lambda asc, gpgkey: gpgkey + b"junk", "trailing data after the key"),
        (lambda asc, gpgkey: gpgkey[:-3], "truncated packet"),
        (lambda asc, gpgkey: Packet(13, b"uid first").encoded() + gpgkey, "not with the public key"),
        (lambda asc, gpgkey: gpgkey + Packet(11, b"literal data").encoded(), "packets of type 11"),
        (lambda asc, gpgkey: asc.replace(b"\n=", b"\n=AAAA\n="), "data after the armor checksum line"),
        (lambda asc, gpgkey: asc[: asc.rindex(b"\n=") + 2] + b"AAAA" + asc[asc.rindex(b"\n=") + 6 :], "CRC-24"),
    ],
    ids=["text-after", "text-before", "binary-trailing", "truncated", "uid-first", "literal-packet", "two-crc", "crc"],
)
def test_anything_but_one_key_is_refused(keys: dict[str, Any], mangle: Any, expected: str) -> None:
    data = mangle((keys["dir"] / "vendor.asc").read_bytes(), (keys["dir"] / "vendor.gpg").read_bytes())
    with pytest.raises(KeyFileError, match=expected):
        read_public_key(data)


# The NVIDIA repositories' keys: each role pins its key in its defaults and passes the
# variable's name, so a substituted key is refused with a message naming the variable and both fingerprints.
NVIDIA_PINS = {
    "nvidia_container_toolkit": (
        "nvidia_container_toolkit_repo_key_fingerprints",
        "C95B321B61E88C1809C4F759DDCAE044F796ECB0",
    ),
    "cuda": ("cuda_repo_key_fingerprints", "EB693B3035CD5710E231E123A4B469963BF863CC"),
    "nvidia_driver": ("nvidia_driver_cuda_repo_key_fingerprints", "EB693B3035CD5710E231E123A4B469963BF863CC"),
}


@pytest.mark.parametrize("role", sorted(NVIDIA_PINS))
def test_nvidia_role_pins_refuse_another_key(role: str, keys: dict[str, Any], served: str, tmp_path: Path) -> None:
    variable, fingerprint = NVIDIA_PINS[role]
    defaults = yaml.safe_load((REPO / "roles" / role / "defaults/main.yml").read_text())
    pinned = defaults[variable]
    if isinstance(pinned, str):  # NVIDIA's CUDA trees each have their key: the one table, read through a filter
        assert "nvidia_cuda_repo_key" in pinned, pinned
        pinned = cuda_repo_key("debian12")["fingerprints"]
    assert pinned == [fingerprint]  # pinned, the full fingerprint
    dest = tmp_path / "nvidia.asc"
    dest.write_bytes(b"the key installed by an earlier run\n")
    refused = run_module(
        {
            "url": f"{served}/vendor.asc",  # a real key, but not NVIDIA's
            "fingerprints": pinned,
            "fingerprints_variable": variable,
            "dest": str(dest),
        }
    )
    assert refused["failed"], refused
    assert variable in refused["msg"] and fingerprint in refused["msg"] and keys["vendor"] in refused["msg"]
    assert dest.read_bytes() == b"the key installed by an earlier run\n"  # untouched
    # The same variable pinned to the key that is served: installed.
    accepted = run_module(
        {
            "url": f"{served}/vendor.asc",
            "fingerprints": [keys["vendor"]],
            "fingerprints_variable": variable,
            "dest": str(dest),
        }
    )
    assert not accepted.get("failed"), accepted.get("msg")
    assert read_public_key(dest.read_bytes()).fingerprint == keys["vendor"]


def test_role_tasks_install_the_key_before_the_repository_that_trusts_it() -> None:
    """Each role fetches its key with apt_signing_key into the very file its repository names as signed_by."""
    task_files = {
        "docker": "roles/docker/tasks/setup-Debian.yml",
        "nvidia_container_toolkit": "roles/nvidia_container_toolkit/tasks/setup-Debian.yml",
        "cuda": "roles/cuda/tasks/main.yml",
        "nvidia_driver": "roles/nvidia_driver/tasks/setup-Debian.yml",
    }
    for role, path in task_files.items():
        tasks = yaml.safe_load((REPO / path).read_text())
        names = [next(k for k in task if k not in ("name", "when", "register", "tags")) for task in tasks]
        fetch = names.index("apt_signing_key")
        module = "apt_sources" if "apt_sources" in names else "ansible.builtin.deb822_repository"
        repo = names.index(module)
        assert fetch < repo, role
        key_task, repo_task = tasks[fetch]["apt_signing_key"], tasks[repo][module]
        if module == "apt_sources":
            # the key goes to the signed_by of a repository the module is given (looped, or the one repository)
            listed = str(repo_task["repositories"]).strip("[]'\" {}")
            assert key_task["dest"] in ("{{ item.signed_by }}", "{{ " + listed + ".signed_by }}"), role
            assert listed in str(tasks[fetch].get("loop", key_task["dest"])), role
        else:
            assert key_task["dest"] == repo_task["signed_by"], role
        assert key_task.get("fingerprints_variable"), role
