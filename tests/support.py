"""Helpers the tests share: run the kit's commands for real and read Ansible's recap."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"
ARTIFACTS = REPO / ".artifacts"

RECAP_RE = re.compile(
    r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)\s+"
    r"failed=(?P<failed>\d+)",
    re.MULTILINE,
)


def kit_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    env["ANSIBLE_FORCE_COLOR"] = "0"
    env["PY_COLORS"] = "0"
    env["ANSIBLE_NOCOLOR"] = "1"
    env.update(extra)
    return env


@dataclass
class Run:
    argv: list[str]
    returncode: int
    output: str

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


def run(argv: list[str], *, log_name: str | None = None, timeout: int = 1800, cwd: Path = REPO, **env: str) -> Run:
    """Run a command from the repository root; keep its whole output under .artifacts/ for post-mortems."""
    proc = subprocess.run(
        argv,
        cwd=cwd,
        env=kit_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    if log_name:
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / f"{log_name}.log").write_text(proc.stdout)
    return Run(argv=argv, returncode=proc.returncode, output=proc.stdout)


def recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP counters per host (the last recap when a run printed several)."""
    counters: dict[str, dict[str, int]] = {}
    for match in RECAP_RE.finditer(output):
        counters[match["host"]] = {key: int(match[key]) for key in ("ok", "changed", "unreachable", "failed")}
    return counters


def unavailable(reason: str) -> None:
    """Skip with the reason on a developer machine; in CI (CI=true) a missing prerequisite is a failure."""
    import pytest

    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI must provide this: {reason}")
    pytest.skip(reason)
