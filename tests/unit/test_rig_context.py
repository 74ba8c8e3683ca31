"""roles/rig_context names every rig's context on the controller, GPU and sandbox rigs in one play: a sandbox's
llama.cpp image is named after its base image, whatever order the hosts' includes come in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support import REPO, json_callback_env, role_defaults

PLAYBOOK = REPO / "tests/unit/playbooks/rig_context.yml"


def test_mixed_fleet_is_named_without_contacting_a_rig() -> None:
    import json

    argv = [str(Path(sys.executable).parent / "ansible-playbook"), str(PLAYBOOK)]
    done = subprocess.run(argv, cwd=REPO, env=json_callback_env(), capture_output=True, text=True, timeout=300)
    result = json.loads(done.stdout)
    assert all(not (s["failures"] or s["unreachable"]) for s in result["stats"].values()), done.stdout[-4000:]
    shown = {host: r["msg"] for host, r in result["plays"][0]["tasks"][-1]["hosts"].items()}
    assert {"sandbox", "sandbox-mtp", "desktop3050", "laptop1650ti"} <= set(shown)
    repository = role_defaults("llamacpp_image")["llamacpp_image_repository"]
    for host, names in shown.items():
        assert names["image"].startswith(repository + ":b"), (host, names)
    assert shown["sandbox"]["base"].startswith("rigkit/debian:") and shown["desktop3050"]["base"] == ""
    assert "-cpu-" in shown["sandbox"]["image"] and "-cuda-" in shown["desktop3050"]["image"]
