"""Where the kit keeps what the controller reads and writes (all relative to the repository)."""

from __future__ import annotations

import os
from pathlib import Path

from rigkit import REPO

INVENTORY = REPO / "inventory" / "hosts.yml"
CATALOG = REPO / "inventory" / "group_vars" / "all" / "model_catalog.yml"
HOST_VARS = REPO / "inventory" / "host_vars"
BENCH_REPORTS = REPO / "reports" / "bench"
BENCH_SCHEMA = REPO / "roles" / "llama_bench" / "files" / "bench-report.schema.json"
# The entry point detached processes (the mirror) are started through: their command line names it.
RIGKIT_BIN = REPO / "bin" / "rigkit"


def cache_dir() -> Path:
    """The controller's cache: $RIGKIT_CACHE_DIR, else /var/cache/rigkit (as inventory/group_vars/all resolves it)."""
    return Path(os.environ.get("RIGKIT_CACHE_DIR") or "/var/cache/rigkit")


def inventory_sources() -> list[str]:
    """The inventory Ansible will read: $ANSIBLE_INVENTORY (comma-separated) when set, else ansible.cfg's."""
    sources = [part for part in os.environ.get("ANSIBLE_INVENTORY", "").split(",") if part]
    return [str(REPO / source) if not os.path.isabs(source) else source for source in sources] or [str(INVENTORY)]
