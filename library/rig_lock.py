#!/usr/bin/python
"""Ansible module: record a rig's lock entry, or compare it with the one a rebuild must reproduce."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: rig_lock
short_description: Record what a rig runs in the fleet's lock file, or compare it with an earlier entry
description:
  - Makes the rig's lock entry from the answer of the C(rig_deployed) module (package versions, image tag, ID and
    labels, verified model sha256s, unit sha256) and records it under the rig's name in the lock file, atomically
    and under an exclusive file lock. Reports C(changed) with a diff when the entry changed.
  - With I(expected), compares instead of recording, and fails listing every difference (the image ID alone is
    informational, since Docker image IDs differ between builds of the same inputs).
  - Runs where the lock file lives (the controller).
options:
  path:
    description: The lock file.
    type: path
    required: true
  host:
    description: The rig's inventory name.
    type: str
    required: true
  deployed:
    description: What C(rig_deployed) returned for the rig.
    type: dict
    required: true
  expected:
    description: An earlier entry the rig must reproduce (compare only; nothing is written).
    type: dict
supports_check_mode: true
author: rigkit
"""

EXAMPLES = r"""
- name: Record the rig in the lock
  rig_lock:
    path: inventory/rigs.lock.json
    host: "{{ inventory_hostname }}"
    deployed: "{{ __rig_lock_deployed }}"
  delegate_to: localhost
"""

RETURN = r"""
entry:
  description: The rig's entry as it is now.
  type: dict
  returned: always
previous:
  description: The entry recorded before (null when none).
  type: dict
  returned: when recording
differences:
  description: "Lines `key: before -> after` that matter."
  type: list
  returned: always
informational:
  description: Differences that do not count (the image ID).
  type: list
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.rig_lock import LockError, differences, dumps, entry_from_deployed, update_lock


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "host": {"type": "str", "required": True},
            "deployed": {"type": "dict", "required": True},
            "expected": {"type": "dict"},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        entry = entry_from_deployed(params["deployed"])
        if params["expected"] is not None:
            lines, info = differences(params["expected"], entry)
            if lines:
                module.fail_json(
                    msg=f"{params['host']} did not reproduce its lock entry: " + "; ".join(lines),
                    entry=entry,
                    differences=lines,
                    informational=info,
                )
            module.exit_json(changed=False, entry=entry, differences=[], informational=info)
        previous = update_lock(params["path"], params["host"], entry, check_mode=module.check_mode)
    except LockError as exc:
        module.fail_json(msg=f"{params['host']}: {exc}")
    lines, info = differences(previous, entry)
    changed = previous != entry
    result = {"changed": changed, "entry": entry, "previous": previous, "differences": lines, "informational": info}
    if changed and module._diff:
        result["diff"] = {
            "before_header": f"{params['path']} [{params['host']}]",
            "after_header": f"{params['path']} [{params['host']}]",
            "before": dumps({params["host"]: previous}) if previous else "",
            "after": dumps({params["host"]: entry}),
        }
    module.exit_json(**result)


if __name__ == "__main__":
    main()
