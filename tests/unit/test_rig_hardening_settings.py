"""What GPU rigs get from the inventory for issue 15, item 8: daemon.json keeps containers through a dockerd
restart and forbids privilege gain; the toolkit's GPU check image is pinned by digest (the image's own
runtime base, so it is real and already on a rig that runs the server)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DIGEST = re.compile(r"^[a-z0-9./_-]+(:[\w.-]+)?@sha256:[0-9a-f]{64}$")


@pytest.fixture(scope="module")
def hostvars() -> dict:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", "inventory/hosts.yml", "--list"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout)["_meta"]["hostvars"]


def test_gpu_rigs_daemon_json_live_restore_and_no_new_privileges(hostvars: dict) -> None:
    gpu_rigs = [name for name, vars_ in hostvars.items() if vars_.get("rig_kind") == "gpu"]
    assert gpu_rigs
    for rig in gpu_rigs:
        options = hostvars[rig]["docker_daemon_options"]
        assert options["live-restore"] is True, rig
        assert options["no-new-privileges"] is True, rig
        assert options["log-opts"] == {"max-size": "10m", "max-file": "3"}, rig


def test_toolkit_check_image_is_pinned_by_digest() -> None:
    toolkit = yaml.safe_load((REPO / "roles/nvidia_container_toolkit/defaults/main.yml").read_text())
    image = toolkit["nvidia_container_toolkit_test_image"]
    assert DIGEST.match(image), f"{image} is a tag, not a digest"
    runtime = yaml.safe_load((REPO / "roles/llamacpp_image/defaults/main.yml").read_text())
    assert image == runtime["llamacpp_image_runtime_base"]  # the image a GPU rig pulls anyway
