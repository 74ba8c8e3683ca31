"""The digest of everything that shapes a rig, computed on the controller (the no-op fast path's inputs).

Two parts: the kit's own code that runs against the rig (roles, modules, module_utils, plugins, playbooks, the
Docker build contexts, the pinned toolchain), and the rig's variables as the roles see them: every variable
with a role's prefix, the model catalog and the connection settings, templated (so an -e override, a changed
group_vars file or an environment lookup all count). Documentation is left out: a README edit does not
re-converge a fleet. The rig's lock entry is digested apart (lock_digest): the converge itself rewrites it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rigkit import REPO
from rigkit.validation.variables import CONTEXT_NAMES, SHAPING_ROLES

CODE_DIRS = ("roles", "library", "module_utils", "filter_plugins", "callback_plugins", "playbooks", "docker")
CODE_FILES = ("ansible.cfg", "requirements.txt")
SKIPPED_DIRS = {"molecule", "__pycache__", ".pytest_cache"}
SKIPPED_SUFFIXES = (".md", ".pyc")

# Variables that shape what the roles do: the shaping roles' prefixes, the rig's own description, the catalog.
PREFIXES = (*(f"{role}_" for role in SHAPING_ROLES), "rig_")
NAMES = (
    "model_catalog",
    "ansible_host",
    "ansible_port",
    "ansible_user",
    "ansible_connection",
    "ansible_python_interpreter",
    "ansible_become",
    "ansible_become_user",
)
# Facts and registered results of the run itself that carry a prefix: not inputs (by prefix, or by name).
NOT_INPUT_PREFIXES = (
    "rig_inputs",
    "rig_state_",
    "rig_converged",
    "rig_lock_",
    "rig_validation_",
)
# What roles/rig_context names from the inputs (CONTEXT_NAMES: pure functions of them and of the code, both
# digested) is left out, so that the digest is the same whether or not the names were computed before it (the
# fast path computes it before naming anything).
NOT_INPUT_NAMES = {
    *CONTEXT_NAMES,
    "models_missing",
    "models_fleet_arrived",
}


def _code_files(root: str) -> Iterable[str]:
    for directory in CODE_DIRS:
        for base, dirnames, filenames in os.walk(os.path.join(root, directory)):
            dirnames[:] = sorted(name for name in dirnames if name not in SKIPPED_DIRS)
            for name in sorted(filenames):
                if not name.endswith(SKIPPED_SUFFIXES):
                    yield os.path.join(base, name)
    for name in CODE_FILES:
        yield os.path.join(root, name)


@functools.lru_cache(maxsize=4)
def code_digest(root: str = str(REPO)) -> str:
    """sha256 over the kit's code: each file's path (relative) and content, in a fixed order."""
    digest = hashlib.sha256()
    for path in _code_files(root):
        digest.update(os.path.relpath(path, root).encode() + b"\0")
        try:
            with open(path, "rb") as handle:
                digest.update(hashlib.sha256(handle.read()).digest())
        except FileNotFoundError:
            digest.update(b"absent")
    return digest.hexdigest()


def input_names(names: Iterable[str]) -> list[str]:
    return sorted(
        name
        for name in names
        if (name.startswith(PREFIXES) or name in NAMES)
        and not name.startswith(NOT_INPUT_PREFIXES)
        and name not in NOT_INPUT_NAMES
    )


def _plain(value: Any) -> Any:
    """A JSON-able copy (templated values can be Ansible's own str/dict subclasses, or sets)."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set)):
        items = [_plain(item) for item in value]
        return sorted(items, key=repr) if isinstance(value, set) else items
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return str(value)


def inputs_digest(names: Iterable[str], get: Callable[[str], Any], root: str = str(REPO)) -> str:
    """The digest of the kit's code under ``root`` (the checkout whose playbooks run) and the rig's templated
    variables (a value that cannot be templated counts as its error text: still an input)."""
    values: dict[str, Any] = {}
    for name in input_names(names):
        try:
            values[name] = _plain(get(name))
        except Exception as exc:  # an undefined dependency is part of the description too
            values[name] = f"<unresolved: {exc.__class__.__name__}>"
    blob = json.dumps({"code": code_digest(root), "vars": values}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def lock_digest(entry: Any) -> str:
    """The digest of a rig's lock entry (None: no entry)."""
    return hashlib.sha256(json.dumps(_plain(entry), sort_keys=True).encode()).hexdigest()
