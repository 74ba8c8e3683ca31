#!/usr/bin/python
"""Ansible module: merge keys into Docker's daemon.json."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: docker_daemon_config
short_description: Merge settings into Docker's daemon.json, leaving other owners' keys alone
description:
  - Reads the daemon configuration, deep-merges O(settings) into it, drops the keys in O(remove)
    and writes the file atomically only when the merged result differs from what is on disk.
  - Several roles share the file (Docker itself, the NVIDIA container toolkit); each merges the keys it owns.
options:
  path:
    description: Path of daemon.json.
    type: path
    default: /etc/docker/daemon.json
  settings:
    description: Keys to set. Nested objects merge key by key; other values replace.
    type: dict
    default: {}
  remove:
    description: Top-level keys this caller owns and wants gone.
    type: list
    elements: str
    default: []
supports_check_mode: true
author: rigkit
"""

EXAMPLES = r"""
- name: Merge logging settings
  docker_daemon_config:
    settings:
      log-driver: json-file
      log-opts: {max-size: 10m}
"""

RETURN = r"""
config:
  description: The configuration in force after the merge.
  type: dict
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.docker_daemon_config import (
    DaemonConfigError,
    exposure_problems,
    merge_into_file,
    plan_merge,
    render,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": "/etc/docker/daemon.json"},
            "settings": {"type": "dict", "default": {}},
            "remove": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    path = module.params["path"]
    exposed = exposure_problems(module.params["settings"])
    if exposed:
        module.fail_json(msg="docker daemon settings refused: " + "; ".join(exposed))
    try:
        if module.check_mode:
            result = plan_merge(path, module.params["settings"], module.params["remove"])
        else:
            result = merge_into_file(path, module.params["settings"], module.params["remove"])
    except (DaemonConfigError, OSError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(
        changed=result.changed,
        config=result.after,
        diff={
            "before": render(result.before),
            "after": render(result.after),
            "before_header": path,
            "after_header": path,
        },
    )


if __name__ == "__main__":
    main()
