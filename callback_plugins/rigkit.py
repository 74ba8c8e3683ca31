"""The kit's screen output: Ansible's default, plus a progress line for every poll of a long job."""

from __future__ import annotations

DOCUMENTATION = """
    name: rigkit
    type: stdout
    short_description: Ansible's default screen output, with progress lines for long jobs
    description:
      - Everything the default callback prints, unchanged.
      - A task that polls a long job (module background_job, an C(until) loop with a C(delay)) prints its
        C(progress) on every poll, for example a line with the elapsed time and cmake's percentage, instead of
        "FAILED - RETRYING", so a newcomer sees a cold build working.
    extends_documentation_fragment:
      - default_callback
      - result_format_callback
    requirements:
      - set as stdout in configuration (ansible.cfg)
"""

from typing import Any  # noqa: E402 - Ansible reads DOCUMENTATION first

from ansible import constants as C  # noqa: E402
from ansible.plugins.callback.default import CallbackModule as DefaultCallback  # noqa: E402


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "rigkit"

    def v2_runner_retry(self, result: Any) -> None:
        progress = result.result.get("progress")
        if not progress:
            super().v2_runner_retry(result)
            return
        self._display.display(
            f"  … [{self.host_label(result)}] {result.task_name or result.task}: {progress}", color=C.COLOR_DEBUG
        )
