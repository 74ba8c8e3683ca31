"""Where the kit keeps what the controller reads and writes (all relative to the repository)."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rigkit import REPO

INVENTORY = REPO / "inventory" / "hosts.yml"
# The model catalog, as messages name it (relative to the repository) and as a path.
CATALOG_FILE = "inventory/group_vars/all/model_catalog.yml"
CATALOG = REPO / CATALOG_FILE
HOST_VARS = REPO / "inventory" / "host_vars"
BENCH_REPORTS = REPO / "reports" / "bench"
BENCH_SCHEMA = REPO / "roles" / "llama_bench" / "files" / "bench-report.schema.json"
# The entry point detached processes (the mirror) are started through: their command line names it.
RIGKIT_BIN = REPO / "bin" / "rigkit"


def cache_dir(configured: str | None = None) -> Path:
    """The controller's cache: ``configured`` (inventory/group_vars/all passes $RIGKIT_CACHE_DIR through the
    controller_cache_dir filter), else $RIGKIT_CACHE_DIR, else /var/cache/rigkit."""
    return Path(configured or os.environ.get("RIGKIT_CACHE_DIR") or "/var/cache/rigkit")


def model_cache(cache: str | os.PathLike[str]) -> str:
    """The models play's cache under the controller's cache ``cache``: the mirror's root, in the resolve/ layout."""
    return os.path.join(cache, "models")


def cached_model_path(cache: str | os.PathLike[str], entry: Mapping[str, Any]) -> str | None:
    """Where the models play caches a pinned entry on the controller: <cache>/models/<repo>/resolve/<revision>/<file>
    (None while the entry has no repo, revision or file name)."""
    if not all(entry.get(key) for key in ("repo", "revision", "filename")):
        return None
    return os.path.join(
        model_cache(cache), str(entry["repo"]), "resolve", str(entry["revision"]), str(entry["filename"])
    )


def lock_file(kit: str | os.PathLike[str] = REPO) -> str:
    """The fleet's lock file (roles/rig_lock's rig_lock_file): $RIGKIT_LOCK_FILE, else <kit>/inventory/rigs.lock.json,
    ``kit`` being the checkout whose playbooks run."""
    return os.environ.get("RIGKIT_LOCK_FILE") or os.path.join(kit, "inventory", "rigs.lock.json")


class UnsafeDirectoryError(Exception):
    """A directory for the kit's locks is not private to this user; the message says what to change."""


def private_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` as a directory only this user can change: created with mode 0700 (parents as the umask allows)
    when missing; refused when it is a symlink, not a directory, owned by another user, or writable by group or
    others, or when its parent is writable by others without the sticky bit (the directory could be replaced)."""
    where = Path(os.path.abspath(os.fspath(path)))
    where.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(where, 0o700)
    info = os.lstat(where)
    elsewhere = "or set RIGKIT_CACHE_DIR to a directory of your own"
    if not stat.S_ISDIR(info.st_mode):
        kind = "a symlink" if stat.S_ISLNK(info.st_mode) else "not a directory"
        raise UnsafeDirectoryError(f"{where} is {kind}: remove it and re-run ({elsewhere})")
    if info.st_uid != os.geteuid():
        raise UnsafeDirectoryError(
            f"{where} belongs to uid {info.st_uid}, not to this user ({os.geteuid()}): another user could replace "
            f"what the kit keeps in it (locks, the mirror's run files); remove it and re-run as the kit's user "
            f"({elsewhere})"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeDirectoryError(
            f"{where} is writable by others (mode {stat.S_IMODE(info.st_mode):04o}): any of them could replace "
            f"what the kit keeps in it (locks, the mirror's run files); run chmod 0700 {where} ({elsewhere})"
        )
    parent = os.stat(where.parent)
    if parent.st_mode & stat.S_IWOTH and not parent.st_mode & stat.S_ISVTX:
        raise UnsafeDirectoryError(
            f"{where.parent} is writable by everyone without the sticky bit: anyone could replace {where.name} in "
            "it; set RIGKIT_CACHE_DIR to a directory of your own"
        )
    return where


def inventory_sources() -> list[str]:
    """The inventory Ansible will read: $ANSIBLE_INVENTORY (comma-separated) when set, else ansible.cfg's."""
    sources = [part for part in os.environ.get("ANSIBLE_INVENTORY", "").split(",") if part]
    return [str(REPO / source) if not os.path.isabs(source) else source for source in sources] or [str(INVENTORY)]


def inventory_catalog() -> Path:
    """The model catalog of the inventory Ansible will read (its group_vars/all/model_catalog.yml), the kit's own
    when that inventory has none: what pinning on first use writes."""
    for source in inventory_sources():
        root = Path(source) if os.path.isdir(source) else Path(source).parent
        candidate = root / "group_vars" / "all" / "model_catalog.yml"
        if candidate.is_file():
            return candidate
    return CATALOG
