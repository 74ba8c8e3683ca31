"""The catalog in the repo is well formed, and undeployable entries are refused with a way out."""

from __future__ import annotations

import copy

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible.module_utils.model_catalog import (
    CatalogError,
    catalog_entry,
    catalog_problems,
    deployable_entry,
    entry_problems,
    host_pin_refusal,
    rig_model_dir,
    rig_model_path,
)

from filter_plugins.model_catalog import FilterModule
from rigkit.paths import cached_model_path, model_cache
from tests.support import REPO, model_catalog

CATALOG = model_catalog()

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
    assert "not pinned (revision missing)" in message and "holding the recorded sha256" in message
    assert "`make pin model=gemma-4-E2B-it-qat-q4_0-exact`" in message
    with pytest.raises(
        CatalogError, match=r"\(revision, sha256, size missing\).*at unsloth/gemma-4-E4B-it-GGUF's main"
    ):
        deployable_entry(CATALOG, "unsloth-gemma-4-E4B-it-Q4_K_M", "target")


# Public records of the seed rigs' exact targets and Google's official QAT files.
SEED_TARGET_FACTS = {
    "gemma-4-E2B-it-qat-q4_0-google": (
        "google/gemma-4-E2B-it-qat-q4_0-gguf",
        "gemma-4-E2B_q4_0-it.gguf",
        "675cff42a74c774d6cb76f76d8eacb49b48c9b93",
        3_349_516_256,
        "fa401b55b07ee70a54c6dae3903c783a6e65064312529ea57175cb5f8dec6634",
    ),
    "gemma-4-E4B-it-qat-q4_0-google": (
        "google/gemma-4-E4B-it-qat-q4_0-gguf",
        "gemma-4-E4B_q4_0-it.gguf",
        "4b4a2c1d584be7264f87aac328a1bc739ce81b6c",
        5_154_941_280,
        "676c35070db6dbe52f93e9c864ee0fba4eddea94b9c875d9cb10daff453fbaee",
    ),
    "gemma-4-E2B-it-qat-q4_0-exact": (
        "xbill9/gemma-4-E2B-it-qat-q4_0-exact-gguf",
        "gemma-4-E2B-it-q4_0-exact.gguf",
        None,
        2_620_370_912,
        "419db9a6bf3bc15d770c85ccf9216827aa88c64fe8f3d72fbe5674f48efe2dc8",
    ),
    "gemma-4-E4B-it-qat-q4_0-exact": (
        "xbill9/gemma-4-E4B-it-qat-q4_0-exact-gguf",
        "gemma-4-E4B-it-q4_0-exact.gguf",
        None,
        4_215_695_712,
        "5462cc102b7d22c4748f9b8e82091f2ae064e10a45525151af6f9a7d0da7caf9",
    ),
}


@pytest.mark.parametrize("name", sorted(SEED_TARGET_FACTS))
def test_seed_targets_match_their_public_records(name):
    fields = ("repo", "filename", "revision", "size", "sha256")
    assert tuple(CATALOG[name][field] for field in fields) == SEED_TARGET_FACTS[name]
    assert CATALOG[name]["role"] == "target" and CATALOG[name]["architecture"] == "gemma4"
    if SEED_TARGET_FACTS[name][2]:
        assert deployable_entry(CATALOG, name, "target")["size"] == SEED_TARGET_FACTS[name][3]
    for drafter in SEED_DRAFTER_PINS:  # the drafters keep the article's sha256, revision and size unknown
        assert (CATALOG[drafter]["revision"], CATALOG[drafter]["size"]) == (None, None)


def test_seed_rigs_keep_the_exact_files():
    for rig in ("desktop3050", "laptop1650ti"):
        host = yaml.safe_load((REPO / f"inventory/host_vars/{rig}.yml").read_text())
        assert host["models_target"] == "gemma-4-E2B-it-qat-q4_0-exact"
        assert host["models_drafter"] == "gemma-4-E2B-it-qat-assistant-q4_0-exact"


def test_host_pin_refusal_lists_every_unpinned_entry_with_one_command():
    message = host_pin_refusal(
        "desktop3050", CATALOG, ["gemma-4-E2B-it-qat-q4_0-exact", "gemma-4-E2B-it-qat-assistant-q4_0-exact"]
    )
    assert message.count("make pin") == 1 and message.endswith("\n  make pin host=desktop3050")
    assert (
        "gemma-4-E2B-it-qat-q4_0-exact (target, xbill9/gemma-4-E2B-it-qat-q4_0-exact-gguf): revision missing" in message
    )
    assert "gemma-4-E2B-it-qat-assistant-q4_0-exact (drafter" in message and "revision, size missing" in message
    assert host_pin_refusal("x", CATALOG, ["gemma-3-270m-it-q4_k_m", "", None, "no-such-entry"]) == ""
    ultralight = host_pin_refusal("x", CATALOG, ["gemma-4-e4b-it-mtp-assistant-ultralight-f16"])
    assert "no repo" in ultralight and "set its repo" in ultralight


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


# ---------------------------------------------------------------------------------------------- where it lives
PINNED = {
    "name": "x",
    "repo": "owner/x-GGUF",
    "revision": "0" * 40,
    "filename": "MTP/x-Q8_0.gguf",
    "sha256": "ab" * 32,
    "size": 1,
}


def test_an_entry_lives_on_the_rig_under_its_sha256_by_its_file_name():
    assert rig_model_dir("/var/lib/rigkit/models", PINNED) == "/var/lib/rigkit/models/abababababababab"
    assert rig_model_path("/var/lib/rigkit/models", PINNED) == "/var/lib/rigkit/models/abababababababab/x-Q8_0.gguf"


def test_the_role_filters_build_the_rig_path_and_leave_an_unpinned_entry_without_one():
    filters = FilterModule().filters()
    assert filters["rig_model_path"](PINNED, "/m") == rig_model_path("/m", PINNED)
    assert filters["rig_model_dir"](PINNED, "/m") == rig_model_dir("/m", PINNED)
    assert filters["rig_model_path"]({}, "/m") == ""  # no drafter
    assert filters["rig_model_path"]({**PINNED, "sha256": None}, "/m") == ""  # make status on an unpinned entry


def test_the_controller_caches_an_entry_in_the_resolve_layout():
    filters = FilterModule().filters()
    expected = f"/c/models/owner/x-GGUF/resolve/{'0' * 40}/MTP/x-Q8_0.gguf"
    assert cached_model_path("/c", PINNED) == filters["controller_cached_model"](PINNED, "/c") == expected
    assert model_cache("/c") == filters["controller_model_cache"]("/c") == "/c/models"
    assert cached_model_path("/c", {**PINNED, "revision": None}) is None
    with pytest.raises(AnsibleFilterError, match="pin it first \\(make pin model=x\\)"):
        filters["controller_cached_model"]({**PINNED, "revision": None}, "/c")
