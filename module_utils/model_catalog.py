"""The model catalog: which GGUF files the kit can deploy, whether an entry may be deployed, and where it lives
on a rig (rig_model_path: the one spelling of that layout, for the models role's filters and the tests).

The catalog lives in inventory/group_vars/all/model_catalog.yml as the variable `model_catalog`,
a mapping from entry name to its fields. Hosts name entries; they never carry URLs or hashes.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from typing import Any

ROLES = ("target", "drafter")
ALIAS_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
REQUIRED_FIELDS = ("repo", "revision", "filename", "sha256", "size", "architecture", "role")
PIN_FIELDS = ("repo", "revision", "sha256", "size")
SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")
REVISION_RE = re.compile(r"^[0-9a-f]{40}\Z")
CATALOG_PATH = "inventory/group_vars/all/model_catalog.yml"
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*\Z")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")


class CatalogError(Exception):
    """A catalog entry is unknown, malformed or not deployable."""


def entry_problems(name: str, entry: Any) -> list[str]:
    """Everything wrong with one entry's shape (unpinned fields are not problems here)."""
    if not isinstance(entry, dict):
        return [f"{name}: must be a mapping of fields, found {type(entry).__name__}"]
    problems = [f"{name}: missing field '{field}'" for field in REQUIRED_FIELDS if field not in entry]
    if entry.get("role") not in ROLES:
        problems.append(f"{name}: role must be one of {', '.join(ROLES)}, found {entry.get('role')!r}")
    filename = str(entry.get("filename") or "")
    if not filename.endswith(".gguf"):
        problems.append(f"{name}: filename must name a .gguf file")
    parts = filename.split("/")
    if filename.startswith("/") or "\\" in filename or any(part in ("", ".", "..") for part in parts):
        problems.append(f"{name}: filename {filename!r} must be a plain relative path inside the repository")
    repo = entry.get("repo")
    if repo is not None and not REPO_RE.fullmatch(str(repo)):
        problems.append(f"{name}: repo must be of the form owner/name, found {repo!r}")
    if not entry.get("architecture"):
        problems.append(f"{name}: architecture (the GGUF's general.architecture) must be set")
    sha = entry.get("sha256")
    if sha is not None and not SHA256_RE.fullmatch(str(sha)):
        problems.append(f"{name}: sha256 must be 64 lowercase hex digits, found {sha!r}")
    revision = entry.get("revision")
    if revision is not None and not REVISION_RE.fullmatch(str(revision)):
        problems.append(f"{name}: revision must be a full 40-character commit (branches move), found {revision!r}")
    alias = entry.get("alias")
    if alias is not None and (entry.get("role") != "target" or not ALIAS_RE.fullmatch(str(alias))):
        problems.append(
            f"{name}: alias (the model name clients ask the fleet gateway for) is for a target only, in lowercase "
            f"letters, digits, '.', '_' and '-', found {alias!r}"
        )
    size = entry.get("size")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size <= 0):
        problems.append(f"{name}: size must be a positive number of bytes, found {size!r}")
    return problems


def catalog_problems(catalog: Any) -> list[str]:
    if not isinstance(catalog, dict) or not catalog:
        return ["model_catalog must be a non-empty mapping of entry names to entries"]
    problems: list[str] = []
    for name, entry in catalog.items():
        if not NAME_RE.fullmatch(str(name)):
            problems.append(f"{name}: entry names use letters, digits, '.', '_' and '-' only")
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


def pin_command(name: str) -> str:
    return f"make pin model={name}"


def host_pin_command(host: str) -> str:
    return f"make pin host={host}"


def check_deployable(name: str, entry: Any) -> dict[str, Any]:
    """One entry that may be deployed: well formed and fully pinned, else CatalogError saying how to fix it."""
    problems = entry_problems(name, entry)
    if problems:
        raise CatalogError(f"catalog entry {'; '.join(problems)} ({CATALOG_PATH})")
    missing = unpinned_fields(entry)
    if missing:
        repo = entry.get("repo")
        first = f"set its repo in {CATALOG_PATH}, then run" if "repo" in missing else "run"
        anchor = (
            "finds the newest commit of its repository holding the recorded sha256 and records that commit and size"
            if entry.get("sha256")
            else f"records the sha256 and size of the file at {repo or 'its repository'}'s main "
            "(revision=REF for another branch, tag or commit)"
        )
        raise CatalogError(
            f"model '{name}' is not pinned ({', '.join(missing)} missing); the kit never deploys an unverified file. "
            f"To pin it, {first} `{pin_command(name)}` on a machine that reaches Hugging Face: it {anchor}."
        )
    return dict(entry, name=name)


def host_pin_refusal(host: str, catalog: dict[str, Any], names: list[Any]) -> str:
    """Why ``host`` cannot be deployed for lack of pins, listing every unpinned entry it needs, or ''.

    Names that are unknown or malformed are left to the per-entry checks (catalog_entry / deployable_entry).
    """
    rows = []
    for name in dict.fromkeys(str(n) for n in names if n not in (None, "")):
        entry = catalog.get(name) if isinstance(catalog, dict) else None
        if not isinstance(entry, dict) or entry_problems(name, entry):
            continue
        missing = unpinned_fields(entry)
        if not missing:
            continue
        known = [field for field in ("sha256", "size") if entry.get(field) not in (None, "")]
        extra = f"; {' and '.join(known)} known" if known else ""
        repo_hint = f" — set its repo in {CATALOG_PATH} first" if "repo" in missing else ""
        rows.append(
            f"  - {name} ({entry.get('role')}, {entry.get('repo') or 'no repo'}): {', '.join(missing)} missing"
            f"{extra}{repo_hint}"
        )
    if not rows:
        return ""
    return (
        f"{host} needs {len(rows)} model(s) that are not pinned yet (the kit never deploys an unverified file):\n"
        + "\n".join(rows)
        + f"\nPin them all on a machine that reaches Hugging Face (HF_TOKEN for gated repositories), "
        f"then re-run:\n  {host_pin_command(host)}"
    )


def usable_entry(catalog: dict[str, Any], name: str, role: str | None = None) -> dict[str, Any]:
    """An entry known, well formed and of the expected role; its pins are not looked at."""
    entry = catalog_entry(catalog, name)
    if role is not None and entry["role"] != role:
        raise CatalogError(f"model '{name}' is a {entry['role']} in the catalog, but is used here as the {role}")
    return entry


def deployable_entry(catalog: dict[str, Any], name: str, role: str | None = None) -> dict[str, Any]:
    """An entry that may be deployed: known, well formed, of the expected role and fully pinned."""
    usable_entry(catalog, name, role)
    return check_deployable(name, catalog[name])


def rig_model_dir(models_dir: str, entry: Mapping[str, Any]) -> str:
    """A pinned entry's directory on the rig: <models_dir>/<first 16 hex of its sha256> (a new pin, a new path)."""
    return f"{models_dir}/{str(entry['sha256'])[:16]}"


def rig_model_path(models_dir: str, entry: Mapping[str, Any]) -> str:
    """Where a pinned entry lives on the rig: <models_dir>/<first 16 hex of its sha256>/<its file name>."""
    return f"{rig_model_dir(models_dir, entry)}/{posixpath.basename(str(entry['filename']))}"
