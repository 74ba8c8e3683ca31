"""model_fetch against hostile local files and slow servers (issue 15, items 3 and 11)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ansible.module_utils.model_fetch import DownloadError, FetchError, fetch_model

from tests.fixtures.hf_standin import Fault, HfStandin
from tests.unit.test_model_fetch import (  # noqa: F401 - fixtures used by name
    Served,
    hub,
    medium,
    models,
    options,
    part_of,
    sha256,
    tiny,
)


# ------------------------------------------------------------------------------------------ item 3: planted links
def test_dangling_symlink_at_the_part_is_refused_not_followed(
    hub: HfStandin, tiny: Served, models: Path, tmp_path: Path
) -> None:
    tiny.publish(hub)
    dest = models / tiny.filename
    outside = tmp_path / "outside" / "planted.bin"
    outside.parent.mkdir()
    part_of(dest).symlink_to(outside)
    with pytest.raises(FetchError, match="is a symlink"):
        fetch_model(tiny.entry(), dest, options(hub))
    assert not outside.exists() and not dest.exists() and not dest.is_symlink()
    assert hub.requests == []


def test_symlink_at_the_part_to_an_existing_file_is_refused(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    dest = models / tiny.filename
    victim = models.parent / "victim.txt"
    victim.write_bytes(b"keep me")
    part_of(dest).symlink_to(victim)
    with pytest.raises(FetchError, match="is a symlink"):
        fetch_model(tiny.entry(), dest, options(hub))
    assert victim.read_bytes() == b"keep me"


def test_fifo_at_the_part_is_refused_without_hanging(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    dest = models / tiny.filename
    os.mkfifo(part_of(dest))
    with pytest.raises(FetchError, match="not a regular file"):
        fetch_model(tiny.entry(), dest, options(hub))


def test_symlink_at_the_lock_is_refused(hub: HfStandin, tiny: Served, models: Path, tmp_path: Path) -> None:
    tiny.publish(hub)
    dest = models / tiny.filename
    (models / ".rigkit-verified").mkdir()
    target = tmp_path / "lock-target"
    (models / ".rigkit-verified" / f"{tiny.filename}.lock").symlink_to(target)
    with pytest.raises(FetchError, match="lock file"):
        fetch_model(tiny.entry(), dest, options(hub))
    assert not target.exists()


def test_final_path_that_is_a_symlink_is_not_trusted(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    dest = models / tiny.filename
    elsewhere = models.parent / "elsewhere.gguf"
    elsewhere.write_bytes(tiny.path.read_bytes())  # even the right bytes: not the kit's file
    dest.symlink_to(elsewhere)
    with pytest.raises(FetchError, match="is a symlink"):
        fetch_model(tiny.entry(), dest, options(hub))


def test_installed_file_is_a_regular_file(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    dest = models / tiny.filename
    part_of(dest).write_bytes(b"")  # an empty part of the same name: replaced, not opened through
    fetch_model(tiny.entry(), dest, options(hub))
    assert dest.is_file() and not dest.is_symlink() and sha256(dest) == tiny.sha256
