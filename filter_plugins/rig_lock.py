"""Jinja filters over the fleet's lock file (logic in module_utils/rig_lock.py and rigkit/paths.py), run on the
controller, where the lock lives.

``playbook_dir | dirname | rig_lock_default_file`` is roles/rig_lock's default lock file;
``rig_lock_file | rig_lock_entry(inventory_hostname)`` the rig's entry in it (None when it has none), read by the
one reader: a corrupt or foreign lock fails naming the file, never reads as "no entry".
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

import rigkit  # noqa: F401  (first: it makes module_utils/ importable as ansible.module_utils)
from rigkit.paths import lock_file

# isort: split
from ansible.module_utils.rig_lock import LockError, read_lock


def rig_lock_default_file(kit: str) -> str:
    """The lock file of the checkout ``kit`` (the one whose playbooks run), unless $RIGKIT_LOCK_FILE names another."""
    return lock_file(str(kit))


def rig_lock_entry(path: str, host: str) -> Any:
    """``host``'s entry in the lock file at ``path``; None when the file or the entry does not exist yet."""
    try:
        return read_lock(str(path)).get(str(host))
    except LockError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"rig_lock_default_file": rig_lock_default_file, "rig_lock_entry": rig_lock_entry}
