"""Helpers the tests share: run the kit's commands for real and read Ansible's recap."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from ansible.module_utils.fetch.model import FetchOptions, FetchResult, record_path

from rigkit.paths import CATALOG, cache_dir
from rigkit.sandbox.tiny_gemma4 import write_arch_gguf
from rigkit.validation.rules import role_defaults

if TYPE_CHECKING:
    from tests.fixtures.hf_standin import Fault, HfStandin

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"
ARTIFACTS = REPO / ".artifacts"
# A bench report as `make bench` writes it (a GPU run's, kept as input data for the readers, not as a result).
BENCH_FIXTURES = REPO / "tests" / "fixtures" / "bench"

# The controller's cache, as the kit resolves it.
CACHE_DIR = cache_dir()

# Below the kernel's ephemeral range (32768-60999 by default): a port picked there can be taken, between the pick and
# the bind, as the local end of any outgoing connection on the machine, which the suite makes many of.
_LISTENER_PORTS = (20000, 32000)


def model_catalog() -> dict:
    """The kit's model catalog (inventory/group_vars/all/model_catalog.yml), a fresh copy each call."""
    return yaml.safe_load(CATALOG.read_text())["model_catalog"]


def own_cache(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A controller cache of a test's own (its own mirror pidfile, run directory and lock: the kit's sandboxes may
    converge meanwhile) that shares the machine cache's assembled fixtures, so the ~250 MB Gemma 3 270M the stand-in
    hub lays out is not fetched from PyPI again."""
    cache = tmp_path_factory.mktemp(name)
    shared = CACHE_DIR / "fixtures"
    if shared.is_dir():
        (cache / "fixtures").symlink_to(shared)
    return cache


def remove_rig(container: str) -> None:
    """Remove a sandbox rig's container and the Docker data volume its engine keeps (<container>-docker)."""
    subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)
    subprocess.run(["docker", "volume", "rm", "-f", f"{container}-docker"], capture_output=True, check=False)


