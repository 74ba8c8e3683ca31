#!/usr/bin/python
"""Ansible module: make sure a Docker engine answers on the machine running the kit."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: local_docker_engine
short_description: Ensure a Docker engine answers on this machine, starting one when none runs
description:
  - Uses the engine that already answers, untouched.
  - Otherwise, where systemd is the init system and a docker unit exists, starts that unit.
  - Otherwise (a CI machine or container without systemd as PID 1) merges O(daemon_settings) into
    daemon.json and starts C(dockerd) detached, then waits until it answers.
options:
  daemon_settings:
    description: Keys merged into daemon.json before a self-started engine starts (never applied to a running engine).
    type: dict
    default: {}
  daemon_json:
    description: Path of daemon.json.
    type: path
    default: /etc/docker/daemon.json
  log_path:
    description: Where a self-started dockerd writes its log.
    type: path
    default: /var/log/dockerd.log
  timeout:
    description: Seconds to wait for the engine to answer.
    type: int
    default: 60
supports_check_mode: true
author: rigkit
"""

EXAMPLES = r"""
- name: Ensure a Docker engine answers
  local_docker_engine:
    daemon_settings: {bridge: none, iptables: false}
"""

RETURN = r"""
server_version:
  description: Version reported by the engine.
  type: str
  returned: success
started_by:
  description: C(none) when the engine already answered, C(systemd) or C(dockerd) when this module started it.
  type: str
  returned: always
"""

import os
import shutil
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.docker_daemon_config import DaemonConfigError, merge_into_file


def engine_answer() -> tuple[str | None, str]:
    """(the server version when an engine answers, else None; what the client said otherwise)."""
    docker = shutil.which("docker")
    if docker is None:
        return None, ""
    try:
        proc = subprocess.run(
            [docker, "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, "docker version did not answer within 20 s"
    version = proc.stdout.strip()
    return (version, "") if proc.returncode == 0 and version else (None, proc.stderr.strip())


def engine_version() -> str | None:
    """Return the server version when an engine answers, else None."""
    return engine_answer()[0]


def refusal(said: str, is_root: bool) -> str | None:
    """Why this user cannot have an engine here, with what to do: one runs but refuses this user, or starting
    one needs root. None when starting one is this module's job."""
    if "permission denied" in said.lower():
        return (
            "a Docker engine runs here but refuses this user (permission denied on its socket): run the kit as "
            "root (sudo make ...) or add the user to the docker group (sudo usermod -aG docker $USER, then log in "
            "again)"
        )
    if not is_root:
        return "no Docker engine answers and starting one needs root: run the kit as root (sudo make ...)"
    return None


def systemd_is_init() -> bool:
    try:
        with open("/proc/1/comm", encoding="utf-8") as handle:
            return handle.read().strip() == "systemd"
    except OSError:
        return False


def wait_for_engine(timeout: int) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        version = engine_version()
        if version:
            return version
        time.sleep(1)
    return None


def tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return "".join(handle.readlines()[-lines:])
    except OSError:
        return ""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "daemon_settings": {"type": "dict", "default": {}},
            "daemon_json": {"type": "path", "default": "/etc/docker/daemon.json"},
            "log_path": {"type": "path", "default": "/var/log/dockerd.log"},
            "timeout": {"type": "int", "default": 60},
        },
        supports_check_mode=True,
    )
    version, said = engine_answer()
    if version:
        module.exit_json(changed=False, server_version=version, started_by="none")
    if shutil.which("docker") is None:
        module.fail_json(msg="the docker client is not installed; install docker.io (Debian) first", started_by="none")
    why = refusal(said, os.geteuid() == 0)
    if why:
        module.fail_json(msg=why, started_by="none")
    if module.check_mode:
        module.exit_json(changed=True, started_by="check_mode")

    if systemd_is_init() and os.path.exists("/lib/systemd/system/docker.service"):
        subprocess.run(["systemctl", "start", "docker"], check=False, capture_output=True)
        started_by = "systemd"
    else:
        dockerd = shutil.which("dockerd")
        if dockerd is None:
            module.fail_json(msg="dockerd is not installed; install docker.io (Debian) first", started_by="none")
        try:
            merge_into_file(module.params["daemon_json"], module.params["daemon_settings"])
        except (DaemonConfigError, OSError) as exc:
            module.fail_json(msg=str(exc), started_by="none")
        with open(module.params["log_path"], "ab") as log:
            # A new session detaches dockerd from this module's process so it outlives the play.
            subprocess.Popen(
                [dockerd],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                close_fds=True,
            )
        started_by = "dockerd"

    version = wait_for_engine(module.params["timeout"])
    if not version:
        module.fail_json(
            msg=f"Docker engine did not answer within {module.params['timeout']} s after starting it ({started_by}); "
            f"see {module.params['log_path']}",
            log_tail=tail(module.params["log_path"]),
            started_by=started_by,
        )
    module.exit_json(changed=True, server_version=version, started_by=started_by)


if __name__ == "__main__":
    main()
