"""The kit's screen output: Ansible's default, with progress lines for long jobs, without the plays no host ran,
and a closing summary of where each rig's server answers."""

from __future__ import annotations

DOCUMENTATION = """
    name: rigkit
    type: stdout
    short_description: Ansible's default screen output, with progress lines for long jobs and a closing summary
    description:
      - Everything the default callback prints, but the banner of a play that no host ran.
      - A task that polls a long job (module background_job, an C(until) loop with a C(delay)) prints its
        C(progress) on every poll, for example a line with the elapsed time and cmake's percentage, instead of
        "FAILED - RETRYING", so a newcomer sees a cold build working.
      - After the recap, for each rig whose server the run reported (the fact C(rigkit_answer), set by the
        llama_server role and the no-op fast path), where it answers, a curl that works and what to do next.
    extends_documentation_fragment:
      - default_callback
      - result_format_callback
    requirements:
      - set as stdout in configuration (ansible.cfg)
"""

import time  # noqa: E402 - Ansible reads DOCUMENTATION first
from typing import Any  # noqa: E402

from ansible import constants as C  # noqa: E402
from ansible.plugins.callback.default import CallbackModule as DefaultCallback  # noqa: E402

CHAT = '{"messages": [{"role": "user", "content": "Say hello in one sentence."}], "max_tokens": 48}'


def _elapsed(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{rest}s"


def summary(answers: dict[str, dict[str, Any]], seconds: float) -> list[str]:
    """The closing block: per rig, its report line, a curl that works (its key and certificate named where they
    live), the web UI it does not have and what to point instead; then what to do next."""
    lines = [f"rigkit: {len(answers)} server{'s' if len(answers) != 1 else ''} answering, run took {_elapsed(seconds)}"]
    for rig in sorted(answers):
        answer = answers[rig]
        url = str(answer.get("url", ""))
        lines.append(f"  {answer.get('line', '')}")
        options = ["-s"]
        if answer.get("tls_cert"):
            options.append(f"--cacert {rig}.pem")
        if answer.get("keyed"):
            options.append('-H "Authorization: Bearer $KEY"')
        lines.append(f"    curl {' '.join(options)} {url}/v1/chat/completions -H 'Content-Type: application/json' \\")
        lines.append(f"      -d '{CHAT}'")
        if answer.get("tls_cert"):
            lines.append(f"    ({rig}.pem: the rig's certificate, {answer['tls_cert']} on {rig})")
        if answer.get("keyed"):
            lines.append(f"    (KEY: llama_server_api_key of inventory/host_vars/{rig}.yml, from Vault)")
        lines.append(f"    web UI: none built in; point Open WebUI or any OpenAI client at {url}/v1")
    rigs = sorted(answers)
    one = rigs[0] if len(rigs) == 1 else "NAME"
    lines.append(f"Next: make status · make verify host={one} · make logs host={one}")
    return lines


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "rigkit"

    def __init__(self) -> None:
        super().__init__()
        self._pending_play: Any = None
        self._answers: dict[str, dict[str, Any]] = {}
        self._started = time.monotonic()

    # A play's banner waits for its first task: a play no host runs prints nothing.
    def v2_playbook_on_play_start(self, play: Any) -> None:
        self._play = play
        self._pending_play = play

    def _play_banner(self) -> None:
        if self._pending_play is not None:
            play, self._pending_play = self._pending_play, None
            super().v2_playbook_on_play_start(play)

    def v2_playbook_on_no_hosts_matched(self) -> None:
        self._pending_play = None

    def v2_playbook_on_task_start(self, task: Any, is_conditional: Any) -> None:
        self._play_banner()
        super().v2_playbook_on_task_start(task, is_conditional)

    def v2_playbook_on_handler_task_start(self, task: Any) -> None:
        self._play_banner()
        super().v2_playbook_on_handler_task_start(task)

    def v2_playbook_on_no_hosts_remaining(self) -> None:
        self._play_banner()
        super().v2_playbook_on_no_hosts_remaining()

    def v2_runner_on_ok(self, result: Any) -> None:
        answer = (result._result.get("ansible_facts") or {}).get("rigkit_answer")
        if isinstance(answer, dict):
            self._answers[result._host.get_name()] = answer
        super().v2_runner_on_ok(result)

    def v2_runner_retry(self, result: Any) -> None:
        progress = result.result.get("progress")
        if not progress:
            super().v2_runner_retry(result)
            return
        # the task's own name, without its role's: the line fits 100 columns
        task = str(result.task_name or result.task).rsplit(" : ", 1)[-1]
        line = f"  … [{self.host_label(result)}] {task}: {progress}"
        self._display.display(line if len(line) <= 100 else line[:99] + "…", color=C.COLOR_DEBUG)

    def v2_playbook_on_stats(self, stats: Any) -> None:
        super().v2_playbook_on_stats(stats)
        failed = [
            host
            for host in stats.processed
            if stats.summarize(host)["failures"] or stats.summarize(host)["unreachable"]
        ]
        answers = {rig: answer for rig, answer in self._answers.items() if rig not in failed}
        if answers:
            for line in summary(answers, time.monotonic() - self._started):
                self._display.display(line, color=C.COLOR_OK if line.startswith("rigkit:") else None)
