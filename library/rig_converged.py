#!/usr/bin/python
"""Ansible module: whether a rig is still as its last full converge left it (the no-op fast path)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: rig_converged
short_description: Tell whether a rig is still as its last full converge left it, or record that it is
description:
  - >-
    With O(state=check), reads the rig's state (module_utils/rig_state.py; the files under O(watch), every
    installed package and its selection, O(units), the Docker images, the running kernel and DKMS's modules)
    and compares its digest, and O(inputs), with what the last full converge recorded. RV(in_sync) is true
    only when both are the recorded ones; RV(reasons) says which part differs. Changes nothing.
  - >-
    With O(state=record), after a converge that ran every role, writes the digest of O(inputs) and of the
    state now to O(path), root-only. The record is the kit's own bookkeeping, never reported as a change, and
    not written in check mode.
options:
  state:
    description: C(check) compares; C(record) writes the record.
    type: str
    choices: [check, record]
    default: check
  inputs:
    description: The digest of what shapes the rig, computed on the controller (filter C(rig_inputs_digest)).
    type: str
    required: true
  watch:
    description: Files and directories whose content, mode and owner the state covers (directories recursively).
    type: list
    elements: path
    required: true
  exclude:
    description: Shell patterns of paths under O(watch) that change at run time (canary records, guard state).
    type: list
    elements: str
    default: []
  units:
    description: systemd units whose active and enabled state the state covers.
    type: list
    elements: str
    default: []
  path:
    description: Where the record lives on the rig.
    type: path
    default: /var/lib/rigkit/converged.json
  server:
    description:
      - >-
        With O(state=check), the server of a rig that matches must still serve: C(/health) is polled (while the
        unit stays up, up to O(server.timeout) seconds) in the same module run, and the figures of the canary the
        unit's current run passed are read from O(server.record). A rig that matches but whose server does not
        answer fails the module, untouched. Without a canary record of the current run (the server restarted
        since), RV(server) says so, and the caller sends a canary (llama_server_probe).
    type: dict
    suboptions:
      url:
        description: Base URL of the server.
        type: str
        required: true
      api_key:
        description: The server's API key (sent as a bearer token; never logged).
        type: str
      ca_file:
        description: The certificate an https URL is verified against.
        type: path
      unit:
        description: The systemd unit that runs the server.
        type: str
        required: true
      record:
        description: The file where the canary of the unit's current run keeps its figures.
        type: path
        required: true
      timeout:
        description: Seconds to wait for C(/health).
        type: int
        default: 60
  max_age:
    description:
      - Seconds after which a record no longer counts (0, never), so that what depends on time alone (the server
        certificate's renewal) is looked at again by a full converge.
    type: int
    default: 86400
supports_check_mode: true
author: rigkit
"""

EXAMPLES = r"""
- name: Compare the rig with its last converge
  rig_converged:
    inputs: "{{ rig_inputs }}"
    watch: [/etc/systemd/system, /etc/docker, /var/lib/rigkit]
    exclude: ["/var/lib/rigkit/*/*.canary.json"]
    units: [docker.service]
  register: rig_converged
"""

RETURN = r"""
in_sync:
  description: Whether the inputs and the state are those the last full converge recorded.
  returned: state=check
  type: bool
reasons:
  description: Why not (no record, the inputs, or which part of the state).
  returned: state=check
  type: list
  elements: str
parts:
  description: The digest of each part of the state now.
  returned: always
  type: dict
server:
  description:
    - >-
      On a rig that matches, with O(server): C(waited) (seconds until C(/health) answered), C(from_record) (true:
      the canary figures C(draft_n), C(draft_n_accepted), C(acceptance), C(predicted_per_second), C(speculative),
      C(build_info) of the unit's current run follow; false: no canary passed since the server last started).
  returned: state=check, in_sync and O(server) given
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llama_server_api import Endpoint, ServerApiError
from ansible.module_utils.llama_server_unit import Serving, read_record
from ansible.module_utils.rig_state import (
    compare,
    load_record,
    part_digests,
    read_state,
    write_record,
)

SERVER_SPEC = {
    "url": {"type": "str", "required": True},
    "api_key": {"type": "str", "no_log": True},
    "ca_file": {"type": "path"},
    "unit": {"type": "str", "required": True},
    "record": {"type": "path", "required": True},
    "timeout": {"type": "int", "default": 60},
}


def server_figures(module: AnsibleModule, server: dict) -> dict:
    """/health of a rig that matches, and the canary figures of the unit's current run (fails the module when
    the server does not answer: the rig is as recorded, so nothing here may change it)."""
    try:
        endpoint = Endpoint(server["url"], server["api_key"], ca_file=server["ca_file"])
    except ServerApiError as exc:
        module.fail_json(msg=str(exc))
    unit = Serving(endpoint, server["unit"])
    try:
        waited = unit.wait(server["timeout"])
    except ServerApiError as exc:
        text, log = unit.failure(f"the rig is as its last converge left it, but its server does not answer: {exc}")
        module.fail_json(msg=text, server_log=log, server_unanswered=True)
    kept = read_record(server["record"], unit.invocation)
    return {"waited": round(waited, 2), "from_record": kept is not None, **(kept or {})}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["check", "record"], "default": "check"},
            "inputs": {"type": "str", "required": True},
            "watch": {"type": "list", "elements": "path", "required": True},
            "exclude": {"type": "list", "elements": "str", "default": []},
            "units": {"type": "list", "elements": "str", "default": []},
            "path": {"type": "path", "default": "/var/lib/rigkit/converged.json"},
            "max_age": {"type": "int", "default": 86400},
            "server": {"type": "dict", "options": SERVER_SPEC},
        },
        supports_check_mode=True,
    )
    params = module.params
    exclude = [*params["exclude"], params["path"], params["path"] + ".tmp"]
    parts = part_digests(read_state(params["watch"], exclude, params["units"]))
    if params["state"] == "record":
        if not module.check_mode:
            write_record(params["inputs"], parts, params["path"])
        module.exit_json(changed=False, parts=parts)
    reasons = compare(load_record(params["path"]), params["inputs"], parts, max(params["max_age"], 0))
    result = {"changed": False, "in_sync": not reasons, "reasons": reasons, "parts": parts}
    if not reasons and params["server"]:
        result["server"] = server_figures(module, params["server"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
