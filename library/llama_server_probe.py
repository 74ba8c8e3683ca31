#!/usr/bin/python
"""Ansible module: wait for a llama-server unit to serve, then prove it drafts with a canary completion."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llama_server_probe
short_description: Wait until a llama-server unit is healthy and prove that it drafts
description:
  - Polls C(/health) until it answers 200, failing at once when the systemd unit dies or restarts meanwhile
    (a crash loop never waits out the timeout), and returns the unit's own log lines on failure.
  - Then sends a greedy canary completion (prompt cache off) and reports C(timings.draft_n),
    C(timings.draft_n_accepted), the acceptance, and whether C(/slots) shows the drafter active.
  - With I(record), the canary's figures are kept in that file on the host together with the unit's
    invocation ID, and I(canary=false) returns them instead of sending a new canary, as long as the unit has
    not been (re)started since; a server that restarted, or whose record is missing, always gets a canary.
  - Changes nothing on the host but the record.
options:
  url:
    description: Base URL of the server, for example C(http://127.0.0.1:8080).
    type: str
    required: true
  unit:
    description: systemd unit running the server (for liveness and its log lines).
    type: str
  timeout:
    description: Seconds to wait for C(/health).
    type: int
    default: 300
  canary:
    description:
      - Send a canary completion once healthy.
      - When false and I(record) holds the figures of a canary of the unit's current run, return those
        (C(from_record) true); when false without a usable record, a canary is sent after all (with I(record)).
    type: bool
    default: true
  record:
    description:
      - File on the host where the last passing canary's figures are kept, with the unit's invocation ID
        (written after every passing canary). Needs I(unit).
    type: path
  prompt:
    description: Canary prompt.
    type: str
    default: "def fibonacci(n):"
  n_predict:
    description: Tokens the canary generates.
    type: int
    default: 32
  require_draft:
    description: Fail unless the canary reports drafted tokens (C(timings.draft_n) > 0).
    type: bool
    default: true
supports_check_mode: true
extends_documentation_fragment:
  - rigkit_server_client
author: rigkit
"""

EXAMPLES = r"""
- name: Wait for the server and check that it drafts
  llama_server_probe:
    url: http://127.0.0.1:8080
    unit: rigkit-llama-main.service
"""

RETURN = r"""
waited:
  description: Seconds until C(/health) answered 200.
  type: float
  returned: success
draft_n:
  description: Tokens the drafter proposed during the canary.
  type: int
  returned: when canary
draft_n_accepted:
  description: Drafted tokens the target accepted.
  type: int
  returned: when canary
acceptance:
  description: draft_n_accepted / draft_n, or null without drafts.
  type: float
  returned: when canary
speculative:
  description: Whether every slot reports C(speculative) true in C(/slots).
  type: bool
  returned: when canary
build_info:
  description: C(b<build>-<commit>) from C(/props).
  type: str
  returned: when canary
from_record:
  description: Whether the figures come from I(record) (no canary was sent this time).
  type: bool
  returned: success
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llama_server.api import (
    CLIENT_ARGUMENT_SPEC,
    Endpoint,
    ServerApiError,
    build_info,
    complete,
    speculative_slots,
)
from ansible.module_utils.llama_server.unit import Serving, read_record, write_record


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            **CLIENT_ARGUMENT_SPEC,
            "unit": {"type": "str"},
            "timeout": {"type": "int", "default": 300},
            "canary": {"type": "bool", "default": True},
            "prompt": {"type": "str", "default": "def fibonacci(n):"},
            "n_predict": {"type": "int", "default": 32},
            "require_draft": {"type": "bool", "default": True},
            "record": {"type": "path"},
        },
        required_by={"record": "unit"},
        supports_check_mode=True,
    )
    params = module.params
    try:
        endpoint = Endpoint(
            params["url"], params["api_key"], timeout=max(30.0, params["n_predict"] * 2.0), ca_file=params["ca_file"]
        )
    except ServerApiError as exc:
        module.fail_json(msg=str(exc))
    serving = Serving(endpoint, params["unit"])

    def fail(message: str) -> None:
        text, log = serving.failure(message)
        module.fail_json(msg=text, server_log=log)

    try:
        waited = serving.wait(params["timeout"])
    except ServerApiError as exc:
        fail(str(exc))
    result: dict = {"changed": False, "waited": round(waited, 2), "from_record": False}
    invocation = serving.invocation
    kept = read_record(params["record"], invocation) if params["record"] and not params["canary"] else None
    if kept is not None:
        result.update(kept, from_record=True)
    elif params["canary"] or params["record"]:
        try:
            canary = complete(endpoint, params["prompt"], params["n_predict"])
            slots = speculative_slots(endpoint)
            result.update(
                draft_n=canary.draft_n,
                draft_n_accepted=canary.draft_n_accepted,
                acceptance=canary.acceptance,
                predicted_per_second=canary.timings.get("predicted_per_second"),
                speculative=bool(slots) and all(slots),
                build_info=build_info(endpoint),
            )
        except ServerApiError as exc:
            fail(f"the canary completion failed: {exc}")
        if params["require_draft"] and (canary.draft_n == 0 or not result["speculative"]):
            fail(
                f"the server answered but did not draft (draft_n={canary.draft_n}, "
                f"speculative={result['speculative']}); check llama_server_spec_type and models_drafter"
            )
        if params["record"] and invocation and not module.check_mode:
            write_record(params["record"], invocation, result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
