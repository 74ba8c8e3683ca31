"""Jinja filters for the no-op fast path (logic in rigkit/rig_inputs.py), run on the controller.

``hostvars[inventory_hostname] | rig_inputs_digest`` digests the kit's code and the rig's variables;
``hostvars[inventory_hostname] | rig_lock_digest(inventory_hostname)`` the rig's entry in the lock file as it is
now. library/rig_converged compares both with what the rig's last full converge recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import rigkit  # noqa: F401  (first: it makes module_utils/ importable as ansible.module_utils)
from rigkit.paths import lock_file
from rigkit.rig_inputs import inputs_digest, lock_digest

# isort: split
from ansible.module_utils.rig_lock import LockError, read_lock

# The checkout this plugin belongs to: the one whose roles and playbooks run.
KIT = str(Path(__file__).resolve().parent.parent)


def _lock_path(hostvars: Mapping[str, Any]) -> str:
    """roles/rig_lock's rig_lock_file: the inventory's value, else $RIGKIT_LOCK_FILE, else the repo's lock."""
    try:
        configured = hostvars["rig_lock_file"]
    except KeyError:
        configured = None
    if isinstance(configured, str) and configured:
        return configured
    return lock_file(KIT)


def rig_inputs_digest(hostvars: Mapping[str, Any]) -> str:
    return inputs_digest(list(hostvars.keys()), lambda name: hostvars[name], KIT)


def rig_lock_digest(hostvars: Mapping[str, Any], host: str) -> str:
    try:
        entry = read_lock(_lock_path(hostvars)).get(host)
    except LockError as exc:  # an unreadable lock never matches a recorded converge
        entry = f"<unreadable lock: {exc}>"
    return lock_digest(entry)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"rig_inputs_digest": rig_inputs_digest, "rig_lock_digest": rig_lock_digest}
