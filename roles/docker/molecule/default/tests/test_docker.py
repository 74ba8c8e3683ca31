"""Verify the docker role inside a systemd rig container."""

from __future__ import annotations

import json
import subprocess

import pytest

RIG_IMAGE = "rigkit/rig:bookworm"


def test_engine_installed_from_debian_and_held(host):
    package = host.package("docker.io")
    assert package.is_installed
    assert package.version.startswith("20.10.24+dfsg1-")
    selections = host.check_output("dpkg --get-selections docker.io")
    assert selections.split() == ["docker.io", "hold"]


def test_service_active_and_enabled(host):
    service = host.service("docker")
    assert service.is_running
    assert service.is_enabled


def test_daemon_json_merged(host):
    config = json.loads(host.file("/etc/docker/daemon.json").content_string)
    # The kit's keys ...
    assert config["bridge"] == "none"
    assert config["iptables"] is False
    assert config["live-restore"] is True
    # ... merged into what another owner wrote, nested objects key by key.
    assert config["max-concurrent-downloads"] == 4
    assert config["log-opts"] == {"max-file": "5", "max-size": "10m"}


def test_running_engine_uses_the_config(host):
    info = json.loads(host.check_output("docker info --format '{{json .}}'"))
    assert info["LiveRestoreEnabled"] is True
    assert info["LoggingDriver"] == "json-file"
    networks = host.check_output("docker network ls --format '{{.Name}}'").split()
    assert "bridge" not in networks


@pytest.fixture(scope="module")
def image_in_rig(host):
    """Move an image from the machine's engine into the rig's engine (no registry here)."""
    rig = host.backend.get_hostname()
    save = subprocess.Popen(["docker", "save", RIG_IMAGE], stdout=subprocess.PIPE)
    load = subprocess.run(["docker", "exec", "-i", rig, "docker", "load"], stdin=save.stdout, capture_output=True)
    save.stdout.close()
    assert save.wait() == 0
    assert load.returncode == 0, load.stderr
    return RIG_IMAGE


def test_nested_container_runs(host, image_in_rig):
    result = host.run(f"docker run --rm --network host {image_in_rig} true")
    assert result.rc == 0, result.stderr
    echoed = host.check_output(f"docker run --rm --network host {image_in_rig} echo nested-ok")
    assert echoed == "nested-ok"
