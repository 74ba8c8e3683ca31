"""The entry points the controller checks come from the playbooks: a role that provision.yml starts to run is
checked (its argument spec) and digested by the fast path at once, with no list to update by hand."""

from __future__ import annotations

import shutil
from pathlib import Path

from rigkit.validation.entry_points import derive, entry_points
from rigkit.validation.variables import SHAPING_ROLES
from tests import support


def test_the_kits_own_entry_points() -> None:
    points = entry_points()
    assert ("nvidia_driver", "main") in points["gpu"] and ("nvidia_driver", "main") not in points["sandbox"]
    assert ("container_harness", "rig") in points["sandbox"] and ("container_harness", "rig") not in points["gpu"]
    for both in [("llama_server", "main"), ("models_fleet", "main"), ("rig_state", "check"), ("llama_bench", "main")]:
        assert both in points["gpu"] and both in points["sandbox"], both
    # included by an entry point, with a spec of its own: models' validate (through rig_context and models_fleet)
    assert ("models", "validate") in points["gpu"]
    assert "llama_bench" not in SHAPING_ROLES and "models_fleet" in SHAPING_ROLES


def test_a_role_added_to_provision_is_checked_at_once(tmp_path: Path) -> None:
    root = tmp_path / "kit"
    shutil.copytree(support.REPO / "playbooks", root / "playbooks")
    shutil.copytree(support.REPO / "roles", root / "roles", ignore=shutil.ignore_patterns("molecule", "files"))
    role = root / "roles" / "rig_fan"
    (role / "tasks").mkdir(parents=True)
    (role / "meta").mkdir()
    (role / "tasks" / "main.yml").write_text("---\n- name: Nothing\n  ansible.builtin.meta: noop\n")
    (role / "meta" / "argument_specs.yml").write_text(
        "---\nargument_specs:\n  main:\n    options:\n      rig_fan_curve: {type: str}\n"
    )
    provision = root / "playbooks" / "provision.yml"
    text = provision.read_text()
    marker = "    - role: docker\n"
    assert marker in text
    provision.write_text(text.replace(marker, "    - role: rig_fan\n      when: rig_kind == 'gpu'\n" + marker, 1))
    points, bench_only = derive(root)
    assert ("rig_fan", "main") in points["gpu"] and ("rig_fan", "main") not in points["sandbox"]
    assert "rig_fan" not in bench_only
