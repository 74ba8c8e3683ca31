"""library/background_job.py: a long command runs detached and every poll prints where it is."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.support import REPO, run

PLAYBOOK = "tests/unit/playbooks/background_job.yml"
# A "build" that takes a few seconds and prints a step counter and a percentage, like docker build + cmake (whose
# lines run to 300 characters with the percentage first).
SLOW_BUILD = (
    "import time,sys\n"
    "for step in range(1, 4):\n"
    "    print(f'Step {step}/3 : RUN cmake --build build -j 2 --target llama-server' + ' x' * 40, flush=True)\n"
    "    print(f'[ {step * 33}%] Building CXX object obj{step}.o' + '/ggml/src/ggml-cpu' * 15, flush=True)\n"
    "    time.sleep(1.2)\n"
    "sys.exit(int(sys.argv[1]))\n"
)


def play(tmp_path: Path, exit_code: int) -> tuple[subprocess.CompletedProcess[str], Path]:
    log = tmp_path / "fresh" / "dir" / "build.log"  # the module creates its directory
    extra = {"job_argv": [sys.executable, "-c", SLOW_BUILD, str(exit_code)], "job_log": str(log)}
    result = run(["ansible-playbook", PLAYBOOK, "-e", json.dumps(extra)])
    return result, log


def test_polls_print_progress_and_the_job_finishes(tmp_path):
    result, log = play(tmp_path, 0)
    assert result.returncode == 0, result.tail()
    polls = [line for line in result.output.splitlines() if line.lstrip().startswith("… [localhost]")]
    assert len(polls) >= 2, result.output
    # each poll line: the task, the elapsed time, the newest step and percentage seen in the log, in 100 columns
    assert all("Run the job (progress on every poll):" in line and " elapsed" in line for line in polls)
    assert any(re.search(r" elapsed · Step [1-3]/3 · \[(33|66|99)%\]$", line) for line in polls), polls
    assert max(len(line) for line in polls) <= 100, polls
    assert "FAILED - RETRYING" not in result.output
    assert "rc=0" in result.output
    assert "Step 3/3" in log.read_text()
    # the job is forgotten once reported: the next run starts afresh
    assert not Path(f"{log}.job.json").exists() and not Path(f"{log}.rc").exists()


def test_a_failing_job_fails_the_task_with_its_last_lines(tmp_path):
    result, _ = play(tmp_path, 3)
    assert result.returncode != 0
    assert "exited with 3" in result.output
    assert "[ 99%] Building CXX object obj3.o" in result.output  # log_tail


def test_a_second_call_attaches_to_the_running_job(tmp_path):
    """An interrupted run leaves the job running; the next run's call attaches instead of starting another."""
    log = tmp_path / "build.log"
    marker, release = tmp_path / "starts", tmp_path / "release"
    # runs until the test releases it, however slow the machine is
    script = (
        f"import os, time; open({str(marker)!r}, 'a').write('x')\n"
        f"while not os.path.exists({str(release)!r}): time.sleep(0.1)"
    )
    args = {"argv": [sys.executable, "-c", script], "log": str(log)}
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}
    command = [str(REPO / ".venv" / "bin" / "ansible"), "localhost", "-m", "background_job", "-a", json.dumps(args)]

    def call() -> str:
        return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False).stdout

    try:
        outputs = [call(), call()]
    finally:
        release.touch()  # never leave the job behind, whatever happened
    assert all('"finished": false' in out for out in outputs), outputs
    deadline = time.monotonic() + 60
    while '"finished": true' not in (final := call()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert '"finished": true' in final and '"rc": 0' in final, final
    assert marker.read_text() == "x"  # started once
