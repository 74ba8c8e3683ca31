"""`make image`'s lock lives in a directory of the kit's own, not in world-writable /run/lock
where any local user could hold it (every provision that waits for the image then waits forever) or plant a
file make cannot open. The Makefile and the tests' wait name the same path."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rigkit import paths
from rigkit.paths import UnsafeDirectoryError, image_lock, private_dir
from tests.support import REPO


def _image_lock(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "bin" / "rigkit"), "image-lock"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("IMAGE_LOCK", "RIGKIT_CACHE_DIR")}
    env.update(extra)
    return env


def test_make_image_locks_under_the_kits_cache_not_run_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IMAGE_LOCK", raising=False)
    monkeypatch.setenv("RIGKIT_CACHE_DIR", str(tmp_path))
    made = _image_lock(_env(RIGKIT_CACHE_DIR=str(tmp_path)))
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == str(image_lock()) == f"{tmp_path}/run/llamacpp-image.lock"
    assert stat.S_IMODE(os.lstat(tmp_path / "run").st_mode) == 0o700
    monkeypatch.delenv("RIGKIT_CACHE_DIR")
    assert str(image_lock()) == "/var/cache/rigkit/run/llamacpp-image.lock"


def test_make_image_makes_the_lock_directory_private_before_it_locks() -> None:
    recipe = (REPO / "Makefile").read_text().split("\nimage:", 1)[1].split("\n\n", 1)[0]
    assert recipe.index('lock="$$($(BIN)/python bin/rigkit image-lock)" &&') < recipe.index('flock "$$lock"')


def test_the_lock_directory_is_created_private(tmp_path: Path) -> None:
    where = private_dir(tmp_path / "cache" / "run")
    assert where == tmp_path / "cache" / "run"
    assert stat.S_IMODE(os.lstat(where).st_mode) == 0o700
    assert private_dir(str(where) + "/") == where  # again, and make's $(dir) form with the slash


def test_a_world_writable_lock_directory_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "run"
    shared.mkdir()
    shared.chmod(0o1777)  # like /run/lock
    with pytest.raises(UnsafeDirectoryError, match=r"writable by others \(mode 1777\).*chmod 0700"):
        private_dir(shared)


def test_a_symlinked_lock_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "run").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeDirectoryError, match="is a symlink: remove it"):
        private_dir(tmp_path / "run")


def test_a_lock_directory_of_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
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


def test_the_cli_refuses_with_exit_2_and_says_what_to_do(tmp_path: Path) -> None:
    shared = tmp_path / "run"
    shared.mkdir()
    shared.chmod(0o777)
    done = _image_lock(_env(RIGKIT_CACHE_DIR=str(tmp_path)))
    assert done.returncode == 2 and not done.stdout
    assert "refusing the lock directory" in done.stderr and "chmod 0700" in done.stderr
    ok = _image_lock(_env(IMAGE_LOCK=str(tmp_path / "new" / "run" / "image.lock")))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == str(tmp_path / "new" / "run" / "image.lock")
