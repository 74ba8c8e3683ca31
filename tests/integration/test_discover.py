"""`rigkit discover` against a real container: the read-only gather script runs in it through `docker exec`,
and the CPU rig profile it writes into a copy of the inventory resolves as a sandbox rig.

The container is a plain one (the rig image, `sleep infinity`, host network) started and removed here. The
image is the harness's rig image; RIGKIT_DISCOVER_IMAGE names another one (any Debian 12 image) to run this
test without building the harness."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support import REPO, remove_rig, run


@pytest.fixture(scope="module")
def image(request: pytest.FixtureRequest) -> str:
    if os.environ.get("RIGKIT_DISCOVER_IMAGE"):
        return os.environ["RIGKIT_DISCOVER_IMAGE"]
    request.getfixturevalue("harness")
    return "rigkit/rig:bookworm"


@pytest.fixture
def container(image: str) -> Iterator[str]:
    name = f"discover-test-{uuid.uuid4().hex[:8]}"
    started = subprocess.run(
        ["docker", "run", "-d", "--name", name, "--network", "host", image, "sleep", "infinity"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert started.returncode == 0, started.stderr
    try:
        yield name
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


def test_discover_writes_a_cpu_profile_for_a_container(container: str, tmp_path: Path) -> None:
    inventory = tmp_path / "inventory"
    shutil.copytree(REPO / "inventory", inventory)
    before = subprocess.run(
        ["docker", "diff", container], capture_output=True, text=True, check=True
    ).stdout  # nothing yet
    argv = ["python", "bin/rigkit", "discover", "sandbox-found", f"docker:{container}", "--port", "18199"]
    done = run([*argv, "--inventory-dir", str(inventory)], log_name="discover-container")
    assert done.returncode == 0, done.output
    assert "Debian GNU/Linux 12 (bookworm)" in done.output
    # gathering changed nothing in the container
    after = subprocess.run(["docker", "diff", container], capture_output=True, text=True, check=True).stdout
    assert after == before

    written = yaml.safe_load((inventory / "host_vars/sandbox-found.yml").read_text())
    sandbox = yaml.safe_load((REPO / "inventory/host_vars/sandbox.yml").read_text())
    assert written["ansible_host"] == container and written["llama_server_port"] == 18199
    for key in ("models_target", "models_drafter", "llama_server_spec_type", "llama_server_spec_draft_n_max"):
        assert written[key] == sandbox[key], key
    assert written["llama_server_ctx_size"] == 2048  # this machine's RAM holds far more; the sandbox's cap

    listed = run(["ansible-inventory", "-i", str(inventory / "hosts.yml"), "--list"])
    assert listed.returncode == 0, listed.tail()
    data = json.loads(listed.output[listed.output.index("{") :])
    assert "sandbox-found" in data["sandbox_rigs"]["hosts"]
    hostvars = data["_meta"]["hostvars"]["sandbox-found"]
    assert hostvars["rig_kind"] == "sandbox" and hostvars["ansible_connection"] == "community.docker.docker"
    assert hostvars["ansible_host"] == container  # the literal beats the group's rigkit-{{ inventory_hostname }}


def test_the_discovered_profile_converges(llama_image, container: str, tmp_path: Path) -> None:
    """Discover a container, then `make provision` the profile it wrote: the rig converges and drafts."""
    inventory = tmp_path / "inventory"
    shutil.copytree(REPO / "inventory", inventory)
    port = 18198
    argv = ["python", "bin/rigkit", "discover", "sandbox-found", f"docker:{container}", "--port", str(port)]
    done = run([*argv, "--inventory-dir", str(inventory)], log_name="discover-converge-discover")
    assert done.returncode == 0, done.output
    try:
        converged = run(
            ["make", "--no-print-directory", "provision", "host=sandbox-found"],
            log_name="discover-converge-provision",
            ANSIBLE_INVENTORY=str(inventory / "hosts.yml"),
        )
        assert converged.returncode == 0, converged.tail(120)
        assert f'llama-server "main" on sandbox-found answers at http://127.0.0.1:{port}' in converged.output
        assert "draft acceptance" in converged.output
    finally:
        # provision turned the container into a systemd rig with a Docker data volume of its own
        remove_rig(container)
