"""Run a read-only command on a rig (stdlib only): the one place the kit's rig-side readers shell out.

``run(argv)`` never raises for a command that is missing, fails or hangs: it returns (exit code, stdout,
stderr) with 127 for a command not on PATH and 124 after ``timeout`` seconds, so each reader can say why a probe
could not answer instead of failing the module.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence


def run(argv: Sequence[str], timeout: float = 60.0, env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
    argv = list(argv)
    if shutil.which(argv[0]) is None:
        return 127, "", f"{argv[0]} not found"
    environment = {**os.environ, **env} if env else None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env=environment)
    except subprocess.TimeoutExpired:
        return 124, "", f"{' '.join(argv)} timed out after {timeout:.0f} s"
    return done.returncode, done.stdout, done.stderr
