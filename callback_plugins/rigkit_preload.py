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
"""

from pathlib import Path  # noqa: E402 - Ansible reads DOCUMENTATION first
from typing import Any  # noqa: E402

from ansible.plugins.callback import CallbackBase  # noqa: E402
from ansible.plugins.loader import filter_loader, test_loader  # noqa: E402

# The checkout this plugin belongs to: the one whose roles and playbooks run.
KIT = str(Path(__file__).resolve().parent.parent)


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "rigkit_preload"
    CALLBACK_NEEDS_ENABLED = False

    def v2_playbook_on_start(self, playbook: Any) -> None:
        # The first look-up of any legacy Jinja plugin loads all of them (ansible's own and filter_plugins/): the
        # workers forked after this find them loaded.
        filter_loader.get("ansible.builtin.default")
        test_loader.get("ansible.builtin.match")
        # The kit's code does not change during a run: its digest (roles/rig_state's inputs, filter rig_inputs_digest,
        # which names the same checkout) is computed once here.
        from rigkit.rig_inputs import code_digest

        code_digest(KIT)
