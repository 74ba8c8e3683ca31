"""Machine-readable results for the kit's own commands: per rig, the recap and the tasks that changed or failed."""

from __future__ import annotations

DOCUMENTATION = """
    name: rigkit_results
    type: aggregate
    short_description: Write each rig's recap and changed/failed tasks as JSON, for rigkit drift
    description:
      - Silent on screen. When the environment variable C(RIGKIT_RESULTS_FILE) names a file, the recap of every
        host (ok, changed, unreachable, failed, skipped), the names of the tasks that changed or failed on it, and
        every task's outcome in the order they ran (name, status ok/changed/skipped/failed, a failure's message) are
        written there as JSON at the end of the run. C(rigkit drift) (make check) and the tests read it instead of
        parsing the screen output.
      - Without C(RIGKIT_RESULTS_FILE) it does nothing.
    requirements:
      - enabled by rigkit drift through C(ANSIBLE_CALLBACKS_ENABLED)
"""

import json  # noqa: E402 - Ansible reads DOCUMENTATION first
import os  # noqa: E402
from typing import Any  # noqa: E402

from ansible.plugins.callback import CallbackBase  # noqa: E402


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "rigkit_results"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._tasks: dict[str, dict[str, list[str]]] = {}
        self._ran: dict[str, list[dict[str, str]]] = {}

    def _record(self, result: Any, kind: str) -> None:
        host = result._host.get_name()
        name = result._task.get_name()
        delegated = result._result.get("_ansible_delegated_vars", {}).get("ansible_host")
        label = f"{name} (on {delegated})" if delegated else name
        self._tasks.setdefault(host, {"changed": [], "failed": []})[kind].append(label)

    def _outcome(self, result: Any, status: str) -> None:
        outcome = {"task": result._task.get_name(), "status": status}
        if status == "failed":
            outcome["msg"] = str(result._result.get("msg", ""))
        self._ran.setdefault(result._host.get_name(), []).append(outcome)

    def v2_runner_on_ok(self, result: Any) -> None:
        if result._result.get("changed"):
            self._record(result, "changed")
        self._outcome(result, "changed" if result._result.get("changed") else "ok")

    def v2_runner_on_skipped(self, result: Any) -> None:
        self._outcome(result, "skipped")

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        if not ignore_errors:
            self._record(result, "failed")
        self._outcome(result, "ignored" if ignore_errors else "failed")

    def v2_playbook_on_stats(self, stats: Any) -> None:
        path = os.environ.get("RIGKIT_RESULTS_FILE")
        if not path:
            return
        hosts = {}
        for host in sorted(stats.processed):
            summary = stats.summarize(host)
            hosts[host] = {
                **{key: summary[key] for key in ("ok", "changed", "unreachable", "failures", "skipped")},
                "changed_tasks": self._tasks.get(host, {}).get("changed", []),
                "failed_tasks": self._tasks.get(host, {}).get("failed", []),
                "tasks": self._ran.get(host, []),
            }
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({"hosts": hosts}, handle, indent=1, sort_keys=True)
