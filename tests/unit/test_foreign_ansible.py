"""An Ansible that is not the kit's own (callback_plugins/rigkit_preload.py) stops at once with one kit message,
instead of a warning per filter plugin and then "No filter named" at the first kit filter."""

from __future__ import annotations

import importlib.util
import subprocess

from tests.support import REPO, VENV_BIN

# The kit's pinned ansible-playbook, in a process where the kit's code is not importable: what a system or other
# virtualenv's Ansible sees (the virtualenv's .pth file puts a checkout on sys.path; this takes it off again).
FOREIGN = (
    "import os, sys\n"
    "sys.path = [p for p in sys.path if not os.path.exists(os.path.join(p or '.', 'rigkit', '__init__.py'))]\n"
    "sys.argv = ['ansible-playbook', *sys.argv[1:]]\n"
    "from ansible.cli.playbook import main\n"
    "main()\n"
)


def _preload():
    spec = importlib.util.spec_from_file_location("rigkit_preload", REPO / "callback_plugins" / "rigkit_preload.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_ansible_without_the_kits_code_stops_with_what_to_run():
    """Read-only status play: were the check missing, nothing on a rig would change."""
    done = subprocess.run(
        [str(VENV_BIN / "python"), "-c", FOREIGN, "playbooks/status.yml", "--limit", "sandbox"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output  # no plugin warnings, no play
    assert lines[0].startswith("[ERROR]: rigkit: this Ansible (") and "cannot import the kit's code" in lines[0]
    assert f"its own Ansible in {REPO}/.venv (`make setup` creates it)" in lines[0], lines[0]
    assert "No filter named" not in output and "Skipping plugin" not in output


def test_another_ansible_core_is_named_with_the_pin():
    preload = _preload()
    assert preload.foreign_ansible(str(REPO)) == ""  # this suite's own Ansible
    problem = preload.foreign_ansible(str(REPO), version="2.14.18")  # Debian 12's ansible-core
    pinned = next(
        line for line in (REPO / "requirements.txt").read_text().splitlines() if line.startswith("ansible-core")
    )
    assert problem.startswith(f"this Ansible runs ansible-core 2.14.18; the kit pins {pinned.split('==')[1]}"), problem
    assert "make setup" in problem  # the way out is named
