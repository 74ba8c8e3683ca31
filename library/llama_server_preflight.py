#!/usr/bin/python
"""Ansible module: can this llama-server configuration start here? (module_utils/preflight/server.py decides)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llama_server_preflight
short_description: Refuse a llama-server configuration that cannot start, before the running server is touched
description:
  - Reads the GGUF headers of the target and the drafter (never their tensor data) and checks that the drafter
    pairs with the target for O(spec_type), that O(ctx_size) is within the target's trained context, and that
    weights, KV cache, attention scratch and headroom fit O(memory_budget_mib).
  - C(draft-mtp) needs a C(gemma4) target and a C(gemma4-assistant) drafter whose C(embedding_length_out) equals
    the target's C(embedding_length), with matching KV heads and head sizes. C(draft-simple) needs a classic
    draft model with the target's vocabulary and tokenizer; a C(gemma4-assistant) drafter is refused there.
  - The memory estimate follows llama.cpp b11312 (commit 0c1e57098); see module_utils/preflight/server.py for
    the formulas. With O(gpu_layers) 0 the budget is host RAM and everything counts.
  - Never changes anything. Fails with every problem, one per line, each naming the host variable to change.
  - Runs on the managed host with the Python standard library only.
version_added: "1.0.0"
author: rigkit
options:
  target:
    description: Path of the target model's GGUF on the managed host.
    type: path
    required: true
  drafter:
    description: Path of the drafter's GGUF; omit when no drafter is configured.
    type: path
  spec_type:
    description: llama-server C(--spec-type).
    type: str
    choices: [none, draft-simple, draft-mtp]
    default: none
  ctx_size:
    description: llama-server C(-c). 0 means the target's own C(context_length).
    type: int
    required: true
  parallel:
    description: llama-server C(-np), a number of slots or C(auto) (the server's default, 4 slots with a unified KV).
    type: raw
    default: 1
  cache_type_k:
    description: llama-server C(-ctk).
    type: str
    choices: [f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1]
    default: f16
  cache_type_v:
    description: llama-server C(-ctv). A quantized V cache needs flash attention.
    type: str
    choices: [f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1]
    default: f16
  cache_type_k_draft:
    description: llama-server C(-ctkd), the draft model's K cache (draft-simple drafters only).
    type: str
    choices: [f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1]
    default: f16
  cache_type_v_draft:
    description: llama-server C(-ctvd), the draft model's V cache (draft-simple drafters only).
    type: str
    choices: [f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1]
    default: f16
  flash_attn:
    description:
      - llama-server C(-fa). C(auto) is estimated as off (the larger footprint) unless the V cache is quantized.
    type: str
    choices: ["on", "off", auto]
    default: auto
  swa_full:
    description: llama-server C(--swa-full) (full-size cache for sliding-window layers).
    type: bool
    default: false
  kv_unified:
    description: llama-server C(--kv-unified).
    type: bool
    default: false
  gpu_layers:
    description: llama-server C(-ngl), a number of layers, C(all) or C(auto) (counted as all). 0 checks host RAM.
    type: raw
    default: all
  gpu_layers_draft:
    description: llama-server C(-ngld); defaults to O(gpu_layers).
    type: raw
  ubatch_size:
    description: llama-server C(-ub); 512 (the server's default) when omitted or null.
    type: int
  memory_budget_mib:
    description: Memory the configuration may use, in MiB (the GPU's VRAM, or host RAM when O(gpu_layers) is 0).
    type: int
    required: true
  memory_kind:
    description: What the budget is, for messages (e.g. C(VRAM of the RTX 3050), C(RAM)).
    type: str
  headroom_mib:
    description:
      - MiB kept free for the CUDA context and the compute buffers the estimate does not model (llama-server's own
        memory fit ignores the drafter); the role passes llama_server_memory_headroom_mib resolved.
    type: int
    required: true
  container_memory_mib:
    description:
      - The container's memory limit in MiB, or C(auto) (the default) to derive it from the estimate (the host
        memory the configuration can hold, nothing offloaded, plus O(container_memory_margin_mib), rounded up to
        256 MiB, at least O(container_memory_floor_mib)). A number below the host-memory estimate is a problem.
    type: raw
    default: auto
  container_memory_margin_mib:
    description: MiB added to the host-memory estimate for the derived limit.
    type: int
    default: 1024
  container_memory_floor_mib:
    description: The derived limit is never below this many MiB.
    type: int
    default: 1024
notes:
  - Supports check mode; it never changes anything either way.
"""

EXAMPLES = r"""
- name: Refuse a configuration that cannot start, before touching the running server
  llama_server_preflight:
    target: "{{ models_dir }}/{{ model_catalog[models_target].filename | basename }}"
    drafter: "{{ models_dir ~ '/' ~ (model_catalog[models_drafter].filename | basename) }}"
    spec_type: "{{ llama_server_spec_type }}"
    ctx_size: "{{ llama_server_ctx_size }}"
    flash_attn: "{{ llama_server_flash_attn }}"
    gpu_layers: "{{ llama_server_gpu_layers }}"
    memory_budget_mib: "{{ rig_gpu.vram_mib }}"
    memory_kind: "VRAM of the {{ rig_gpu.name }}"
  register: preflight
"""

