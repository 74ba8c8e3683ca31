"""Role models on this machine (local connection, a temporary models_dir): refusals, deploy, re-run, check, prune.

The rig-container proof is the role's Molecule scenario and tests/integration/test_models_fleet.py; these runs
take seconds and pin down the messages and the rules.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.module_utils.model_catalog import rig_model_dir, rig_model_path

from rigkit.mirror.models import ModelMirror
from rigkit.sandbox.hub import build_hub
from tests.support import local_play

REPO = Path(__file__).resolve().parents[2]
CATALOG_FILE = REPO / "inventory" / "group_vars" / "all" / "model_catalog.yml"
CATALOG = yaml.safe_load(CATALOG_FILE.read_text())["model_catalog"]
PAIR = ("tiny-gemma4-target", "tiny-gemma4-assistant")

PLAYBOOK = f"""---
- name: Role models on this machine
  hosts: all
  gather_facts: false
  vars_files: [{CATALOG_FILE}]
  tasks:
    - name: Deploy
      ansible.builtin.include_role:
        name: models
    - name: Show the facts
      ansible.builtin.debug:
        msg: "{{{{ {{'target': models_target_path, 'drafter': models_drafter_path,
                   'target_entry': models_target_entry}} | to_json }}}}"
"""


def play(tmp_path: Path, hosts: dict[str, dict[str, Any]], *extra: str) -> dict[str, Any]:
    """Run the role on local 'hosts' (one per case); returns the ansible.posix.json output."""
    return local_play(tmp_path, PLAYBOOK, hosts, *extra)


def failures(output: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = {}
    for task in output["plays"][0]["tasks"]:
        for host, result in task["hosts"].items():
            if result.get("failed"):
                items = [item.get("msg", "") for item in result.get("results", []) if item.get("failed")]
                found[host] = " ".join(items) or result.get("msg", "")
    return found


def facts(output: dict[str, Any], host: str) -> dict[str, Any]:
    shown = [t["hosts"][host] for t in output["plays"][0]["tasks"] if t["task"]["name"] == "Show the facts"]
    return json.loads(shown[0]["msg"]) if isinstance(shown[0]["msg"], str) else shown[0]["msg"]


def model_file(models_dir: Path, name: str) -> Path:
    return Path(rig_model_path(str(models_dir), CATALOG[name]))


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local "Hugging Face" serving the tiny pair in the resolve/ layout."""
    hub = tmp_path_factory.mktemp("hub")
    build_hub(hub, CATALOG_FILE, list(PAIR))
    with ModelMirror(hub) as mirror:
        yield mirror.url


def test_refusals_name_the_variable_and_touch_nothing(tmp_path: Path) -> None:
    cases = {
        "unset": ({"models_target": ""}, "unset: models_target is not set"),
        "unknown": (
            {"models_target": "nope"},
            "unknown: models_target=nope cannot be deployed: model 'nope' is not in",
        ),
        "unpinned": (
            {"models_target": "gemma-4-E2B-it-qat-q4_0-exact"},
            "unpinned needs 1 model(s) that are not pinned yet",
        ),
        "swapped": (
            {"models_target": "tiny-gemma4-assistant"},
            "is a drafter in the catalog, but is used here as the target",
        ),
        "bad_drafter": (
            {"models_target": "tiny-gemma4-target", "models_drafter": "no-such-drafter"},
            "bad_drafter: models_drafter=no-such-drafter cannot be deployed: model 'no-such-drafter' is not in",
        ),
        "unpinned_pair": (
            {"models_target": "unsloth-gemma-4-E4B-it-Q4_K_M", "models_drafter": "unsloth-gemma-4-E4B-it-Q8_0-MTP"},
            "unsloth-gemma-4-E4B-it-Q8_0-MTP (drafter, unsloth/gemma-4-E4B-it-GGUF): revision, sha256, size missing"
            "\nPin them all on a machine that reaches Hugging Face (HF_TOKEN for gated repositories), then re-run:"
            "\n  make pin host=unpinned_pair",
        ),
        "bad_keep": (
            {"models_target": "tiny-gemma4-target", "models_prune": True, "models_keep": ["old-one"]},
            "bad_keep: models_keep names old-one",
        ),
    }
    hosts = {name: {**spec, "models_dir": str(tmp_path / name)} for name, (spec, _) in cases.items()}
    failed = failures(play(tmp_path, hosts))
    for name, (_, message) in cases.items():
        assert message in failed.get(name, ""), (name, failed.get(name))
        if name.startswith("unpinned"):
            assert failed[name].count("make pin") == 1
        elif name not in ("unset", "bad_keep"):
            assert "inventory/host_vars/" in failed[name]
        assert not (tmp_path / name).exists(), f"{name}: the role touched models_dir before refusing"


def test_deploy_rerun_check_and_prune(tmp_path: Path, stand_in: str) -> None:
    models = tmp_path / "models"
    host = {
        "models_target": PAIR[0],
        "models_drafter": PAIR[1],
        "models_dir": str(models),
        "models_base_url": stand_in,
        "models_allow_insecure_http": True,
    }
    planned = play(tmp_path, {"rig": host}, "--check")
    assert planned["stats"]["rig"]["failures"] == 0 and planned["stats"]["rig"]["changed"] > 0
    assert not models.exists()  # check mode wrote nothing

    first = play(tmp_path, {"rig": host})
    assert first["stats"]["rig"]["failures"] == 0, failures(first)
    for name in PAIR:
        path = model_file(models, name)
        assert hashlib.sha256(path.read_bytes()).hexdigest() == CATALOG[name]["sha256"]
        assert oct(path.stat().st_mode & 0o777) == "0o644" and path.stat().st_uid == 0
        assert oct(path.parent.stat().st_mode & 0o777) == "0o755"
    shown = facts(first, "rig")
    assert shown["target"] == str(model_file(models, PAIR[0]))
    assert shown["drafter"] == str(model_file(models, PAIR[1]))
    assert shown["target_entry"]["architecture"] == "gemma4"

    second = play(tmp_path, {"rig": host})
    assert second["stats"]["rig"]["changed"] == 0

    # Prune: the drafter is no longer wanted, an old model is kept by name, a stray file goes.
    kept = Path(rig_model_dir(str(models), CATALOG["gemma-3-270m-it-q4_k_m"]))
    kept.mkdir()
    (kept / "gemma-3-270m-it-Q4_K_M.gguf").write_text("kept")
    (models / "stray.txt").write_text("nobody's")
    pruning = {**host, "models_drafter": "", "models_prune": True, "models_keep": ["gemma-3-270m-it-q4_k_m"]}
    play(tmp_path, {"rig": pruning}, "--check")
    assert model_file(models, PAIR[1]).exists() and (models / "stray.txt").exists()  # check mode removed nothing
    pruned = play(tmp_path, {"rig": pruning})
    assert pruned["stats"]["rig"]["failures"] == 0
    assert sorted(p.name for p in models.iterdir()) == sorted([model_file(models, PAIR[0]).parent.name, kept.name])
    assert facts(pruned, "rig")["drafter"] == ""
