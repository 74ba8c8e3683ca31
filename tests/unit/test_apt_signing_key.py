"""Repository signing keys are pinned by fingerprint (issue 15, item 7): a real OpenPGP key made by gpg,
served on loopback, is installed only when its fingerprint is the pinned one."""

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
from ansible.module_utils.openpgp_key import KeyFileError, normalise_fingerprint, primary_fingerprints

from tests import support

REPO = Path(__file__).resolve().parents[2]


def gpg(home: Path, *args: str) -> bytes:
    found = shutil.which("gpg")
    if found is None:
        pytest.fail("gpg is not installed: apt-get install gnupg to run the signing-key tests")
    return subprocess.run(
        [found, "--homedir", str(home), "--batch", "--yes", *args], capture_output=True, check=True, timeout=120
    ).stdout


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two real keys (one RSA, one ed25519), exported armored and binary, with gpg's own fingerprints."""
    home = tmp_path_factory.mktemp("gnupg")
    os.chmod(home, 0o700)
    out = tmp_path_factory.mktemp("keys")
    made: dict[str, Any] = {}
    for name, algo in (("vendor", "rsa2048"), ("attacker", "ed25519")):
        gpg(home, "--passphrase", "", "--quick-gen-key", f"{name} <{name}@example.invalid>", algo, "sign", "never")
        listing = gpg(home, "--with-colons", "--fingerprint", f"{name}@example.invalid").decode()
        fpr = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
        (out / f"{name}.asc").write_bytes(gpg(home, "--armor", "--export", f"{name}@example.invalid"))
        (out / f"{name}.gpg").write_bytes(gpg(home, "--export", f"{name}@example.invalid"))
        made[name] = fpr
    made["dir"] = out
    return made


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
            assert primary_fingerprints((keys["dir"] / f"{name}.{ext}").read_bytes()) == [keys[name]]
    assert normalise_fingerprint("9dc8 5822 9fc7 dd38 854a  e2d8 8d81 803c 0ebf cd88") == (
        "9DC858229FC7DD38854AE2D88D81803C0EBFCD88"
    )


@pytest.mark.parametrize("data", [b"<html>not found</html>", b"", b"\xff" * 64])
def test_not_a_key_is_refused(data: bytes) -> None:
    with pytest.raises(KeyFileError):
        primary_fingerprints(data)


def run_module(args: dict[str, Any]) -> dict[str, Any]:
    return support.run_module("apt_signing_key", args)[0]


def test_module_installs_the_pinned_key_and_refuses_another(keys: dict[str, Any], served: str, tmp_path: Path) -> None:
    dest = tmp_path / "keyrings" / "vendor.asc"
    pinned = [" ".join(keys["vendor"][i : i + 4] for i in range(0, 40, 4)).lower()]  # as vendors print it
    first = run_module({"url": f"{served}/vendor.asc", "fingerprints": pinned, "dest": str(dest)})
    assert not first.get("failed"), first.get("msg")
    assert first["changed"] and first["fingerprints"] == [keys["vendor"]]
    assert dest.read_bytes() == (keys["dir"] / "vendor.asc").read_bytes()
    assert oct(dest.stat().st_mode & 0o777) == "0o644"
    again = run_module({"url": f"{served}/vendor.asc", "fingerprints": pinned, "dest": str(dest)})
    assert again["changed"] is False

    swapped = run_module({"url": f"{served}/attacker.gpg", "fingerprints": pinned, "dest": str(dest)})
    assert swapped["failed"] and "refusing the signing key" in swapped["msg"] and keys["attacker"] in swapped["msg"]
    assert dest.read_bytes() == (keys["dir"] / "vendor.asc").read_bytes()  # the good key stays

    short = run_module({"url": f"{served}/vendor.asc", "fingerprints": [keys["vendor"][-8:]], "dest": str(dest)})
    assert short["failed"] and "not key ids" in short["msg"]
    missing = run_module({"url": f"{served}/nope.asc", "fingerprints": pinned, "dest": str(tmp_path / "x.asc")})
    assert missing["failed"] and "HTTP 404" in missing["msg"] and not (tmp_path / "x.asc").exists()


# The NVIDIA repositories' keys (issue 15, item 7): each role pins its key in its defaults and passes the
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
    assert defaults[variable] == [fingerprint]  # pinned in the role's defaults, the full fingerprint
    dest = tmp_path / "nvidia.asc"
    dest.write_bytes(b"the key installed by an earlier run\n")
    refused = run_module(
        {
            "url": f"{served}/vendor.asc",  # a real key, but not NVIDIA's
            "fingerprints": defaults[variable],
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
    assert dest.read_bytes() == (keys["dir"] / "vendor.asc").read_bytes()


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
        repo = names.index("ansible.builtin.deb822_repository")
        assert fetch < repo, role
        key_task, repo_task = tasks[fetch]["apt_signing_key"], tasks[repo]["ansible.builtin.deb822_repository"]
        assert key_task["dest"] == repo_task["signed_by"], role
        assert key_task.get("fingerprints_variable"), role
