"""What GPU rigs get from the inventory: daemon.json keeps containers through a dockerd restart and forbids
privilege gain."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


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
