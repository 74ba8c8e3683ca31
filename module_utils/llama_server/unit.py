"""The server's systemd unit as the probes see it (standard library only; runs on rigs).

Shared by ``library/llama_server_probe.py`` (wait for the server, then a canary) and ``library/rig_converged.py``
(the no-op fast path checks that a rig that matches its last converge still serves, in the same module run):
the unit's state and log, waiting for ``/health`` while the unit stays up, and the record of the canary the
unit's current run passed (kept on the rig with the unit's invocation ID, so a restart always means a canary).
"""

from __future__ import annotations

import json
import os
from typing import Any

from ansible.module_utils.llama_server.api import Endpoint, wait_ready
from ansible.module_utils.rig_command import run

RECORDED = ("draft_n", "draft_n_accepted", "acceptance", "predicted_per_second", "speculative", "build_info")


def unit_state(unit: str) -> dict[str, str]:
    _code, out, _err = run(["systemctl", "show", unit, "--property=ActiveState,SubState,MainPID,InvocationID"])
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def unit_log(unit: str, invocation: str, lines: int = 60) -> list[str]:
    argv = ["journalctl", "--unit", unit, "--output", "cat", "--no-pager", "--lines", str(lines)]
    if invocation:
        argv.append(f"_SYSTEMD_INVOCATION_ID={invocation}")
    _code, out, _err = run(argv)
    return [line for line in out.splitlines() if line.strip()]


class Serving:
    """Waits for ``/health`` while the unit stays up; ``first`` is the unit's state when the wait began."""

    def __init__(self, endpoint: Endpoint, unit: str | None) -> None:
        self.endpoint = endpoint
        self.unit = unit
        self.first = unit_state(unit) if unit else {}

    @property
    def invocation(self) -> str:
        return self.first.get("InvocationID", "")

    def _still_alive(self) -> str | None:
        if not self.unit:
            return None
        now = unit_state(self.unit)
        if now.get("ActiveState") in ("failed", "inactive") or now.get("SubState") == "auto-restart":
            return f"{self.unit} is {now.get('ActiveState')}/{now.get('SubState')}"
        if self.first.get("MainPID") not in (None, "0") and now.get("MainPID") != self.first.get("MainPID"):
            return f"{self.unit} restarted (main PID {self.first.get('MainPID')} -> {now.get('MainPID')})"
        return None

    def wait(self, timeout: float) -> float:
        """Seconds until ``/health`` answered 200; ServerApiError when it did not (the unit died, or the timeout)."""
        return wait_ready(self.endpoint, timeout, self._still_alive)

    def log(self) -> list[str]:
        return unit_log(self.unit, self.invocation) if self.unit else []

    def failure(self, message: str) -> tuple[str, list[str]]:
        """The message with the unit's log lines of this run appended, and those lines."""
        log = self.log()
        return message + ("\nserver log:\n" + "\n".join(log[-40:]) if log else ""), log


def read_record(path: str, invocation: str) -> dict[str, Any] | None:
    """The figures of the canary that passed during the unit's current run, or None (then a canary runs)."""
    if not invocation:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            kept = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("invocation") != invocation:
        return None
    if not all(key in kept for key in RECORDED):
        return None
    return {key: kept[key] for key in RECORDED}


def write_record(path: str, invocation: str, result: dict[str, Any]) -> None:
    payload = json.dumps({"invocation": invocation, **{key: result.get(key) for key in RECORDED}})
    temporary = f"{path}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(payload + "\n")
    os.chmod(temporary, 0o600)
    os.replace(temporary, path)
