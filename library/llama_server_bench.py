#!/usr/bin/python
"""Ansible module: measure a running llama-server at its current draft setting (runs on the rig)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llama_server_bench
short_description: Measure decode speed, time to first token and draft acceptance of a running llama-server
description:
  - For every prompt kind and concurrency level, sends one warm-up round at that shape, then one measured
    round of simultaneous streamed completions (greedy, prompt cache off, a fresh nonce per request,
    C(ignore_eos) so every request decodes the same number of tokens).
  - Returns each request's client-side figures (time to first token, decode tokens/s from the stream) and the
    server's C(timings) (decode speed, drafted and accepted tokens), plus the C(/metrics) speculative counters
    over the measured round.
  - Runs on the rig, where the server binds loopback. Changes nothing.
options:
  url:
    description: Base URL of the server.
    type: str
    required: true
  kinds:
    description: Prompt kinds to measure (code, prose, chat, structured).
    type: list
    elements: str
    required: true
  concurrency:
    description: Concurrency levels (simultaneous requests per round).
    type: list
    elements: int
    default: [1]
  n_predict:
    description: Tokens each request decodes.
    type: int
    default: 64
  warmup:
    description: Discarded rounds before each measured one.
    type: int
    default: 1
  repeats:
    description: Measured rounds per cell.
    type: int
    default: 1
  timeout:
    description: Seconds one request may take.
    type: int
    default: 300
supports_check_mode: true
extends_documentation_fragment:
  - rigkit_server_client
author: rigkit
"""

EXAMPLES = r"""
- name: Measure the server as configured now
  llama_server_bench:
    url: http://127.0.0.1:8080
    kinds: [code, prose, chat, structured]
    concurrency: [1, 2]
"""

RETURN = r"""
cells:
  description: One entry per measured round (kind, concurrency, requests, aggregate_tps, metric_* deltas).
  type: list
  elements: dict
  returned: success
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.bench_workload import BenchError, measure_setting
from ansible.module_utils.llama_server.api import CLIENT_ARGUMENT_SPEC, Endpoint, ServerApiError


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            **CLIENT_ARGUMENT_SPEC,
            "kinds": {"type": "list", "elements": "str", "required": True},
            "concurrency": {"type": "list", "elements": "int", "default": [1]},
            "n_predict": {"type": "int", "default": 64},
            "warmup": {"type": "int", "default": 1},
            "repeats": {"type": "int", "default": 1},
            "timeout": {"type": "int", "default": 300},
        },
        supports_check_mode=True,
    )
    params = module.params
    if module.check_mode:
        module.exit_json(changed=False, cells=[], msg="check mode: nothing measured")
    endpoint = Endpoint(params["url"], params["api_key"], timeout=float(params["timeout"]), ca_file=params["ca_file"])
    try:
        cells = measure_setting(
            endpoint,
            params["kinds"],
            params["concurrency"],
            params["n_predict"],
            warmup=params["warmup"],
            repeats=params["repeats"],
        )
    except (BenchError, ServerApiError) as exc:
        module.fail_json(msg=f"bench against {params['url']} failed: {exc}")
    module.exit_json(changed=False, cells=[cell.as_dict() for cell in cells])


if __name__ == "__main__":
    main()
