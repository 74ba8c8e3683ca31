"""rigkit's controller-side code: what runs on the machine that runs Ansible, never on a rig.

Layout (README, "How the code is laid out"):

- ``module_utils/`` holds what Ansible ships to rigs inside modules (fetching, preflight, probing, the lock), and
  the few pieces both sides use (the model catalog, GGUF headers, the HTTP client, atomic writes);
- ``rigkit/`` (this package) holds what only the controller runs: the ``rigkit`` command line (``rigkit.cli``),
  the model mirror, pinning, discovery, inventory validation, fleet status and the bench report.

This is the one place that wires imports: importing ``rigkit`` makes ``module_utils/`` importable as
``ansible.module_utils.<name>``, the name modules use on rigs, so controller code shares that code unchanged.
``rigkit`` itself is importable from the kit's virtualenv (``make setup`` puts the repository on its path).
"""

from __future__ import annotations

from pathlib import Path

import ansible.module_utils

REPO = Path(__file__).resolve().parents[1]
MODULE_UTILS = REPO / "module_utils"

if str(MODULE_UTILS) not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(MODULE_UTILS))
