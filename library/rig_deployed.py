#!/usr/bin/python
"""Ansible module: read back what the kit deployed on a rig (packages, GPU, image, models, unit, server)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: rig_deployed
short_description: Read back what the kit deployed on a rig, as it is now
description:
  - Installed NVIDIA, CUDA and container-engine packages with their versions and holds; the GPU as nvidia-smi
    reports it; the image the server runs (ID and the labels that record its llama.cpp commit, source sha256 and
    base images); whether each model file is still the verified one; the server unit's state, uptime and file
    hash; and, with I(server=true), what the running server reports (build, context, drafting, lifetime draft
    acceptance and decode rate).
  - Changes nothing. Probes that cannot answer return nulls instead of failing.
options:
  unit:
    description: The server's systemd unit.
    type: str
    required: true
  unit_path:
    description: The unit file (its sha256 is returned).
    type: path
    required: true
  container:
    description: The server's container name.
    type: str
    required: true
  image:
    description: The image tag the server should run.
    type: str
    required: true
  models:
    description: Model files to check, each with C(role), C(name), C(path), C(sha256), C(size).
    type: list
    elements: dict
    default: []
  url:
    description: The server's base URL (loopback on the rig).
    type: str
  driver_version:
    description:
      - The NVIDIA driver version the rig pins (GPU rigs). When given, every kernel under C(/boot) is read with
        whether it has that driver's module (C(kernels)); an empty string (a rig that follows a branch, as on
        Ubuntu) counts a module of any version, DKMS's or Ubuntu's prebuilt one.
    type: str
  proven_path:
    description:
      - The instance's C(.proven) file (the configuration digest its last passing canary recorded); the
        container's C(proven) says whether it runs that configuration.
    type: path
  server:
    description: Also ask the running server (for the status table; the lock does not need it).
    type: bool
    default: true
supports_check_mode: true
extends_documentation_fragment:
  - rigkit_server_client
author: rigkit
"""

EXAMPLES = r"""
- name: Read back the rig
  rig_deployed:
    unit: rigkit-llama-main.service
    unit_path: /etc/systemd/system/rigkit-llama-main.service
    container: rigkit-llama-main
    image: rigkit/llama-server:b11312-0c1e570-cpu-4bdc9a9447ec
    url: http://127.0.0.1:8080
"""

RETURN = r"""
packages:
  description: "{name: {version, held}} for the NVIDIA, CUDA and container-engine packages."
  type: dict
  returned: always
gpu:
  description: name, memory_mib, compute_capability, driver, cuda (null without a GPU).
  type: dict
  returned: always
image:
  description: tag, id and the build labels (null when the image is missing).
  type: dict
  returned: always
models:
  description: Per role, the path, sha256 and whether the file is still the verified one.
  type: dict
  returned: always
unit:
  description: active, sub, uptime_s, path and sha256 of the unit file.
  type: dict
  returned: always
container:
  description:
    - image_id, image, running, health, settings (from its argv), and proven (the configuration it started from is
      the one whose canary passed; false without I(proven_path)); null when there is no container.
  type: dict
  returned: always
kernels:
  description: running, newest, reboot_strands_gpu and per installed kernel whether it has the NVIDIA module.
  type: dict
  returned: when driver_version is given, empty or not
server:
  description: What the running server reports (answers false when it does not).
  type: dict
  returned: when server
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llama_server.api import CLIENT_ARGUMENT_SPEC
from ansible.module_utils.nvidia_kernels import survey
from ansible.module_utils.rig_deployed import container, file_sha256, gpu, image, model, packages, server, unit_state


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "required": True},
            "unit_path": {"type": "path", "required": True},
            "container": {"type": "str", "required": True},
            "image": {"type": "str", "required": True},
            "models": {"type": "list", "elements": "dict", "default": []},
            "url": {"type": "str"},
            **CLIENT_ARGUMENT_SPEC,
            "driver_version": {"type": "str"},
            "proven_path": {"type": "path"},
            "server": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    params = module.params
    unit = unit_state(params["unit"])
    unit["sha256"] = file_sha256(params["unit_path"])
    result = {
        "changed": False,
        "packages": packages(),
        "gpu": gpu(),
        "image": image(params["image"]),
        "container": container(params["container"], params["proven_path"]),
        "unit": unit,
        "models": {
            spec["role"]: {"name": spec["name"], **model(spec["path"], spec["sha256"], int(spec["size"]))}
            for spec in params["models"]
        },
    }
    if params["driver_version"] is not None:
        result["kernels"] = survey(params["driver_version"])
    if params["server"]:
        if not params["url"]:
            module.fail_json(msg="server=true needs url")
        result["server"] = server(params["url"], params["api_key"], ca_file=params["ca_file"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
