#!/usr/bin/python
"""Run a long command detached on the target and report its progress each time the task is polled."""

from __future__ import annotations

DOCUMENTATION = r"""
module: background_job
short_description: Start a long command detached, then report its progress on every poll until it ends
description:
  - Starts O(argv) in its own session with its output in O(log), and returns at once with C(finished=false)
    and a one-line C(progress) (elapsed time and what O(progress_patterns) match in the newest lines, at most 60
    characters).
  - "Called again with the same O(argv) and O(log), it attaches to that job instead of starting another, so a task
    with C(until: result.finished) and a C(delay) polls it, and the kit's stdout callback prints each C(progress)
    line: a build of many minutes shows what it is doing instead of staying silent."
  - When the job has ended, the call that sees it returns C(finished=true) and its exit status (failing with the
    log's last lines when it is not 0) and forgets the job, so the next task run starts the command afresh.
  - A job of an Ansible run that was interrupted keeps running; the next run attaches to it.
options:
  argv:
    description: The command and its arguments (no shell).
    type: list
    elements: str
    required: true
  log:
    description: File that receives the command's output; its directory is created. State files sit beside it.
    type: path
    required: true
  chdir:
    description: Working directory of the command.
    type: path
  environment:
    description: Variables added to the command's environment (never secrets; they are in the state file).
    type: dict
    default: {}
  progress_patterns:
    description: Regular expressions; what each matches in the newest line it matches is shown in C(progress).
    type: list
    elements: str
    default: []
  tail_lines:
    description: Lines of the log returned in C(log_tail) when the job failed.
    type: int
    default: 40
attributes:
  check_mode:
    support: full
    details: In check mode nothing is started; the task reports that it would run the command.
  diff_mode:
    support: none
author: rigkit
"""

EXAMPLES = r"""
- name: Build the image (prints progress every 30 s)
  background_job:
    argv: [docker, build, -t, "example:1", /tmp/context]
    log: /var/cache/rigkit/build.log
    progress_patterns: ['^Step [0-9]+/[0-9]+', '\[ *[0-9]+%\]']
  register: build
  until: build.finished
  retries: 240
  delay: 30
"""

RETURN = r"""
finished:
  description: Whether the job has ended.
  returned: always
  type: bool
  sample: false
rc:
  description: The job's exit status.
  returned: when finished
  type: int
  sample: 0
elapsed_s:
  description: Seconds since the job started.
  returned: always
  type: int
  sample: 312
progress:
  description: One line for a person, elapsed time and the newest matching log lines.
  returned: always
  type: str
  sample: "5m12s elapsed · Step 9/14 · [ 45%] Building CXX object src/CMakeFiles/llama.dir/llama.cpp.o"
log_tail:
  description: The log's last lines.
  returned: when the job failed
  type: list
  elements: str
"""

import hashlib
import json
import os
import re
import subprocess
import sys
import time

from ansible.module_utils.basic import AnsibleModule

# Runs the command with its output in the log, then records the exit status atomically (the module
# itself has long returned by then).
_RUNNER = r"""
import os, subprocess, sys
rc_path, log_path, chdir = sys.argv[1], sys.argv[2], sys.argv[3] or None
with open(log_path, "ab", buffering=0) as log:
    try:
        rc = subprocess.call(sys.argv[4:], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=chdir)
    except OSError as exc:
        log.write(("cannot run %s: %s\n" % (sys.argv[4], exc)).encode())
        rc = 127
with open(rc_path + ".tmp", "w") as out:
    out.write(str(rc))
os.replace(rc_path + ".tmp", rc_path)
"""

TAIL_BYTES = 256 * 1024


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tail(path: str, lines: int) -> list[str]:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - TAIL_BYTES))
            text = handle.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return []
    # Builders redraw lines with carriage returns: keep what was drawn last.
    return [line.rsplit("\r", 1)[-1].rstrip() for line in text.splitlines()][-lines:] if lines else []


