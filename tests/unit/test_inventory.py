"""The inventory resolves for every rig, and the Makefile refuses unknown rigs at once."""

from __future__ import annotations

import json
import re

import pytest

from tests.support import REPO, model_catalog, recap, run

SEED_RIGS = {
    # host: (compute capability, VRAM MiB, draft length) from the seed article
    "desktop3050": ("8.6", 8192, 2),
    "laptop1650ti": ("7.5", 4096, 1),
}


@pytest.fixture(scope="module")
def inventory() -> dict:
    result = run(["ansible-inventory", "--list"])
    assert result.returncode == 0, result.tail()
    return json.loads(result.output[result.output.index("{") :])


def test_groups(inventory):
    assert set(inventory["gpu_rigs"]["hosts"]) == {"desktop3050", "laptop1650ti"}
    assert inventory["sandbox_rigs"]["hosts"] == ["sandbox", "sandbox-mtp"]


@pytest.mark.parametrize("host", sorted(SEED_RIGS))
def test_gpu_rigs_match_the_seed(inventory, host):
    hostvars = inventory["_meta"]["hostvars"][host]
    capability, vram, draft = SEED_RIGS[host]
    assert hostvars["rig_gpu"]["compute_capability"] == capability
    assert hostvars["rig_gpu"]["vram_mib"] == vram
    assert hostvars["llama_server_spec_draft_n_max"] == draft
    assert hostvars["llama_server_ctx_size"] == 8192
    assert hostvars["llama_server_spec_type"] == "draft-mtp"
    assert hostvars["models_target"] == "gemma-4-E2B-it-qat-q4_0-exact"
    assert hostvars["models_drafter"] == "gemma-4-E2B-it-qat-assistant-q4_0-exact"
    assert hostvars["ansible_connection"] == "ansible.builtin.ssh"


def test_every_rig_names_catalog_models(inventory):
    catalog = model_catalog()
    for host in inventory["rigs"]["children"]:
        for rig in inventory[host]["hosts"]:
            hostvars = inventory["_meta"]["hostvars"][rig]
            assert hostvars["models_target"] in catalog, rig
            assert hostvars["models_drafter"] in catalog, rig


def test_no_plain_text_secrets_in_inventory():
    for path in (REPO / "inventory").rglob("*.yml"):
        text = path.read_text()
        for word in ("password:", "api_key:", "token:"):
            for line in text.splitlines():
                if word in line and not line.lstrip().startswith("#"):
                    assert "!vault" in line or "{{" in line, f"{path}: {line}"


def test_unknown_host_fails_at_once_listing_known_ones():
    result = run(["make", "--no-print-directory", "provision", "host=nope"])
    assert result.returncode != 0
    assert "unknown host nope" in result.output
    for rig in ("desktop3050", "laptop1650ti", "sandbox", "sandbox-mtp"):
        assert rig in result.output
    assert "PLAY" not in result.output  # refused before Ansible started


@pytest.mark.parametrize("host", sorted(SEED_RIGS))
def test_check_on_a_real_rig_asks_for_the_model_pins_before_connecting(host):
    """The seed rigs' Gemma 4 files are not pinned yet (Hugging Face is out of reach here): `make check` must
    stop before contacting the rig, naming the command that pins them."""
    result = run(
        ["make", "--no-print-directory", "check", f"host={host}", "ARGS=-e ansible_host=127.0.0.1 -e ansible_port=1"],
        log_name=f"check-{host}-unpinned",
    )
    counters = recap(result.output)[host]
    assert counters["failed"] == 1 and counters["unreachable"] == 0, result.tail()
    # One command for the rig (Ansible prints the message twice: its error line and the task result).
    assert set(re.findall(r"make pin \S+", result.output)) == {f"make pin host={host}"}
    assert f"{host} needs 2 model(s) that are not pinned yet" in result.output
    for name in ("gemma-4-E2B-it-qat-q4_0-exact", "gemma-4-E2B-it-qat-assistant-q4_0-exact"):
        assert f"{name} (" in result.output  # both unpinned entries listed at once
    assert "ssh" not in result.output


@pytest.mark.parametrize("host", sorted(SEED_RIGS))
def test_check_mode_resolves_every_variable_of_a_gpu_rig(host, tmp_path):
    """With its models pinned, `make check` on a real rig passes validation; only the connection may fail."""
    catalog = model_catalog()
    for name in ("gemma-4-E2B-it-qat-q4_0-exact", "gemma-4-E2B-it-qat-assistant-q4_0-exact"):
        catalog[name].update(revision="0" * 40, sha256=catalog[name]["sha256"] or "1" * 64, size=1000)
    pins = tmp_path / "pins.json"
    pins.write_text(json.dumps({"model_catalog": catalog}))
    result = run(
        [
            "make",
            "--no-print-directory",
            "check",
            f"host={host}",
            f"ARGS=-e ansible_host=127.0.0.1 -e ansible_port=1 -e @{pins}",
        ],
        log_name=f"check-{host}",
    )
    counters = recap(result.output)[host]
    assert counters["failed"] == 0, result.tail()
    assert counters["unreachable"] == 1, result.tail()
    assert "Check the rig's variables against the roles' argument specs" in result.output
    assert "ssh: connect to host 127.0.0.1 port 1" in result.output
