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
    state now to O(path), root-only, with the O(units) and O(server) it covers. The record is the kit's own
    bookkeeping, never reported as a change, and not written in check mode.
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
    description:
      - >-
        systemd units whose active and enabled state the state covers. With O(state=record), they are written into
        the record; with O(state=check) and none given, the recorded ones are read (a check needs nothing the
        converge named: the record says what it covered).
    type: list
    elements: str
  nft_tables:
    description:
      - >-
        nftables tables (C(FAMILY NAME)) the kit loaded, whose presence in the kernel the state covers (the
        allow-list: a C(flush ruleset) removes it without touching a file). Written into the record with
        O(state=record); read back from it with O(state=check) when not given.
    type: list
    elements: str
  path:
    description: Where the record lives on the rig.
    type: path
    default: /var/lib/rigkit/converged.json
  server:
    description:
      - >-
        The rig's server. With O(state=record), written into the record (no secret: the API key is never
        recorded), so that the next check knows where the server answers without the controller naming it.
        With O(state=check), it overrides the recorded one.
      - >-
        With O(state=check), the server of a rig that matches must still serve: C(/health) is polled (while the
        unit stays up, up to O(health_timeout) seconds) in the same module run, and the figures of the canary the
        unit's current run passed are read from O(server.record). A rig that matches but whose server does not
        answer fails the module, untouched. Without a canary record of the current run (the server restarted
        since), RV(server) says so, and the caller sends a canary (llama_server_probe).
    type: dict
    suboptions:
      url:
        description: Base URL of the server.
        type: str
        required: true
      ca_file:
        description: The certificate an https URL is verified against.
        type: path
      unit:
        description: The systemd unit that runs the server.
        type: str
        required: true
      container:
        description:
          - The server's container. The state covers what it runs (running, image ID, whether its configuration
            passed its canary); with O(state=record), the module fails instead of recording a rig whose container
            does not run the configuration whose canary passed.
        type: str
      proven:
        description: The instance's C(.proven) file (the configuration digest the last passing canary recorded).
        type: path
      record:
        description: The file where the canary of the unit's current run keeps its figures.
        type: path
        required: true
      instance:
        description: The server instance's name (the report line).
        type: str
      spec_type:
        description: The speculative decoding the server runs with (the report line).
        type: str
      canary_tokens:
        description: Tokens the canary asks for (the report line).
        type: int
  api_key:
    description: With O(state=check), the server's API key (sent as a bearer token to C(/health); never logged).
    type: str
  health_timeout:
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
    api_key: "{{ llama_server_api_key | default(omit, true) }}"
  register: rig_converged

- name: Record that the rig is as the repo describes (after a converge that ran every role)
  rig_converged:
    state: record
    inputs: "{{ rig_inputs }}"
    watch: [/etc/systemd/system, /etc/docker, /var/lib/rigkit]
    units: [docker.service, rigkit-llama-main.service]
    server:
      url: http://127.0.0.1:8080
      unit: rigkit-llama-main.service
      record: /var/lib/rigkit/llama-server/main.canary.json
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
      On a rig that matches and whose server is known (recorded, or O(server)): C(url), C(instance),
      C(spec_type), C(canary_tokens) (as recorded), C(waited) (seconds until C(/health) answered),
      C(from_record) (true: the canary figures C(draft_n), C(draft_n_accepted), C(acceptance),
      C(predicted_per_second), C(speculative), C(build_info) of the unit's current run follow; false: no canary
      passed since the server last started).
  returned: state=check, in_sync and a server known
  type: dict
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llama_server.api import Endpoint, ServerApiError
from ansible.module_utils.llama_server.unit import Serving, read_record
from ansible.module_utils.rig_state import (
    compare,
    load_record,
    part_digests,
    read_state,
    recorded_nft_tables,
    recorded_server,
    recorded_units,
    server_problem,
    write_record,
)

SERVER_SPEC = {
    "url": {"type": "str", "required": True},
    "ca_file": {"type": "path"},
    "unit": {"type": "str", "required": True},
    "container": {"type": "str"},
    "proven": {"type": "path"},
    "record": {"type": "path", "required": True},
    "instance": {"type": "str"},
    "spec_type": {"type": "str"},
    "canary_tokens": {"type": "int"},
}


def server_figures(module: AnsibleModule, server: dict[str, Any], api_key: str | None, timeout: int) -> dict:
    """/health of a rig that matches, and the canary figures of the unit's current run (fails the module when
    the server does not answer: the rig is as recorded, so nothing here may change it)."""
    try:
        endpoint = Endpoint(server["url"], api_key, ca_file=server.get("ca_file"))
    except ServerApiError as exc:
        module.fail_json(msg=str(exc))
    unit = Serving(endpoint, server["unit"])
    try:
        waited = unit.wait(timeout)
    except ServerApiError as exc:
        text, log = unit.failure(f"the rig is as its last converge left it, but its server does not answer: {exc}")
        module.fail_json(msg=text, server_log=log, server_unanswered=True)
    kept = read_record(server["record"], unit.invocation)
    recorded = {key: server.get(key) for key in ("url", "instance", "spec_type", "canary_tokens")}
    return {**recorded, "waited": round(waited, 2), "from_record": kept is not None, **(kept or {})}


def state(
    module: AnsibleModule,
    watch: list[str],
    exclude: list[str],
    units: list[str],
    tables: list[str],
    server: dict[str, Any] | None,
) -> dict:
    try:
        return read_state(watch, exclude, units, tables, server)
    except ValueError as exc:
        module.fail_json(msg=f"nft_tables or server.container: {exc}")
        raise  # fail_json exits; this keeps type checkers informed


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["check", "record"], "default": "check"},
            "inputs": {"type": "str", "required": True},
            "watch": {"type": "list", "elements": "path", "required": True},
            "exclude": {"type": "list", "elements": "str", "default": []},
            "units": {"type": "list", "elements": "str"},
            "nft_tables": {"type": "list", "elements": "str"},
            "path": {"type": "path", "default": "/var/lib/rigkit/converged.json"},
            "max_age": {"type": "int", "default": 86400},
            "server": {"type": "dict", "options": SERVER_SPEC},
            "api_key": {"type": "str", "no_log": True},
            "health_timeout": {"type": "int", "default": 60},
        },
        supports_check_mode=True,
    )
    params = module.params
    exclude = [*params["exclude"], params["path"], params["path"] + ".tmp"]
    if params["state"] == "record":
        units, tables = params["units"] or [], params["nft_tables"] or []
        running = server_problem(params["server"])
        if running:
            module.fail_json(msg=f"not recording the rig as converged: {running}; provision it again")
        parts = part_digests(state(module, params["watch"], exclude, units, tables, params["server"]))
        if not module.check_mode:
            write_record(params["inputs"], parts, params["path"], units=units, server=params["server"], tables=tables)
        module.exit_json(changed=False, parts=parts)
    record = load_record(params["path"])
    units = params["units"] if params["units"] is not None else recorded_units(record)
    tables = params["nft_tables"] if params["nft_tables"] is not None else recorded_nft_tables(record)
    server = params["server"] or recorded_server(record)
    parts = part_digests(state(module, params["watch"], exclude, units, tables, server))
    reasons = compare(record, params["inputs"], parts, max(params["max_age"], 0))
    result: dict[str, Any] = {"changed": False, "in_sync": not reasons, "reasons": reasons, "parts": parts}
    if not reasons and server:
        result["server"] = server_figures(module, server, params["api_key"], params["health_timeout"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
