"""The fleet's lock file: what each provision actually deployed, one entry per rig (controller side).

An entry is made of the pinned inputs as read back from the rig (module_utils/rig_deployed.py): NVIDIA, CUDA
and container-engine package versions, the image tag and ID with the llama.cpp commit, source sha256 and base
images its labels record, the verified models' sha256s, and the rendered unit's sha256. No timestamps: the same
inputs give the same entry, so a diff of the lock is a reviewable change and `make rebuild` can compare.

The file is JSON with sorted keys and one key per line (diffs read well; no YAML library needed wherever the
module runs), rewritten atomically under an exclusive lock (parallel plays are safe).
"""

from __future__ import annotations

import fcntl
import json
import os
from typing import Any

from ansible.module_utils.atomic_file import write_atomic
from ansible.module_utils.llama_server.config import problem

ABOUT = (
    "What each `make provision` actually deployed, per rig (written by the rig_lock role; do not edit). "
    "Review its diff like code; `make rebuild host=NAME` must reproduce a rig's entry."
)
# Docker image IDs hash the layers' timestamps: a rebuild from the same inputs gets the same tag, a new ID.
INFORMATIONAL = ("image.id",)


class LockError(Exception):
    """The lock file cannot be read or the entry cannot be made."""


def entry_from_deployed(deployed: dict[str, Any]) -> dict[str, Any]:
    """The lock entry of one rig from rig_deployed's answer (server figures are not pinned inputs). Made from
    what runs: the server's container must run the tag's image and the configuration (the unit recorded here,
    bind, key, certificate) whose canary passed; a unit file alone, written by a run that never restarted the
    server, is not recorded."""
    image = deployed.get("image")
    if not image:
        raise LockError("the server's image is not on the rig; provision it before recording the lock")
    running = problem(deployed.get("container"), image.get("id"))
    if running:
        raise LockError(f"{running}: provision the rig again (it restarts the server onto its unit)")
    models = {}
    for role, found in sorted((deployed.get("models") or {}).items()):
        if not found.get("verified"):
            raise LockError(f"the {role} model {found.get('name')} on the rig is not the verified file: provision")
        models[role] = {"name": found["name"], "sha256": found["sha256"]}
    unit = deployed.get("unit") or {}
    if not unit.get("sha256"):
        raise LockError("the server's unit file is missing on the rig")
    gpu = deployed.get("gpu")
    return {
        "packages": {name: spec["version"] for name, spec in sorted((deployed.get("packages") or {}).items())},
        "gpu": {"name": gpu["name"], "driver": gpu["driver"]} if gpu else None,
        "image": {
            key: image.get(key)
            for key in (
                "tag",
                "id",
                "llamacpp_commit",
                "llamacpp_build_number",
                "source_sha256",
                "cuda_architectures",
                "cuda_sass",
                "cuda_ptx",
                "build_base_image",
                "runtime_base_image",
                "toolchain_packages",
                "runtime_packages",
            )
        },
        "models": models,
        "unit_sha256": unit["sha256"],
    }


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, inner in value.items():
            flat.update(_flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def differences(before: dict[str, Any] | None, after: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(differences that matter, informational ones) as `key: before -> after` lines."""
    old, new = _flatten(before or {}), _flatten(after)
    lines, info = [], []
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            line = f"{key}: {old.get(key, '(absent)')} -> {new.get(key, '(absent)')}"
            (info if key in INFORMATIONAL else lines).append(line)
    return lines, info


def read_lock(path: str) -> dict[str, Any]:
    """{rig: entry} from the lock file ({} when there is none yet)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise LockError(
            f"{path}: cannot read the lock file: {exc}; restore it from version control (or fix its JSON), then re-run"
        ) from exc
    if not isinstance(data, dict) or not isinstance(data.get("rigs", {}), dict):
        raise LockError(
            f'{path}: not a rigkit lock file (expected {{"rigs": {{name: entry}}}}); restore it from version control, '
            "or point RIGKIT_LOCK_FILE at the kit's lock file"
        )
    return data.get("rigs", {})


def dumps(rigs: dict[str, Any]) -> str:
    return json.dumps({"about": ABOUT, "rigs": rigs}, indent=2, sort_keys=True) + "\n"


def update_lock(path: str, host: str, entry: dict[str, Any], check_mode: bool = False) -> dict[str, Any] | None:
    """Record `entry` for `host`; returns the previous entry (None when there was none). Atomic, serialised."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f".{os.path.basename(path)}.lock"), "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        data = read_lock(path)
        previous = data.get(host)
        if previous != entry and not check_mode:
            data[host] = entry
            write_atomic(path, lambda handle: handle.write(dumps(data)))
        return previous