def free_port(*addresses: str) -> int:
    """A port no socket holds on any of ``addresses`` (default 127.0.0.1), outside the ephemeral range."""
    import random
    import socket

    for _ in range(200):
        port = random.randint(*_LISTENER_PORTS)  # noqa: S311 - a port number, not a secret
        try:
            for address in addresses or ("127.0.0.1",):
                with socket.socket() as sock:
                    sock.bind((address, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no free port in {_LISTENER_PORTS} on {addresses}")


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
    # the validation play reads Debian's archive for a GPU rig's pins: never the real one from a test (a closed
    # loopback port: "cannot check", which refuses nothing); tests of that rule name a stand-in archive
    env.setdefault("RIGKIT_DEBIAN_MIRROR", "http://127.0.0.1:9/debian")
    env.setdefault("RIGKIT_DEBIAN_SECURITY_MIRROR", "http://127.0.0.1:9/debian-security")
    env.update(extra)
    return env


@dataclass
class Run:
    argv: list[str]
    returncode: int
    output: str
    # callback_plugins/rigkit_results.py's JSON of the (last) ansible-playbook run, when run(results=True)
    results: dict | None = None

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.output.splitlines()[-lines:])

    def tasks(self, host: str, task: str) -> list[dict[str, str]]:
        """The outcomes (status ok/changed/skipped/failed, msg) of every run of a task on a host, from the results
        JSON. ``task``: the task's name, with or without the "role : " prefix Ansible gives a role's tasks."""
        if self.results is None:
            raise AssertionError(f"no results JSON from {self.argv}: call run(..., results=True)")
        ran = self.results["hosts"].get(host, {}).get("tasks", [])
        return [outcome for outcome in ran if task in (outcome["task"], outcome["task"].split(" : ", 1)[-1])]

    def statuses(self, host: str, task: str) -> list[str]:
        return [outcome["status"] for outcome in self.tasks(host, task)]


def run(
    argv: list[str],
    *,
    log_name: str | None = None,
    timeout: int = 1800,
    cwd: Path = REPO,
    results: bool = False,
    **env: str,
) -> Run:
    """Run a command from the repository root; keep its whole output under .artifacts/ for post-mortems.

    ``results``: enable the rigkit_results callback for the ansible-playbook run(s) of the command and return its
    JSON as ``Run.results`` (tests match outcomes there, not task names in the screen output)."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rigkit-results-") as scratch:
        results_file = Path(scratch) / "results.json"
        if results:
            enabled = [name for name in os.environ.get("ANSIBLE_CALLBACKS_ENABLED", "").split(",") if name]
            env = {
                "ANSIBLE_CALLBACKS_ENABLED": ",".join([*enabled, "rigkit_results"]),
                "RIGKIT_RESULTS_FILE": str(results_file),
                **env,
            }
        proc = subprocess.run(
            argv,
            cwd=cwd,
            env=kit_env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
        parsed = json.loads(results_file.read_text()) if results and results_file.exists() else None
    if log_name:
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / f"{log_name}.log").write_text(proc.stdout)
    return Run(argv=argv, returncode=proc.returncode, output=proc.stdout, results=parsed)


def image_inputs(*hosts: str, extra: dict | None = None) -> dict[str, dict]:
    """What the llamacpp_image role would build for each host (tag, build args, source, build host), from a
    playbook that touches no host (tests/integration/playbooks/image_inputs.yml)."""
    import json

    argv = ["ansible-playbook", "tests/integration/playbooks/image_inputs.yml", "--limit", ",".join(hosts)]
    argv += ["-e", json.dumps(extra or {})]
    result = run(argv, ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
    assert result.returncode == 0, result.tail()
    plays = json.loads(result.output[result.output.index("{") :])["plays"]
    shown = plays[0]["tasks"][-1]["hosts"]
    return {host: shown[host]["msg"] for host in hosts}


def recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP counters per host (the last recap when a run printed several)."""
    counters: dict[str, dict[str, int]] = {}
    for match in RECAP_RE.finditer(output):
        counters[match["host"]] = {key: int(match[key]) for key in ("ok", "changed", "unreachable", "failed")}
    return counters


NOT_APPLICABLE = "not applicable: "


def not_applicable(reason: str) -> None:
    """Skip a check the inventory says does not apply to this host (GPU checks on a sandbox rig, drafter checks on
    a rig served without one). The only kind of skip CI accepts: tests/conftest.py fails a CI run on any other,
    and the rig suite's callers count these against what the rig's inventory implies."""
    import pytest

    pytest.skip(NOT_APPLICABLE + reason)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> None:
    """Skip with the reason on a developer machine; in CI (CI=true) a missing prerequisite is a failure."""
    import pytest

    if in_ci():
        pytest.fail(f"CI must provide this: {reason}")
    pytest.skip(reason)


def render_server_files(work: Path, hosts: dict[str, dict], extra: dict | None = None) -> tuple[Path, dict]:
    """Run tests/unit/playbooks/render_server_files.yml for local hosts; (output dir, the JSON callback's result).

    The inventory is written as JSON (JSON is YAML: newlines in values survive exactly)."""
    import json
    import sys

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
    playbook = REPO / "tests" / "unit" / "playbooks" / "render_server_files.yml"
    return out, json_play(work / "hosts.json", playbook, "-e", json.dumps({"out_dir": str(out), **(extra or {})}))


def local_play(work: Path, playbook_text: str, hosts: dict, *extra: str, **env: str) -> dict:
    """Run ``playbook_text`` on local ``hosts`` ({name: host vars}, one per case) from files written under
    ``work``; returns the ansible.posix.json document."""
    import sys

    playbook, inventory = work / "play.yml", work / "hosts.yml"
    playbook.write_text(playbook_text)
    common = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts, "vars": common}}))
    return json_play(inventory, playbook, *extra, **env)


def json_play(inventory: Path, playbook: Path, *extra: str, **env: str) -> dict:
    """``ansible-playbook -i INVENTORY PLAYBOOK EXTRA...`` with the JSON callback; its document (fails the test
    with the output when the run printed no JSON)."""
    import json
    import sys

    import pytest

    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), *extra, str(playbook)]
    done = subprocess.run(
        cmd, cwd=REPO, env={**json_callback_env(), **env}, capture_output=True, text=True, timeout=300, check=False
    )
    try:
        return json.loads(done.stdout)
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


