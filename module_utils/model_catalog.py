"""The model catalog: which GGUF files the kit can deploy, and whether an entry may be deployed.

The catalog lives in inventory/group_vars/all/model_catalog.yml as the variable `model_catalog`,
a mapping from entry name to its fields. Hosts name entries; they never carry URLs or hashes.
"""

from __future__ import annotations

import re
from typing import Any

ROLES = ("target", "drafter")
REQUIRED_FIELDS = ("repo", "revision", "filename", "sha256", "size", "architecture", "role")
PIN_FIELDS = ("repo", "revision", "sha256", "size")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
REVISION_RE = re.compile(r"^[0-9a-f]{40}$")
CATALOG_PATH = "inventory/group_vars/all/model_catalog.yml"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class CatalogError(Exception):
    """A catalog entry is unknown, malformed or not deployable."""


def entry_problems(name: str, entry: Any) -> list[str]:
    """Everything wrong with one entry's shape (unpinned fields are not problems here)."""
    if not isinstance(entry, dict):
        return [f"{name}: must be a mapping of fields, found {type(entry).__name__}"]
    problems = [f"{name}: missing field '{field}'" for field in REQUIRED_FIELDS if field not in entry]
    if not NAME_RE.match(name):
        problems.append(f"{name}: entry names use letters, digits, '.', '_' and '-' only")
    if entry.get("role") not in ROLES:
        problems.append(f"{name}: role must be one of {', '.join(ROLES)}, found {entry.get('role')!r}")
    if not entry.get("filename") or not str(entry.get("filename")).endswith(".gguf"):
        problems.append(f"{name}: filename must name a .gguf file")
    if not entry.get("architecture"):
        problems.append(f"{name}: architecture (the GGUF's general.architecture) must be set")
    sha = entry.get("sha256")
    if sha is not None and not SHA256_RE.match(str(sha)):
        problems.append(f"{name}: sha256 must be 64 lowercase hex digits, found {sha!r}")
    revision = entry.get("revision")
    if revision is not None and not REVISION_RE.match(str(revision)):
        problems.append(f"{name}: revision must be a full 40-character commit (branches move), found {revision!r}")
    size = entry.get("size")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size <= 0):
        problems.append(f"{name}: size must be a positive number of bytes, found {size!r}")
    return problems


def catalog_problems(catalog: Any) -> list[str]:
    if not isinstance(catalog, dict) or not catalog:
        return ["model_catalog must be a non-empty mapping of entry names to entries"]
    problems: list[str] = []
    for name, entry in catalog.items():
        problems.extend(entry_problems(str(name), entry))
        pairs_with = entry.get("pairs_with") if isinstance(entry, dict) else None
        if pairs_with is not None and pairs_with not in catalog:
            problems.append(f"{name}: pairs_with names '{pairs_with}', which is not in the catalog")
    return problems


def catalog_entry(catalog: dict[str, Any], name: str) -> dict[str, Any]:
    """Look an entry up by name; an unknown name lists the known ones."""
    if name not in catalog:
        known = ", ".join(sorted(catalog))
        raise CatalogError(f"model '{name}' is not in the catalog ({CATALOG_PATH}). Known: {known}")
    problems = entry_problems(name, catalog[name])
    if problems:
        raise CatalogError("; ".join(problems))
    return dict(catalog[name], name=name)


def unpinned_fields(entry: dict[str, Any]) -> list[str]:
    return [field for field in PIN_FIELDS if entry.get(field) in (None, "")]


def deployable_entry(catalog: dict[str, Any], name: str, role: str | None = None) -> dict[str, Any]:
    """An entry that may be deployed: known, well formed, of the expected role and fully pinned."""
    entry = catalog_entry(catalog, name)
    if role is not None and entry["role"] != role:
        raise CatalogError(f"model '{name}' is a {entry['role']} in the catalog, but is used here as the {role}")
    missing = unpinned_fields(entry)
    if missing:
        pin = f"`make pin model={name} revision=<40-char commit of {entry.get('repo') or 'its repository'}>`"
        how = f"set its repo in {CATALOG_PATH}, then run {pin}" if "repo" in missing else f"run {pin}"
        raise CatalogError(
            f"model '{name}' is not pinned ({', '.join(missing)} missing); the kit never deploys an unverified file. "
            f"To pin it, {how}"
        )
    return entry
