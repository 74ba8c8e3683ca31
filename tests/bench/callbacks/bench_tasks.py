"""Benchmark callback: one JSON line per task result (host, task, status, seconds, where it ran)."""

from __future__ import annotations

DOCUMENTATION = """
    name: bench_tasks
    type: aggregate
    short_description: write every task result with its duration to a JSON-lines file
    description:
      - For tests/bench/bench_converge.py. Enabled with ANSIBLE_CALLBACKS_ENABLED=bench_tasks; writes to the
        file named by RIGKIT_BENCH_TASKS (nothing when unset).
      - A result counts as executed on the rig when it was not delegated (to the controller) and not skipped.
    requirements:
      - RIGKIT_BENCH_TASKS set to a writable path
"""

import json  # noqa: E402 - Ansible reads DOCUMENTATION first
import os  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from ansible.plugins.callback import CallbackBase  # noqa: E402


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "bench_tasks"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._path = os.environ.get("RIGKIT_BENCH_TASKS", "")
        self._started: dict[tuple[str, str], float] = {}

    def _write(self, result: Any, status: str) -> None:
        if not self._path:
            return
        host = result._host.get_name()
        key = (host, result._task._uuid)
        started = self._started.pop(key, None)
        # Callbacks get a result whose delegation record keeps only the delegate's connection (ansible_host, ...).
        via = result._result.get("_ansible_delegated_vars") or {}
        delegated = via.get("ansible_delegated_host") or via.get("ansible_host")
        line = {
            "host": host,
            "task": result._task.get_name(),
            "action": result._task.action,
            "status": status,
            "changed": bool(result._result.get("changed")),
            "delegated_to": delegated,
            "seconds": round(time.monotonic() - started, 3) if started is not None else None,
        }
        with open(self._path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")

    def v2_runner_on_start(self, host: Any, task: Any) -> None:
        self._started[(host.get_name(), task._uuid)] = time.monotonic()

    def v2_runner_on_ok(self, result: Any) -> None:
        self._write(result, "ok")

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        self._write(result, "failed")

    def v2_runner_on_skipped(self, result: Any) -> None:
        self._write(result, "skipped")

    def v2_runner_on_unreachable(self, result: Any) -> None:
        self._write(result, "unreachable")
