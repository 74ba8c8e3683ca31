"""`make rebuild` reads the entry a rig must reproduce through the lock's one reader (module_utils/rig_lock.py's
read_lock, filter rig_lock_entry): a corrupt or foreign lock fails naming the file, and only a rig without an
entry is told to provision first (roles/rig_lock/tasks/expected.yml, run on this machine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ansible.errors import AnsibleFilterError

from filter_plugins.rig_inputs import _lock_path
from filter_plugins.rig_lock import FilterModule
from rigkit.paths import lock_file
from tests.support import REPO, local_play

ENTRY = {"unit_sha256": "ab" * 32, "models": {}}
PLAYBOOK = """---
- name: Read the lock entry a rebuild must reproduce
  hosts: all
  gather_facts: false
  tasks:
    - name: Read it
      ansible.builtin.include_role:
        name: rig_lock
        tasks_from: expected.yml
    - name: Show it
      ansible.builtin.debug:
        msg: "{{ __rig_lock_expected | to_json }}"
"""


@pytest.fixture
def locks(tmp_path: Path) -> dict[str, Path]:
    found = {name: tmp_path / f"{name}.lock.json" for name in ("corrupt", "foreign", "good", "absent")}
    found["corrupt"].write_text('{"rigs": {"known": ')
    found["foreign"].write_text("[1, 2]")
    found["good"].write_text(json.dumps({"rigs": {"known": ENTRY, "by_env": ENTRY}}))
    return found


def test_the_filter_fails_on_a_corrupt_lock_with_read_locks_message(locks: dict[str, Path]) -> None:
    entry = FilterModule().filters()["rig_lock_entry"]
    with pytest.raises(AnsibleFilterError, match=f"{locks['corrupt']}: cannot read the lock file: .*restore it"):
        entry(str(locks["corrupt"]), "known")
    with pytest.raises(AnsibleFilterError, match=f"{locks['foreign']}: not a rigkit lock file"):
        entry(str(locks["foreign"]), "known")


def test_the_filter_gives_the_entry_or_none(locks: dict[str, Path]) -> None:
    entry = FilterModule().filters()["rig_lock_entry"]
    assert entry(str(locks["good"]), "known") == ENTRY
    assert entry(str(locks["good"]), "unknown") is None
    assert entry(str(locks["absent"]), "known") is None  # no lock yet: no entry, not an error


def test_the_role_and_the_fast_path_share_one_default_lock_file(monkeypatch: pytest.MonkeyPatch) -> None:
    default = FilterModule().filters()["rig_lock_default_file"]
    monkeypatch.delenv("RIGKIT_LOCK_FILE", raising=False)
    assert default(str(REPO)) == lock_file() == str(REPO / "inventory" / "rigs.lock.json") == _lock_path({})
    monkeypatch.setenv("RIGKIT_LOCK_FILE", "/elsewhere/rigs.lock.json")
    assert default(str(REPO)) == lock_file() == "/elsewhere/rigs.lock.json" == _lock_path({})
    assert _lock_path({"rig_lock_file": "/set/in/inventory.json"}) == "/set/in/inventory.json"


def play(tmp_path: Path, hosts: dict[str, dict[str, Any]], lock_by_env: Path) -> dict[str, Any]:
    """Run expected.yml on local 'hosts'; returns the ansible.posix.json output."""
    return local_play(tmp_path, PLAYBOOK, hosts, RIGKIT_LOCK_FILE=str(lock_by_env))


def outcomes(output: dict[str, Any]) -> dict[str, str]:
    """Each host's failure message, or the entry it read (as JSON)."""
    found: dict[str, str] = {}
    for task in output["plays"][0]["tasks"]:
        for host, result in task["hosts"].items():
            if result.get("failed"):
                found[host] = result.get("msg", "")
            elif task["task"]["name"] == "Show it":
                found[host] = result["msg"]
    return found


def test_rebuild_refuses_a_corrupt_lock_by_name_and_a_missing_entry_by_provision(
    tmp_path: Path, locks: dict[str, Path]
) -> None:
    hosts = {
        "corrupt": {"rig_lock_file": str(locks["corrupt"])},
        "foreign": {"rig_lock_file": str(locks["foreign"])},
        "unknown": {"rig_lock_file": str(locks["good"])},
        "no_lock": {"rig_lock_file": str(locks["absent"])},
        "known": {"rig_lock_file": str(locks["good"])},
        "by_env": {},  # the role's default: $RIGKIT_LOCK_FILE
    }
    found = outcomes(play(tmp_path, hosts, locks["good"]))
    assert f"{locks['corrupt']}: cannot read the lock file" in found["corrupt"], found["corrupt"]
    assert f"{locks['foreign']}: not a rigkit lock file" in found["foreign"], found["foreign"]
    for host in ("corrupt", "foreign"):
        assert "provision it first" not in found[host]
    for host, lock in (("unknown", locks["good"]), ("no_lock", locks["absent"])):
        assert f"{host} has no entry in {lock}: provision it first (make provision host={host})" in found[host]
    assert json.loads(found["known"]) == ENTRY
    assert json.loads(found["by_env"]) == ENTRY
