"""callback_plugins/rigkit_results.py: the JSON `rigkit drift` reads, from a real ansible-playbook run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support import REPO

PLAYBOOK = """
- name: Results of two hosts
  hosts: all
  gather_facts: false
  tasks:
    - name: Say something changed
      ansible.builtin.command: "true"
      changed_when: inventory_hostname == 'one'
    - name: Change nothing
      ansible.builtin.command: "true"
      changed_when: false
    - name: Fail on two only
      ansible.builtin.command: "false"
      when: inventory_hostname == 'two'
"""


def test_results_name_changed_and_failed_tasks_per_host(tmp_path: Path) -> None:
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    (tmp_path / "hosts.yml").write_text(
        "all:\n  hosts:\n    one: {ansible_connection: local}\n    two: {ansible_connection: local}\n"
        f"  vars: {{ansible_python_interpreter: {sys.executable}}}\n"
    )
    results = tmp_path / "results.json"
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_CALLBACKS_ENABLED": "rigkit_results",
        "RIGKIT_RESULTS_FILE": str(results),
    }
    ansible = Path(sys.executable).parent / "ansible-playbook"
    done = subprocess.run(
        [str(ansible), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr  # host two failed
    hosts = json.loads(results.read_text())["hosts"]
    assert hosts["one"]["changed"] == 1 and hosts["one"]["changed_tasks"] == ["Say something changed"]
    assert hosts["one"]["failures"] == 0 and hosts["one"]["failed_tasks"] == []
    assert hosts["two"]["changed"] == 0 and hosts["two"]["changed_tasks"] == []
    assert hosts["two"]["failures"] == 1 and hosts["two"]["failed_tasks"] == ["Fail on two only"]
    # Every task's outcome, in order; a failure with its message.
    assert [(t["task"], t["status"]) for t in hosts["one"]["tasks"]] == [
        ("Say something changed", "changed"),
        ("Change nothing", "ok"),
        ("Fail on two only", "skipped"),
    ]
    failed = hosts["two"]["tasks"][-1]
    assert (failed["task"], failed["status"]) == ("Fail on two only", "failed")
    assert "non-zero return code" in failed["msg"]


def test_without_the_variable_nothing_is_written(tmp_path: Path) -> None:
    (tmp_path / "play.yml").write_text(PLAYBOOK.replace("hosts: all", "hosts: localhost"))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_CALLBACKS_ENABLED": "rigkit_results"}
    env.pop("RIGKIT_RESULTS_FILE", None)
    ansible = Path(sys.executable).parent / "ansible-playbook"
    done = subprocess.run(
        [
            str(ansible),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            str(tmp_path / "play.yml"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["play.yml"]
