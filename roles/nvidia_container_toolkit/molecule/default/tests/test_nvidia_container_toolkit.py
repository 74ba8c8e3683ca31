"""Verify the nvidia_container_toolkit role's Docker configuration in a systemd rig container (no GPU, no
NVIDIA repository: the packages are not installed, the daemon.json merge and the Docker restart run for real)."""

from __future__ import annotations

import json


def test_runtime_merged_next_to_other_owners_keys(host):
    config = json.loads(host.file("/etc/docker/daemon.json").content_string)
    assert config["runtimes"] == {"nvidia": {"path": "nvidia-container-runtime", "args": []}}
    assert "default-runtime" not in config
    # The docker role's keys and a key another owner wrote are all still there.
    assert config["bridge"] == "none"
    assert config["log-opts"] == {"max-size": "10m"}
    assert config["max-concurrent-downloads"] == 4


def test_running_engine_knows_the_runtime(host):
    assert host.service("docker").is_running
    runtimes = json.loads(host.check_output("docker info --format '{{json .Runtimes}}'"))
    assert "nvidia" in runtimes
    assert runtimes["nvidia"]["path"] == "nvidia-container-runtime"


def test_no_toolkit_packages_faked(host):
    for name in ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container1"):
        assert not host.package(name).is_installed
    assert not host.file("/etc/apt/sources.list.d/nvidia-container-toolkit.sources").exists
    # No key either: the pinned key is fetched only with the packages (unreachable here).
    assert not host.file("/etc/apt/keyrings/nvidia-container-toolkit.asc").exists


def test_no_cdi_spec_without_a_gpu(host):
    assert not host.file("/etc/cdi/nvidia.yaml").exists
