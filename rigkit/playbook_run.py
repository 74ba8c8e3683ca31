"""Running the kit's playbooks from the command line: the argv, and Ansible's per-rig results read as JSON."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from rigkit import REPO


def playbook_argv(playbook: str, limit: str, *extra: str) -> list[str]:
    """ansible-playbook of this virtualenv running one of the kit's playbooks on ``limit``."""
    return [
        str(pathlib.Path(sys.executable).parent / "ansible-playbook"),
        str(REPO / "playbooks" / playbook),
        "--limit",
        limit,
        *extra,
    ]


@dataclass
class PlaybookRun:
    """One ansible-playbook run: its exit code and, per host, the recap and task outcomes (rigkit_results)."""

    returncode: int
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)


def run_with_results(argv: Sequence[str], stdout: IO[str] | None = None) -> PlaybookRun:
    """Run ``argv`` (an ansible-playbook command) with the rigkit_results callback on, output to ``stdout``
    (the terminal when None); return its exit code and the per-host results it wrote."""
    with tempfile.TemporaryDirectory(prefix="rigkit-results-") as scratch:
        results_file = pathlib.Path(scratch) / "results.json"
        enabled = [name for name in os.environ.get("ANSIBLE_CALLBACKS_ENABLED", "").split(",") if name]
        env = {
            **os.environ,
            "ANSIBLE_CALLBACKS_ENABLED": ",".join([*enabled, "rigkit_results"]),
            "RIGKIT_RESULTS_FILE": str(results_file),
        }
        kwargs: dict[str, Any] = {"stdout": stdout, "stderr": subprocess.STDOUT} if stdout is not None else {}
        done = subprocess.run(list(argv), cwd=REPO, env=env, check=False, **kwargs)
        hosts = json.loads(results_file.read_text())["hosts"] if results_file.exists() else {}
    return PlaybookRun(done.returncode, hosts)