RETURN = r"""
estimate:
  description:
    - The memory estimate in bytes - target_weights, drafter_weights, target_KV_cache, drafter_KV_cache,
      attention_scratch, headroom, total - plus total_mib, breakdown (one line), device (gpu or host), ctx_size,
      the KV cells of full and sliding-window layers and notes.
  returned: when both headers could be read
  type: dict
facts:
  description:
    - What the headers say - architecture, embedding_length (and the drafter's embedding_length_out),
      vocab_size, block_count, context_length, sliding window, SWA and KV layer counts - for target_ and drafter_.
  returned: always
  type: dict
warnings_found:
  description: Things worth knowing that do not stop the start (also shown as Ansible warnings).
  returned: always
  type: list
  elements: str
problems:
  description: Why the configuration was refused, one sentence each.
  returned: failure
  type: list
  elements: str
"""

import re

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight.server import (
    CACHE_TYPES,
    MIB,
    PreflightError,
    check_container_memory,
    container_memory_limit_mib,
    host_memory_estimate,
    preflight,
)

CACHE_CHOICES = list(CACHE_TYPES)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "target": {"type": "path", "required": True},
            "drafter": {"type": "path"},
            "spec_type": {"type": "str", "choices": ["none", "draft-simple", "draft-mtp"], "default": "none"},
            "ctx_size": {"type": "int", "required": True},
            "parallel": {"type": "raw", "default": 1},
            "cache_type_k": {"type": "str", "choices": CACHE_CHOICES, "default": "f16"},
            "cache_type_v": {"type": "str", "choices": CACHE_CHOICES, "default": "f16"},
            "cache_type_k_draft": {"type": "str", "choices": CACHE_CHOICES, "default": "f16"},
            "cache_type_v_draft": {"type": "str", "choices": CACHE_CHOICES, "default": "f16"},
            "flash_attn": {"type": "str", "choices": ["on", "off", "auto"], "default": "auto"},
            "swa_full": {"type": "bool", "default": False},
            "kv_unified": {"type": "bool", "default": False},
            "gpu_layers": {"type": "raw", "default": "all"},
            "gpu_layers_draft": {"type": "raw"},
            "ubatch_size": {"type": "int"},
            "memory_budget_mib": {"type": "int", "required": True},
            "memory_kind": {"type": "str"},
            "headroom_mib": {"type": "int", "required": True},
            "container_memory_mib": {"type": "raw", "default": "auto"},
            "container_memory_margin_mib": {"type": "int", "default": 1024},
            "container_memory_floor_mib": {"type": "int", "default": 1024},
        },
        supports_check_mode=True,
    )
    p = module.params
    settings = {
        key: p[key]
        for key in (
            "spec_type",
            "ctx_size",
            "parallel",
            "cache_type_k",
            "cache_type_v",
            "cache_type_k_draft",
            "cache_type_v_draft",
            "flash_attn",
            "swa_full",
            "kv_unified",
            "gpu_layers",
            "gpu_layers_draft",
            "ubatch_size",
            "headroom_mib",
            "memory_kind",
        )
    }
    try:
        result = preflight(p["target"], p["drafter"] or None, settings, p["memory_budget_mib"])
    except PreflightError as exc:
        module.fail_json(msg=f"llama_server_preflight: {exc}", changed=False)
    out = {
        "changed": False,
        "facts": result.facts,
        "warnings_found": result.warnings,
        "estimate": result.estimate.as_dict() if result.estimate else None,
    }
    wanted = str(p["container_memory_mib"]).strip().lower()
    if wanted != "auto" and not re.fullmatch(r"[0-9]+", wanted):
        module.fail_json(
            msg=f"llama_server_container_memory_mib is {p['container_memory_mib']!r}; expected auto or a number of MiB",
            changed=False,
        )
    problems = list(result.problems)
    if result.estimate is not None:
        try:
            derived = container_memory_limit_mib(
                result.estimate,
                margin_mib=p["container_memory_margin_mib"],
                floor_mib=p["container_memory_floor_mib"],
            )
        except PreflightError as exc:
            module.fail_json(msg=f"llama_server_preflight: {exc}", changed=False)
        limit = derived if wanted == "auto" else int(wanted)
        problems += check_container_memory(result.estimate, limit)
        out["container_memory_mib"] = limit
        out["host_memory_mib"] = round(host_memory_estimate(result.estimate).total / MIB, 1)
    for warning in result.warnings:
        module.warn(warning)
    if problems:
        count = len(problems)
        head = f"llama-server would not start with this configuration ({count} problem{'s' if count > 1 else ''}):"
        module.fail_json(msg="\n".join([head, *(f"- {problem}" for problem in problems)]), problems=problems, **out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
