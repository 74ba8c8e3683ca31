"""The kit's private directories (the model mirror's state, the Debian archive cache): created mode 0700, and refused
when another local user could change them (world-writable like /run/lock, a symlink, another owner, a parent anyone
can rename in), where that user could plant or swap what the kit reads and writes there."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rigkit import paths
from rigkit.paths import UnsafeDirectoryError, private_dir


def test_the_directory_is_created_private(tmp_path: Path) -> None:
    where = private_dir(tmp_path / "cache" / "run")
    assert where == tmp_path / "cache" / "run"
    assert stat.S_IMODE(os.lstat(where).st_mode) == 0o700
    assert private_dir(str(where) + "/") == where  # again, and with a trailing slash


def test_a_world_writable_directory_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "run"
    shared.mkdir()
    shared.chmod(0o1777)  # like /run/lock
    with pytest.raises(UnsafeDirectoryError, match=r"writable by others \(mode 1777\).*chmod 0700"):
        private_dir(shared)


def test_a_symlinked_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "run").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeDirectoryError, match="is a symlink: remove it"):
        private_dir(tmp_path / "run")


def test_a_directory_of_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "run").mkdir(mode=0o700)
    mine = os.geteuid()
    monkeypatch.setattr(paths.os, "geteuid", lambda: mine + 1)
    with pytest.raises(UnsafeDirectoryError, match=f"belongs to uid {mine}, not to this user"):
        private_dir(tmp_path / "run")


def test_a_parent_anyone_can_rename_in_is_refused(tmp_path: Path) -> None:
    open_parent = tmp_path / "cache"
    open_parent.mkdir()
    open_parent.chmod(0o777)  # no sticky bit: anyone could swap run/ for their own
    with pytest.raises(UnsafeDirectoryError, match="writable by everyone without the sticky bit"):
        private_dir(open_parent / "run")
