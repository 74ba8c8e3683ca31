"""The catalog in the repo is well formed, and undeployable entries are refused with a way out."""

from __future__ import annotations

import copy

import pytest
import yaml
from ansible.module_utils.model_catalog import (
    CatalogError,
    catalog_entry,
    catalog_problems,
    deployable_entry,
    entry_problems,
)

from tests.support import REPO

CATALOG = yaml.safe_load((REPO / "inventory/group_vars/all/model_catalog.yml").read_text())["model_catalog"]

SEED_DRAFTER_PINS = {
    # sha256 pins printed in the seed article
    "gemma-4-E2B-it-qat-assistant-q4_0-exact": "060f5a0158f8120d25137866b90e04e21cd0d2d23de1db7a9cc3b7f00e60bd11",
    "gemma-4-E4B-it-qat-assistant-q4_0-exact": "dc965cb963e56b86fbc04db8efec83163886085e88514574650a57fa55a2ee24",
}


def test_repo_catalog_has_no_problems():
    assert catalog_problems(CATALOG) == []


def test_seed_configurations_are_listed():
    for name, sha in SEED_DRAFTER_PINS.items():
        assert CATALOG[name]["sha256"] == sha
        assert CATALOG[name]["architecture"] == "gemma4-assistant"
        assert CATALOG[name]["role"] == "drafter"
    files = {entry["filename"] for entry in CATALOG.values()}
    assert {"gemma-4-E4B-it-Q4_K_M.gguf", "MTP/gemma-4-E4B-it-Q8_0-MTP.gguf"} <= files
    assert "gemma-4-e4b-it-mtp-assistant-ultralight.f16.gguf" in files


def test_every_drafter_names_a_target_it_pairs_with():
    for name, entry in CATALOG.items():
        if entry["role"] == "drafter" and entry["architecture"] == "gemma4-assistant":
            assert CATALOG[entry["pairs_with"]]["architecture"] == "gemma4", name


def test_unknown_model_lists_known_ones():
    with pytest.raises(CatalogError) as err:
        catalog_entry(CATALOG, "gemma-9-huge")
    assert "gemma-9-huge" in str(err.value)
    assert "gemma-4-E2B-it-qat-assistant-q4_0-exact" in str(err.value)


def test_unpinned_entry_refused_with_pin_command():
    with pytest.raises(CatalogError) as err:
        deployable_entry(CATALOG, "gemma-4-E2B-it-qat-q4_0-exact", "target")
    message = str(err.value)
    assert "not pinned" in message and "revision" in message and "sha256" in message
    assert "make pin model=gemma-4-E2B-it-qat-q4_0-exact revision=" in message


def test_entry_without_repo_says_to_set_it_first():
    with pytest.raises(CatalogError, match="set its repo"):
        deployable_entry(CATALOG, "gemma-4-e4b-it-mtp-assistant-ultralight-f16", "drafter")


def test_pinned_entry_is_deployable_and_role_is_checked():
    entry = deployable_entry(CATALOG, "gemma-3-270m-it-q4_k_m", "target")
    assert entry["size"] == 253_113_024
    assert entry["name"] == "gemma-3-270m-it-q4_k_m"
    with pytest.raises(CatalogError, match="used here as the drafter"):
        deployable_entry(CATALOG, "gemma-4-E2B-it-qat-q4_0-exact", "drafter")


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("sha256", "ABC", "64 lowercase hex"),
        ("revision", "main", "full 40-character commit"),
        ("revision", 184, "full 40-character commit"),
        ("size", -1, "positive number of bytes"),
        ("size", True, "positive number of bytes"),
        ("role", "assistant", "role must be one of"),
        ("filename", "model.bin", ".gguf"),
    ],
)
def test_malformed_fields_are_named(field, value, expected):
    entry = copy.deepcopy(CATALOG["gemma-3-270m-it-q4_k_m"])
    entry[field] = value
    problems = entry_problems("x", entry)
    assert any(expected in problem for problem in problems), problems


def test_dangling_pairs_with_is_a_problem():
    catalog = copy.deepcopy(CATALOG)
    catalog["gemma-4-E2B-it-qat-assistant-q4_0-exact"]["pairs_with"] = "nope"
    assert any("pairs_with names 'nope'" in problem for problem in catalog_problems(catalog))
