"""Load the kit's Jinja plugins once, in the controller process, before any task runs."""

from __future__ import annotations

DOCUMENTATION = """
    name: rigkit_preload
    type: aggregate
    short_description: Load the kit's filter plugins and what they import once, before Ansible forks its workers
    description:
      - >-
        Ansible runs each task for each host in a freshly forked worker process. A worker that templates one of
        the kit's filters (filter_plugins/) first loads every filter plugin and the controller code they import
        (rigkit/, module_utils/), and throws that away when the task ends. On the kit's 2-core bench machine that
        costs about 40 ms of CPU per task and host, most of the cost of the validation play's small tasks, paid
        again for every rig of a fleet.
      - >-
        At the start of a playbook this loads them once in the controller process, so that every worker inherits
        them (a fork shares the loaded modules), and warms the kit's caches that hold for a whole run (the digest
        of the kit's code). Nothing is printed and no behaviour changes; only the time per task and host drops.
      - Always on (it needs no enabling); it does nothing for ad-hoc commands.
      - >-
        First it checks that this Ansible is the kit's own (its virtualenv, where the kit's code is importable, at
        the pinned ansible-core): another one would warn about every filter plugin and then stop at the first
        kit filter with "No filter named". It stops the run at once, saying how to run the kit instead.
"""

import re  # noqa: E402 - Ansible reads DOCUMENTATION first
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from ansible.plugins.callback import CallbackBase  # noqa: E402
from ansible.plugins.loader import filter_loader, test_loader  # noqa: E402
from ansible.release import __version__ as ansible_core_version  # noqa: E402

# The checkout this plugin belongs to: the one whose roles and playbooks run.
KIT = str(Path(__file__).resolve().parent.parent)


def foreign_ansible(kit: str = KIT, version: str = ansible_core_version) -> str:
    """Why this Ansible is not the kit's own ("" when it is): the kit's code cannot be imported, or its
    ansible-core is not the one requirements.txt pins."""
    venv = f"{kit}/.venv"
    how = (
        f"run the kit through make (make provision host=NAME, make check ...), which uses its own Ansible in {venv} "
        f"(`make setup` creates it), or call {venv}/bin/ansible-playbook"
    )
    try:
        import rigkit  # noqa: F401
    except ImportError:
        return f"this Ansible ({sys.executable}) cannot import the kit's code: it is not the kit's own; {how}"
    try:
        pinned = re.search(r"^ansible-core==(\S+)", Path(kit, "requirements.txt").read_text(), re.MULTILINE)
    except OSError:
        pinned = None
    if pinned and pinned.group(1) != version:
        return f"this Ansible runs ansible-core {version}; the kit pins {pinned.group(1)} (requirements.txt): {how}"
    return ""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "rigkit_preload"
    CALLBACK_NEEDS_ENABLED = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        problem = foreign_ansible()
        if problem:
            # before any plugin warning: the one line a person needs, then stop (a warning would let the run go on)
            self._display.error(f"rigkit: {problem}", wrap_text=False)
            sys.exit(2)

    def v2_playbook_on_start(self, playbook: Any) -> None:
        # The first look-up of any legacy Jinja plugin loads all of them (ansible's own and filter_plugins/): the
        # workers forked after this find them loaded.
        filter_loader.get("ansible.builtin.default")
        test_loader.get("ansible.builtin.match")
        # The kit's code does not change during a run: its digest (roles/rig_state's inputs, filter rig_inputs_digest,
        # which names the same checkout) is computed once here.
        from rigkit.rig_inputs import code_digest

        code_digest(KIT)
