"""The llama-server unit's systemd sandbox confines the docker CLI without breaking it: the
role's rendered unit runs under a real systemd (a rig-image container with no network of its own) and its
``docker run`` - with RestrictAddressFamilies=AF_UNIX, an empty CapabilityBoundingSet, SystemCallFilter and
the rest - reaches the engine through the socket and starts a container that carries the memory, pids and log
limits. Only the payload is swapped (a shell instead of llama-server, no host network): the CLI, its options and
the sandbox are the role's.

Needs the Docker engine and the rig image (``make harness``); creates only containers named
``$RIGKIT_TEST_CONTAINER_PREFIX-*`` (default ``rigkit-hardening``), removed afterwards."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO, unavailable

PREFIX = os.environ.get("RIGKIT_TEST_CONTAINER_PREFIX", "rigkit-hardening")
RIG_IMAGE = "rigkit/rig:bookworm"
RIG = f"{PREFIX}-unit"
PAYLOAD = f"{PREFIX}-llama-main"


def docker(*args: str, check: bool = True, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=check)


def in_rig(script: str, timeout: int = 120) -> str:
    done = docker("exec", RIG, "sh", "-c", script, check=False, timeout=timeout)
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def rig() -> Iterator[str]:
    if shutil.which("docker") is None or not Path("/usr/bin/docker").exists():
        unavailable("the docker CLI (/usr/bin/docker) is not installed")
    if docker("image", "inspect", RIG_IMAGE, check=False).returncode != 0:
        unavailable(f"{RIG_IMAGE} is not built (make harness)")
    docker("rm", "--force", RIG, PAYLOAD, check=False)
    docker(
        "run", "--detach", "--name", RIG,
        "--network", "none",  # systemd's own namespace: nothing here touches the machine's network
        "--cgroupns", "host", "--volume", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
        "--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp",
        "--cap-add", "SYS_ADMIN",  # systemd sets up the unit's mount namespace (ProtectSystem, PrivateDevices...)
        "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
        "--volume", "/var/run/docker.sock:/var/run/docker.sock",
        "--volume", "/usr/bin/docker:/usr/bin/docker:ro",
        RIG_IMAGE, "/lib/systemd/systemd",
    )  # fmt: skip
    try:
        for _ in range(60):
            if in_rig("systemctl is-system-running").strip() in ("running", "degraded"):
                break
            time.sleep(1)
        else:
            pytest.fail(f"systemd in {RIG} did not boot: {in_rig('systemctl --failed')}")
        yield RIG
    finally:
        docker("rm", "--force", RIG, PAYLOAD, check=False)


def render_unit(out: Path, models_dir: Path) -> str:
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "llama_server_gpu_access": "none",
        "llama_server_models_dir": str(models_dir),
        "llama_server_container_memory_mib": 1536,
        "llama_server_container_pids_limit": 256,
    }
    (out / "hosts.json").write_text(json.dumps({"all": {"hosts": {"rig": host}}}))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    env["ANSIBLE_STDOUT_CALLBACK"] = "ansible.builtin.default"
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(out / "hosts.json")]
    cmd += ["-e", f"out_dir={out}", str(REPO / "tests/unit/playbooks/render_server_files.yml")]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return (out / "rig.service").read_text()


def with_payload(unit: str) -> str:
    """The role's unit with llama-server swapped for a shell that reports its limits, then sleeps."""
    for old in ("--name rigkit-llama-main", "rm --force rigkit-llama-main", " rigkit-llama-main\n"):
        assert old in unit, old
        unit = unit.replace(old, old.replace("rigkit-llama-main", PAYLOAD))
    unit = unit.replace("--network host", "--network none")
    unit = unit.replace("Requires=docker.service\n", "").replace("After=docker.service ", "After=")
    start, end = unit.index('    "rigkit/llama-server:example"'), unit.index("ExecStop=")
    report = (
        "echo memory=$$(cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes)"
        " pids=$$(cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max);"
        " sleep 60"
    )
    return unit[:start] + f'    "{RIG_IMAGE}" sh -c "{report}"\n' + unit[end:]


def test_the_hardened_unit_still_runs_docker_with_the_limits(rig: str, tmp_path: Path) -> None:
    unit = render_unit(tmp_path, tmp_path)
    for setting in ("RestrictAddressFamilies=AF_UNIX", "CapabilityBoundingSet=", "SystemCallFilter=@system-service"):
        assert setting in unit.splitlines()
    (tmp_path / "unit.service").write_text(with_payload(unit))
    docker("exec", rig, "mkdir", "-p", "/etc/rigkit")
    docker("cp", str(tmp_path / "unit.service"), f"{rig}:/etc/systemd/system/rigkit-llama-main.service")
    in_rig("printf 'LLAMA_ARG_PORT=18437\\n' > /etc/rigkit/llama-main.env && chmod 600 /etc/rigkit/llama-main.env")

    verify = in_rig("systemd-analyze verify /etc/systemd/system/rigkit-llama-main.service; echo rc=$?")
    assert verify.strip().endswith("rc=0"), verify
    assert in_rig("systemctl daemon-reload && systemctl start rigkit-llama-main.service; echo rc=$?").endswith("rc=0\n")
    journal = ""
    for _ in range(60):
        journal = in_rig("journalctl -u rigkit-llama-main.service --no-pager -o cat")
        if "memory=" in journal:
            break
        time.sleep(1)
    assert f"memory={1536 * 1024 * 1024} pids=256" in journal, journal
    assert "permission denied" not in journal  # DOCKER_CONFIG: the CLI does not try the hidden /root/.docker
    inspect = docker("inspect", PAYLOAD, "--format", "{{json .HostConfig}}").stdout
    config = json.loads(inspect)
    assert config["Memory"] == 1536 * 1024 * 1024 and config["PidsLimit"] == 256
    assert config["LogConfig"] == {"Type": "json-file", "Config": {"max-file": "3", "max-size": "10m"}}

    # ExecStop's `docker stop` runs under the same sandbox: it reaches the engine and the container goes (--rm).
    # (The shell payload ignores SIGTERM as PID 1 and is killed after the stop timeout; llama-server exits.)
    in_rig("systemctl stop rigkit-llama-main.service", timeout=90)
    journal = in_rig("journalctl -u rigkit-llama-main.service --no-pager -o cat")
    assert f"\n{PAYLOAD}\n" in journal and "Stopped rigkit-llama-main.service" in journal, journal
    assert in_rig("systemctl is-active rigkit-llama-main.service").strip() in ("inactive", "failed")
    assert docker("ps", "--all", "--quiet", "--filter", f"name=^{PAYLOAD}$").stdout.strip() == ""  # --rm
