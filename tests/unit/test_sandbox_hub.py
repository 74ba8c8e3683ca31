"""rigkit/sandbox/hub.py: the sandbox's stand-in hub matches the catalog's pins, idempotently."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from rigkit.sandbox.hub import CATALOG, HubError, build_hub

TINY = ["tiny-gemma4-target", "tiny-gemma4-assistant"]


def test_tiny_pair_matches_its_pins_and_second_build_changes_nothing(tmp_path: Path) -> None:
    catalog = yaml.safe_load(CATALOG.read_text())["model_catalog"]
    first = build_hub(tmp_path / "hub", only=TINY)
    assert first["changed"]
    for name in TINY:
        entry = catalog[name]
        path = tmp_path / "hub" / entry["repo"] / "resolve" / entry["revision"] / entry["filename"]
        assert first["files"][name]["path"] == str(path)
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]
        assert path.stat().st_size == entry["size"]
    assert build_hub(tmp_path / "hub", only=TINY)["changed"] is False


def test_a_generator_that_drifted_from_its_pin_fails_loudly(tmp_path: Path) -> None:
    data = yaml.safe_load(CATALOG.read_text())
    data["model_catalog"]["tiny-gemma4-target"]["sha256"] = "0" * 64
    drifted = tmp_path / "catalog.yml"
    drifted.write_text(yaml.safe_dump(data))
    with pytest.raises(HubError, match=r"the generator of tiny-gemma4-target made .* re-pin"):
        build_hub(tmp_path / "hub", drifted, only=["tiny-gemma4-target"])
    assert not list((tmp_path / "hub").rglob("*.gguf"))


def test_unknown_entries_are_refused(tmp_path: Path) -> None:
    with pytest.raises(HubError, match="no generator"):
        build_hub(tmp_path / "hub", only=["gemma-4-E2B-it-qat-q4_0-exact"])