def _elapsed(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


# What one progress line may add after the elapsed time: the callback's line fits 100 columns.
PROGRESS_WIDTH = 60


def progress_line(elapsed: float, log_lines: list[str], patterns: list[re.Pattern[str]]) -> str:
    """``6m09s elapsed · Step 24/43 : RUN · [42%]``: the text each pattern matched in the newest line it matches
    (not the whole line: cmake's are 300 characters with the percentage first); the newest line when none does."""
    parts = [f"{_elapsed(elapsed)} elapsed"]
    for pattern in patterns:
        found = next((hit for hit in map(pattern.search, reversed(log_lines)) if hit), None)
        if found:
            parts.append(" ".join(re.sub(r"\[\s+", "[", found.group(0)).split()))
    if len(parts) == 1 and log_lines:
        parts.append(next((line.strip() for line in reversed(log_lines) if line.strip()), ""))
    text = " · ".join(part for part in parts if part)
    return text if len(text) <= PROGRESS_WIDTH else text[: PROGRESS_WIDTH - 1] + "…"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "argv": {"type": "list", "elements": "str", "required": True},
            "log": {"type": "path", "required": True},
            "chdir": {"type": "path"},
            "environment": {"type": "dict", "default": {}},
            "progress_patterns": {"type": "list", "elements": "str", "default": []},
            "tail_lines": {"type": "int", "default": 40},
        },
        supports_check_mode=True,
    )
    params = module.params
    argv: list[str] = params["argv"]
    log_path: str = params["log"]
    if not argv:
        module.fail_json(msg="argv is empty: name the command to run")
    try:
        patterns = [re.compile(pattern) for pattern in params["progress_patterns"]]
    except re.error as exc:
        module.fail_json(msg=f"progress_patterns: {exc}")
    if module.check_mode:
        module.exit_json(changed=True, finished=True, rc=0, elapsed_s=0, progress="would run: " + " ".join(argv))

    state_path, rc_path = log_path + ".job.json", log_path + ".rc"
    job_key = hashlib.sha256(json.dumps([argv, params["chdir"], params["environment"]]).encode()).hexdigest()
    state = None
    try:
        with open(state_path) as handle:
            state = json.load(handle)
    except (FileNotFoundError, ValueError):
        state = None
    if state is not None and state.get("key") != job_key:
        if _alive(int(state.get("pid", 0))) and not os.path.exists(rc_path):
            module.fail_json(
                msg=f"{log_path} belongs to another job still running (pid {state.get('pid')}): wait for it or stop "
                "it, then re-run"
            )
        state = None

    if state is None:
        os.makedirs(os.path.dirname(log_path) or ".", mode=0o750, exist_ok=True)
        for stale in (rc_path, rc_path + ".tmp"):
            if os.path.exists(stale):
                os.unlink(stale)
        with open(log_path, "wb") as log:
            log.write(("$ " + " ".join(argv) + "\n").encode())
        env = dict(os.environ)
        env.update({str(key): str(value) for key, value in params["environment"].items()})
        proc = subprocess.Popen(
            [sys.executable, "-c", _RUNNER, rc_path, log_path, params["chdir"] or "", *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # outlives this module and the connection that started it
            close_fds=True,
        )
        state = {"key": job_key, "pid": proc.pid, "started": time.time()}
        with open(state_path + ".tmp", "w") as handle:
            json.dump(state, handle)
        os.replace(state_path + ".tmp", state_path)

    elapsed = time.time() - float(state["started"])
    lines = _tail(log_path, 400)
    line = progress_line(elapsed, lines, patterns)
    if not os.path.exists(rc_path):
        if not _alive(int(state["pid"])):
            # The runner died without recording a status (killed): forget it so a re-run starts over.
            os.unlink(state_path)
            module.fail_json(msg=f"the job ended without an exit status (killed?); its log: {log_path}", finished=True)
        module.exit_json(changed=True, finished=False, elapsed_s=int(elapsed), progress=line)

    with open(rc_path) as handle:
        rc = int(handle.read().strip() or 1)
    for done in (state_path, rc_path):
        os.unlink(done)
    result = {"changed": True, "finished": True, "rc": rc, "elapsed_s": int(elapsed), "progress": line}
    if rc != 0:
        module.fail_json(
            msg=f"{argv[0]} exited with {rc} after {_elapsed(elapsed)}; the last lines of {log_path} follow",
            log_tail=_tail(log_path, params["tail_lines"]),
            **result,
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
