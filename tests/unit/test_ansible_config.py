"""The connection settings Ansible actually uses (ansible-config reads ansible.cfg as the kit's commands do)."""

from __future__ import annotations

import json

from tests.support import run


def test_ssh_rigs_reuse_one_connection_and_pipeline() -> None:
    dumped = run(["ansible-config", "dump", "--format", "json", "--type", "connection", "--only-changed"])
    assert dumped.returncode == 0, dumped.tail()
    plugins = {
        name: entries
        for group in json.loads(dumped.output[dumped.output.index("[") :])
        for name, entries in group.items()
    }
    ssh = {entry["name"]: entry["value"] for entry in plugins["ssh"]}
    ssh_args = ssh.get("ssh_args", "")
    assert "ControlMaster=auto" in ssh_args and "ControlPersist=" in ssh_args, ssh
    assert ssh.get("pipelining") is True, ssh
