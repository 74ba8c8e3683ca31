"""Fixtures of the unit tests that download models: the stand-in hub (tests/fixtures/hf_standin.py), the GGUFs it
serves, a models directory, TLS files and a 1 MiB disk."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rigkit.sandbox.tiny_gemma4 import write_arch_gguf
from tests.fixtures.hf_standin import HfStandin, make_tls_files
from tests.support import MiB, Served, describe, unavailable


@pytest.fixture
def hub() -> Iterator[HfStandin]:
    with HfStandin() as server:
        yield server


@pytest.fixture(scope="session")
def tiny(tiny_gemma4_pair: tuple[Path, Path]) -> Served:
    return describe(tiny_gemma4_pair[0], "tiny-gemma4.gguf", "gemma4")


@pytest.fixture(scope="session")
def medium(tmp_path_factory: pytest.TempPathFactory) -> Served:
    """An 8 MiB gemma4-architecture GGUF, big enough for mid-body faults and the 1 % resend bound."""
    path = write_arch_gguf(tmp_path_factory.mktemp("medium") / "m.gguf", "gemma4", padding_bytes=8 * MiB, seed=7)
    return describe(path, "medium-gemma4.gguf", "gemma4")


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def models(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (needs root and mount rights; skipped with the reason otherwise)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True)
    except FileNotFoundError:
        unavailable("no mount command: cannot make a 1 MiB tmpfs for the disk-full tests")
    if done.returncode != 0:
        unavailable(f"cannot mount a 1 MiB tmpfs ({done.stderr.decode().strip()}): disk-full tests need root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
