#!/usr/bin/python
"""Ansible module: prove that a running llama-server unit serves from the GPU, not from a CPU fallback."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llama_server_offload
short_description: Prove that a llama-server unit runs its target and drafter on the GPU
description:
  - When CUDA fails to initialise, llama-server warns and serves on the CPU, and C(/health) and a canary that
    drafts both pass. This module reads the load log of the unit's current run (the journal lines with its
    invocation ID) and the GPU memory the server's process holds, and fails, naming the cause, unless both models
    are on the GPU.
  - The causes (C(cause) in the result) - C(no-cuda-device) (the container saw no CUDA device, or the image has
    no GPU backend), C(cuda-init-failed) (CUDA's error is quoted), C(no-load-in-log), C(target-layers) and
    C(drafter-layers) (C(offloaded N/M layers to GPU) with fewer than asked), C(no-cuda-buffers) (no
    C(CUDA0 model buffer size)), C(gpu-memory) (C(nvidia-smi --query-compute-apps) does not list the container's
    process, or it holds less than half of I(expected_mib)).
  - The verdict is module_utils/gpu_offload.py's, which the rig suite (tests/rig) and tests/gpu use too.
  - Changes nothing on the host.
options:
  unit:
    description: systemd unit running the server (its current run's journal is the load log).
    type: str
    required: true
  container:
    description: Name of the server's container (its main process is the PID nvidia-smi must list).
    type: str
    required: true
  drafter:
    description: Whether a drafter loads after the target (speculative decoding on).
    type: bool
    default: true
  gpu_layers:
    description: The target's C(--n-gpu-layers) (C(all), C(auto) or a number; 0 keeps it on the CPU on purpose).
    type: raw
    default: all
  gpu_layers_draft:
    description: The drafter's C(--n-gpu-layers-draft), read the same way.
    type: raw
    default: all
  expected_mib:
    description:
      - MiB the preflight estimates the models put on the GPU (weights, KV cache, scratch; no headroom). The
        process must hold at least half of it. Omitted - only its presence in nvidia-smi's list is checked.
    type: float
  log_lines:
    description:
      - How many journal lines of the current run to read, from its start (the load comes first; a server that has
        served for days has logged much more since).
    type: int
    default: 5000
supports_check_mode: true
author: rigkit
"""

EXAMPLES = r"""
- name: Prove that both models run on the GPU
  llama_server_offload:
    unit: rigkit-llama-main.service
    container: rigkit-llama-main
    gpu_layers: all
    gpu_layers_draft: all
    expected_mib: 1364
"""

RETURN = r"""
on_gpu:
  description: Whether both models are on the GPU (always true on success).
  type: bool
  returned: always
cause:
  description: The first cause found (see the description), null on success.
  type: str
  returned: always
problems:
  description: Every cause found, each with C(cause), C(text) and C(detail).
  type: list
  elements: dict
  returned: always
target:
  description: The target's load - C(offloaded) (C(N/M)), C(buffers_mib) by device, C(cuda_mib).
  type: dict
  returned: always
drafter:
  description: The drafter's load, the same way (null without a drafter).
  type: dict
  returned: always
gpu_memory_mib:
  description: MiB the server's process holds on the GPU per nvidia-smi (null when not measured).
  type: int
  returned: always
pid:
  description: The container's main process, as the host sees it.
  type: int
  returned: always
evidence:
  description: The log lines the verdict rests on.
  type: list
  elements: str
  returned: always
"""

import re

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpu_offload import GpuOffloadError, check
from ansible.module_utils.llama_server.unit import unit_state
from ansible.module_utils.rig_command import run

COMPUTE_APPS = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]


def run_log(unit: str, invocation: str, lines: int) -> list[str]:
    """The first ``lines`` journal lines of the unit's current run (its invocation ID): the load log."""
    argv = ["journalctl", "--unit", unit, "--output", "cat", "--no-pager", f"_SYSTEMD_INVOCATION_ID={invocation}"]
    _code, out, _err = run(argv, timeout=120)
    return [line for line in out.splitlines()[:lines] if line.strip()]


def container_pid(container: str) -> tuple[int | None, str]:
    """The host PID of the container's main process (llama-server: the image's entrypoint), or None and why."""
    code, out, err = run(["docker", "inspect", "--format", "{{.State.Pid}}", container], timeout=30)
    text = out.strip()
    if code != 0 or not re.fullmatch(r"[0-9]+", text) or text == "0":
        return None, f"docker inspect {container} gave no running process ({(err or out).strip() or code})"
    return int(text), ""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "required": True},
            "container": {"type": "str", "required": True},
            "drafter": {"type": "bool", "default": True},
            "gpu_layers": {"type": "raw", "default": "all"},
            "gpu_layers_draft": {"type": "raw", "default": "all"},
            "expected_mib": {"type": "float"},
            "log_lines": {"type": "int", "default": 5000},
        },
        supports_check_mode=True,
    )
    p = module.params
    state = unit_state(p["unit"])
    if state.get("ActiveState") != "active":
        module.fail_json(
            msg=f"{p['unit']} is {state.get('ActiveState')}/{state.get('SubState')}: there is no running server to "
            f"check (journalctl --unit {p['unit']} says why)",
            on_gpu=False,
        )
    if not state.get("InvocationID"):
        module.fail_json(msg=f"{p['unit']} reports no invocation ID: cannot tell its current run's log", on_gpu=False)
    log = run_log(p["unit"], state["InvocationID"], p["log_lines"])
    pid, why_no_pid = container_pid(p["container"])
    if pid is None:
        module.fail_json(msg=f"cannot tell which process is the server: {why_no_pid}", on_gpu=False)
    code, out, err = run(COMPUTE_APPS, timeout=60)
    compute_apps = out if code == 0 else None
    if compute_apps is None:
        module.warn(
            f"nvidia-smi did not answer (rc {code}: {err.strip()[:200]}): the server's GPU memory is not checked, "
            "only its load log"
        )
    try:
        verdict = check(
            log,
            drafter=p["drafter"],
            gpu_layers=p["gpu_layers"],
            gpu_layers_draft=p["gpu_layers_draft"],
            compute_apps=compute_apps,
            pid=pid,
            expected_mib=p["expected_mib"],
        )
    except GpuOffloadError as exc:
        module.fail_json(msg=str(exc), on_gpu=False)
    result = {**verdict.as_dict(), "pid": pid, "changed": False}
    if not verdict.on_gpu:
        lines = "\n".join(verdict.evidence[-16:]) or "(no CUDA or load_tensors lines)"
        result["msg"] = f"{verdict.message}\nthe server's load lines:\n{lines}"
        result["server_log"] = log[-40:]
        module.fail_json(**result)
    result["msg"] = verdict.message
    module.exit_json(**result)


if __name__ == "__main__":
    main()
