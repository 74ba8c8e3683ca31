"""The validation's CDI rule (rigkit/validation/compat.py: cdi_engine_problem) against a real engine: the harness's
Docker is asked to start a container with the CDI device the llama-server units pass (``--device
nvidia.com/gpu=all``), and its answer must be the rule's. On Debian 12's docker.io 20.10 (this machine's engine) the
rule refuses and the engine stops with the words the refusal quotes; on an engine with CDI the rule passes and the
engine does not give those words (it names the device it cannot resolve instead).

Needs the Docker engine and the rig image (``make harness``); the container it asks for never starts."""

from __future__ import annotations

import json
import subprocess

from rigkit.validation.compat import NO_CDI_ERROR, cdi_engine_problem


def docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120, check=False)


def test_the_engine_answers_a_cdi_device_as_the_rule_says(harness: dict[str, int]) -> None:
    version = docker("version", "--format", "{{.Server.Version}}").stdout.strip()
    info = json.loads(docker("info", "--format", "{{json .}}").stdout)
    enabled = bool(info.get("CDISpecDirs"))  # engines with CDI list their spec directories only when it is on
    rig = {
        "llama_server_gpu_access": "cdi",
        "docker_source": "docker",
        "docker_version": version,
        "docker_daemon_options": {"features": {"cdi": enabled}},
    }
    refused = cdi_engine_problem(rig)
    done = docker("run", "--rm", "--network", "none", "--device", "nvidia.com/gpu=all", "--entrypoint", "true",
                  "rigkit/rig:bookworm")  # fmt: skip
    assert done.returncode != 0, "no NVIDIA device here: the engine must not start the container"
    if refused:
        assert f"Error response from daemon: {NO_CDI_ERROR}" in done.stderr, (version, done.stderr)
        assert f"Docker {'.'.join(version.split('.')[:2])}" in refused[2]
    else:
        assert NO_CDI_ERROR not in done.stderr and "nvidia.com/gpu=all" in done.stderr, (version, done.stderr)
