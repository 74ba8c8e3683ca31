"""Verify the models role inside a systemd rig container (converged against the tiny-pair stand-in)."""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml

import rigkit  # noqa: F401  (first: it makes module_utils/ importable as ansible.module_utils)

# isort: split
from ansible.module_utils.model_catalog import rig_model_path

from rigkit.validation.rules import role_defaults

REPO = pathlib.Path(__file__).resolve().parents[5]
CATALOG = yaml.safe_load((REPO / "inventory/group_vars/all/model_catalog.yml").read_text())["model_catalog"]
MODELS_DIR = role_defaults("models")["models_dir"]
DEPLOYED = ("tiny-gemma4-target", "tiny-gemma4-assistant")


def model_path(name: str) -> str:
    return rig_model_path(MODELS_DIR, CATALOG[name])


@pytest.fixture(scope="module")
def facts(host):
    return json.loads(host.file("/root/models-facts.json").content_string)


def test_models_dir_is_root_owned(host):
    models = host.file(MODELS_DIR)
    assert models.is_directory
    assert (models.user, models.group, models.mode) == ("root", "root", 0o755)


@pytest.mark.parametrize("name", DEPLOYED)
def test_model_is_verified_and_read_only(host, name):
    entry = CATALOG[name]
    model = host.file(model_path(name))
    assert model.is_file
    assert model.size == entry["size"]
    assert model.sha256sum == entry["sha256"]
    assert (model.user, model.group, model.mode) == ("root", "root", 0o644)
    directory = host.file(str(pathlib.PurePath(model_path(name)).parent))
    assert (directory.user, directory.group, directory.mode) == ("root", "root", 0o755)
    assert host.file(f"{model_path(name)}.part").exists is False


@pytest.mark.parametrize("name", DEPLOYED)
def test_server_user_reads_but_cannot_write(host, name):
    assert host.run(f"runuser -u nobody -- head -c 4 {model_path(name)}").stdout == "GGUF"
    assert host.run(f"runuser -u nobody -- test -w {model_path(name)}").rc != 0


def test_path_facts(facts):
    assert facts["target_path"] == model_path("tiny-gemma4-target")
    assert facts["drafter_path"] == model_path("tiny-gemma4-assistant")
    for key, name in (("target_entry", "tiny-gemma4-target"), ("drafter_entry", "tiny-gemma4-assistant")):
        assert facts[key]["name"] == name
        assert facts[key]["sha256"] == CATALOG[name]["sha256"]
        assert facts[key]["architecture"] == CATALOG[name]["architecture"]


def test_prune_removed_only_what_nothing_references(host):
    assert not host.file(f"{MODELS_DIR}/0123456789abcdef").exists
    assert not host.file(f"{MODELS_DIR}/notes.txt").exists
    kept = host.file(model_path("gemma-3-270m-it-q4_k_m"))
    assert kept.is_file
    listing = sorted(host.check_output(f"ls -A {MODELS_DIR}").split())
    kept_names = (*DEPLOYED, "gemma-3-270m-it-q4_k_m")
    expected = sorted({pathlib.PurePath(model_path(name)).parent.name for name in kept_names})
    assert listing == expected