def plain(value: object) -> object:
    """Inventory JSON (`ansible-inventory --list`, testinfra's ansible:// backend) as plain data: a value the
    inventory tags ``!unsafe`` comes out of it as ``{"__ansible_unsafe": VALUE}``."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def templated_var(inventory: Path, host: str, variable: str, timeout: int = 180) -> tuple[object, str]:
    """``variable`` of ``host`` as Ansible templates it from that inventory (`ansible HOST -m debug -a
    var=VARIABLE`, run on the controller: what `make check` would make of it); (its value, all it printed)."""
    import json
    import sys

    import pytest

    cmd = [str(Path(sys.executable).parent / "ansible"), host, "-i", str(inventory), "-c", "local"]
    cmd += ["-m", "ansible.builtin.debug", "-a", f"var={variable}"]
    done = subprocess.run(cmd, cwd=REPO, env=json_callback_env(), capture_output=True, text=True, timeout=timeout)
    printed = done.stdout + done.stderr
    try:
        return json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"][host][variable], printed
    except (ValueError, KeyError, IndexError):
        pytest.fail(f"unexpected ansible output (rc {done.returncode}):\n{printed}")


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


@dataclass
class SuiteOutcome:
    """What one pytest run of tests/rig reported, per test, from its JUnit XML (results, not screen output)."""

    run: Run
    passed: list[str]
    skipped: dict[str, str]  # test -> reason
    failed: dict[str, str]  # test -> message


def rig_suite(host: str, *, log_name: str, inventory: str | None = "inventory/hosts.yml", **env: str) -> SuiteOutcome:
    """Run the rig suite (tests/rig) against one rig and check every skip against what its inventory implies: a rig
    without a GPU skips exactly the GPU checks (tests/rig/test_nvidia.py), each as not applicable, and nothing else.
    Tests are named module::function (the parametrized host id dropped). ``inventory=None``: the one in
    ANSIBLE_INVENTORY (``env``)."""
    import ast
    import tempfile
    import xml.etree.ElementTree as ET

    with tempfile.TemporaryDirectory(prefix="rig-suite-") as scratch:
        junit = Path(scratch) / "junit.xml"
        argv = ["pytest", "tests/rig", f"--hosts=ansible://{host}"]
        argv += [f"--ansible-inventory={inventory}"] if inventory else []  # else ANSIBLE_INVENTORY in env
        result = run([*argv, "-p", "no:cacheprovider", f"--junitxml={junit}"], log_name=log_name, **env)
        # the report of the pytest run just above, not outside data
        cases = list(ET.parse(junit).getroot().iter("testcase")) if junit.exists() else []  # noqa: S314
        outcome = SuiteOutcome(result, [], {}, {})
        for case in cases:
            name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name', '').split('[', 1)[0]}"
            skipped = case.find("skipped")
            failed = case.find("failure") if case.find("failure") is not None else case.find("error")
            if failed is not None:
                outcome.failed[name] = failed.get("message", "")
            elif skipped is not None:
                outcome.skipped[name] = skipped.get("message", "")
            else:
                outcome.passed.append(name)
    # what only a GPU rig runs: the NVIDIA stack, and roles/rig_power (GPU rigs stay up)
    gpu_checks = {
        f"{module}::{node.name}"
        for module in ("test_nvidia", "test_power")
        for node in ast.parse((REPO / f"tests/rig/{module}.py").read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }
    assert result.returncode == 0 and not outcome.failed, result.tail(80)
    assert outcome.passed, f"the rig suite ran no test on {host}:\n{result.tail(40)}"
    assert set(outcome.skipped) == gpu_checks, f"skips on {host} other than the GPU checks: {outcome.skipped}"
    for name, reason in outcome.skipped.items():
        why = "no GPU by inventory" if name.startswith("test_nvidia::") else "is not a GPU rig"
        assert reason.startswith(NOT_APPLICABLE) and why in reason, (name, reason)
    return outcome


# --- Model downloads against the stand-in hub (tests/fixtures/hf_standin.py; fixtures in tests/unit/conftest.py) ---
REV = "0123456789abcdef0123456789abcdef01234567"
HF_REPO = "rigkit-test/tiny-gemma4-GGUF"
MiB = 1024 * 1024


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Served:
    path: Path
    filename: str
    sha256: str
    size: int
    architecture: str
    repo: str = HF_REPO
    revision: str = REV

    def entry(self, **override: Any) -> dict[str, Any]:
        data = {
            "repo": self.repo,
            "revision": self.revision,
            "filename": self.filename,
            "sha256": self.sha256,
            "size": self.size,
            "architecture": self.architecture,
            "role": "target",
        }
        return {**data, **override}

    def publish(self, hub: HfStandin, **kw: Any) -> Served:
        hub.add_file(self.repo, self.revision, self.filename, self.path, sha256=self.sha256, **kw)
        return self

    def served_by(self, hub: HfStandin) -> int:
        return hub.bytes_served(self.repo, self.revision, self.filename)

    def fault(self, hub: HfStandin, *faults: Fault) -> None:
        for fault in faults:
            hub.add_fault(self.repo, self.revision, self.filename, fault)


def describe(path: Path, filename: str, architecture: str) -> Served:
    return Served(path, filename, sha256(path), path.stat().st_size, architecture)


def options(hub: HfStandin, **override: Any) -> FetchOptions:
    base: dict[str, Any] = {
        "base_url": hub.base_url,
        "allow_insecure_http": True,
        "connect_timeout": 2.0,
        "read_timeout": 2.0,
        "retries": 2,
        "backoff_initial": 0.01,
        "backoff_max": 0.05,
    }
    return FetchOptions(**{**base, **override})


def seed_previous(dest: Path, seed: int = 99) -> str:
    """Put an older, valid model at the final path; returns its sha256."""
    write_arch_gguf(dest, "gemma4", seed=seed, name="previous")
    return sha256(dest)


def part_of(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


def assert_untouched(dest: Path, previous_sha: str | None, *, part_kept: bool = False) -> None:
    if previous_sha is None:
        assert not dest.exists(), f"{dest} appeared after a failure"
    else:
        assert sha256(dest) == previous_sha, f"{dest} changed after a failure"
    assert part_of(dest).exists() == part_kept


def assert_installed(dest: Path, served: Served, result: FetchResult) -> None:
    assert sha256(dest) == served.sha256
    assert result.path == str(dest) and result.sha256 == served.sha256
    assert not part_of(dest).exists()
    record = json.loads(Path(record_path(str(dest))).read_text())
    st = dest.stat()
    assert record["sha256"] == served.sha256
    assert (record["size"], record["mtime_ns"], record["inode"], record["device"]) == (
        st.st_size,
        st.st_mtime_ns,
        st.st_ino,
        st.st_dev,
    )


def tls_options(hub: HfStandin, ca: Path, **override: Any) -> FetchOptions:
    return options(hub, allow_insecure_http=False, ca_file=str(ca), **override)


def run_gguf_fetch(args: dict[str, Any], *extra: str) -> tuple[dict[str, Any], str]:
    """`ansible localhost -m gguf_fetch` ad hoc with the system Python; (host result, everything printed)."""
    return run_module("gguf_fetch", args, *extra, system_python=True)


# --- Seed rigs and proof receipts ----------------------------------------------------------------------------
def seed_values(host: str) -> dict:
    """A seed GPU rig's variables as the compatibility rules see them: the compat roles' defaults, gpu_rigs'
    group_vars, then its host_vars."""
    from rigkit.validation.compat import ROLES

    values = {**role_defaults(*ROLES), "rig_kind": "gpu"}
    values.update(yaml.safe_load((REPO / "inventory/group_vars/gpu_rigs.yml").read_text()))
    values.update(yaml.safe_load((REPO / f"inventory/host_vars/{host}.yml").read_text()))
    return values


def copy_proof_inputs(item: Any, root: Path) -> None:
    """A copy of a proof's inputs (and every module the kit ships) under ``root``, with an empty receipts folder."""
    import shutil

    from rigkit import proofs

    for relative in proofs.input_files(item):
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / relative, root / relative)
    for relative in ("library", "filter_plugins", "module_utils"):
        for path in (REPO / relative).rglob("*.py"):
            (root / path.relative_to(REPO)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, root / path.relative_to(REPO))
    (root / "reports" / "proofs").mkdir(parents=True)


def molecule_scenarios() -> list[tuple[str, str]]:
    """(role, scenario) of every Molecule scenario make test runs: all but the heavy proofs' (rigkit/proofs.py)."""
    from rigkit.proofs import PROOF_SCENARIOS

    return sorted(
        scenario
        for path in REPO.glob("roles/*/molecule/*/molecule.yml")
        if (scenario := (path.parents[2].name, path.parent.name)) not in PROOF_SCENARIOS
    )
