"""README's "Adding a rig" walkthrough, done for real on a copy of the inventory: one inventory line plus the
example host-variables file (a 12 GB RTX 3060 with the UltraLight drafter) make a rig the kit knows, whose
server gets the model card's configuration, and which is refused at once until its models are pinned."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from tests.support import REPO, run

EXAMPLE = REPO / "inventory/examples/desktop3060.yml"


@pytest.fixture(scope="module")
def overlay(tmp_path_factory) -> str:
    """The kit's inventory plus the walkthrough's two steps, as ANSIBLE_INVENTORY."""
    extra = tmp_path_factory.mktemp("third-rig")
    (extra / "host_vars").mkdir()
    shutil.copy(EXAMPLE, extra / "host_vars" / "desktop3060.yml")
    (extra / "hosts.yml").write_text(
        yaml.safe_dump({"all": {"children": {"rigs": {"children": {"gpu_rigs": {"hosts": {"desktop3060": None}}}}}}})
    )
    return f"inventory/hosts.yml,{extra}"


def test_the_new_rig_is_known(overlay):
    known = run(["python", "bin/rigkit", "check-host", "desktop3060"], ANSIBLE_INVENTORY=overlay)
    assert known.returncode == 0, known.output
    unknown = run(["python", "bin/rigkit", "check-host", "desktop3060"])
    assert unknown.returncode == 2 and "unknown host desktop3060" in unknown.output


def test_server_gets_the_model_cards_configuration(overlay):
    result = run(
        ["ansible-playbook", "tests/unit/playbooks/server_args.yml", "--limit", "desktop3060"],
        ANSIBLE_INVENTORY=overlay,
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
    )
    assert result.returncode == 0, result.output[-3000:]
    report = json.loads(result.output[result.output.index("{") :])
    effective = report["plays"][0]["tasks"][-1]["hosts"]["desktop3060"]["llama_server_effective"]
    argv = " ".join(effective["args"])
    for flag in (
        "--ctx-size 32768",
        "--parallel 1",
        "--spec-type draft-mtp",
        "--spec-draft-n-max 8",
        "--swa-full",
        "--kv-unified",
        "--cache-type-k q4_0",
        "--cache-type-v q4_0",
        "--batch-size 128",
        "--ubatch-size 128",
        "--threads 12",
        "--threads-batch 12",
        "--load-mode mmap+mlock",
        "--jinja",
        "--model-draft /var/lib/rigkit/models/drafter.gguf",
    ):
        assert flag in argv, flag
    assert effective["host"] == "127.0.0.1"  # loopback unless told otherwise


def test_check_refuses_the_unpinned_models_with_the_pin_command(overlay):
    result = run(["make", "--no-print-directory", "check", "host=desktop3060"], ANSIBLE_INVENTORY=overlay)
    assert result.returncode != 0
    assert "desktop3060 needs 2 model(s) that are not pinned yet" in result.output
    assert "unsloth-gemma-4-E4B-it-Q4_K_M (target" in result.output
    assert "gemma-4-e4b-it-mtp-assistant-ultralight-f16 (drafter, no repo)" in result.output
    assert "set its repo" in result.output
    assert set(re.findall(r"make pin \S+", result.output)) == {"make pin host=desktop3060"}  # one command, by rig
    assert "Provision the rigs" not in result.output  # refused before any rig is touched
