"""Helpers the tests share: run the kit's commands for real and read Ansible's recap."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from rigkit.paths import cache_dir

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"
ARTIFACTS = REPO / ".artifacts"

# The controller's cache, as the kit resolves it.
CACHE_DIR = cache_dir()


def role_defaults(role: str) -> dict:
    """A role's defaults, the source of truth tests compare against instead of re-typing pins."""
    return yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text())


def group_vars(name: str) -> dict:
    return yaml.safe_load((REPO / "inventory" / "group_vars" / f"{name}.yml").read_text())


_IMAGE = role_defaults("llamacpp_image")
LLAMACPP_COMMIT: str = _IMAGE["llamacpp_image_commit"]
LLAMACPP_BUILD_NUMBER = str(_IMAGE["llamacpp_image_build_number"])
# llama-server's /props build_info and the image tag's prefix: b<build>-<short commit>
LLAMACPP_BUILD_INFO = f"b{LLAMACPP_BUILD_NUMBER}-{LLAMACPP_COMMIT[:7]}"

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
    # provisions made by tests record their lock entries here, not in the repo's inventory/rigs.lock.json
    env.setdefault("RIGKIT_LOCK_FILE", str(ARTIFACTS / "rigs.lock.json"))
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


IMAGE_LOCK = Path(os.environ.get("IMAGE_LOCK", "/run/lock/rigkit-llamacpp-image.lock"))


def wait_for_image_build(timeout: float = 3600.0) -> float:
    """Wait while `make image` (CI starts it in the background) holds the image lock; returns seconds waited.
    Tests that provision rigs call this first, so they reuse that build instead of starting a second one."""
    import fcntl
    import time

    if not IMAGE_LOCK.exists():
        return 0.0
    started = time.monotonic()
    with IMAGE_LOCK.open("rb") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() - started > timeout:
                    raise TimeoutError(
                        f"the image build holding {IMAGE_LOCK} did not finish in {timeout:.0f} s"
                    ) from None
                time.sleep(5)
                continue
            fcntl.flock(handle, fcntl.LOCK_UN)
            return time.monotonic() - started


def render_server_files(work: Path, hosts: dict[str, dict], extra: dict | None = None) -> tuple[Path, dict]:
    """Run tests/unit/playbooks/render_server_files.yml for local hosts; (output dir, the JSON callback's result).

    The inventory is written as JSON (JSON is YAML: newlines in values survive exactly)."""
    import json
    import sys

    import pytest

    out = work / "out"
    out.mkdir()
    inventory = {
        "all": {
            "hosts": {
                name: {**values, "ansible_connection": "local", "ansible_python_interpreter": sys.executable}
                for name, values in hosts.items()
            }
        }
    }
    (work / "hosts.json").write_text(json.dumps(inventory))
    env = json_callback_env()
    playbook = REPO / "tests" / "unit" / "playbooks" / "render_server_files.yml"
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(work / "hosts.json")]
    cmd += ["-e", json.dumps({"out_dir": str(out), **(extra or {})}), str(playbook)]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    try:
        return out, json.loads(done.stdout)
    except ValueError:
        pytest.fail(f"unexpected ansible output (rc {done.returncode}):\n{done.stdout}\n{done.stderr}")


def exec_start_argv(unit: str) -> list[str]:
    """A systemd unit's ExecStart as argv: continuation lines joined, systemd's quoting undone."""
    joined = unit.replace("\\\n", " ")
    line = next(line for line in joined.splitlines() if line.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def json_callback_env() -> dict[str, str]:
    """The environment of an ansible run whose stdout is the JSON callback's document."""
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_NOCOLOR": "1",
    }


def run_module(
    module: str, args: dict, *extra: str, system_python: bool = False, timeout: int = 180
) -> tuple[dict, str]:
    """`ansible localhost -c local -m MODULE -a ARGS` (the way a rig runs it); (the host's result, all it printed).

    ``system_python``: run the module with /usr/bin/python3 where there is one, as a rig does (stdlib only)."""
    import json
    import sys

    import pytest

    python = "/usr/bin/python3" if system_python and Path("/usr/bin/python3").exists() else sys.executable
    cmd = [str(Path(sys.executable).parent / "ansible"), "localhost", "-i", "localhost,", "-c", "local"]
    cmd += ["-e", f"ansible_python_interpreter={python}", "-m", module, "-a", json.dumps(args), *extra]
    done = subprocess.run(cmd, cwd=REPO, env=json_callback_env(), capture_output=True, text=True, timeout=timeout)
    printed = done.stdout + done.stderr
    try:
        return json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"], printed
    except (ValueError, KeyError, IndexError):
        pytest.fail(f"unexpected ansible output (rc {done.returncode}):\n{printed}")
