"""The GPU proof is the production container: the llama_server role's tasks/gpu_proof.yml runs
the server's image with the unit's own container flags and `llama-server --list-devices`, which must list CUDA0.

The real task file and filter run here against a fake `docker` that records its argv and prints what a real
`--list-devices` prints (llama.cpp's common_print_available_devices at the pin, ggml_cuda_init's error line), so
the test proves that the proof's flags are the unit's, token for token, and that every failure names its cause."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from filter_plugins.llama_server_gpu import gpu_proof, listed_devices
from tests.support import REPO, exec_start_argv, json_callback_env

CUDA_LISTING = "Available devices:\n  CUDA0: NVIDIA GeForce RTX 3050 OEM (7971 MiB, 7800 MiB free)\n"
CUDA_FOUND = (
    "ggml_cuda_init: found 1 CUDA devices:\n  Device 0: NVIDIA GeForce RTX 3050 OEM, compute capability 8.6, VMM: yes\n"
)
NONE_LISTING = "Available devices:\n  (none)\n"
# What a CUDA build prints when the container has no /dev/nvidia-uvm (cudaGetDeviceCount fails).
CUDA_FAILED = "ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected\n"
CDI_FAILED = (
    "docker: Error response from daemon: failed to create task for container: failed to create shim task: "
    "OCI runtime create failed: could not apply required modification to OCI specification: error modifying OCI "
    'spec: failed to inject CDI devices: failed to stat CDI host device "/dev/nvidia-uvm": no such file or '
    "directory: unknown.\n"
)

# host -> (llama_server_gpu_access, rc, stdout, stderr)
CASES = {
    "cuda": ("cdi", 0, CUDA_LISTING, CUDA_FOUND),
    "cudafailed": ("cdi", 0, NONE_LISTING, CUDA_FAILED),
    "cdierror": ("cdi", 125, "", CDI_FAILED),
    "cpubuild": ("cdi", 0, NONE_LISTING, ""),
    "legacy": ("gpus", 0, CUDA_LISTING, CUDA_FOUND),
    "mlock": ("cdi", 0, CUDA_LISTING, CUDA_FOUND),
    "cpurig": ("none", 0, NONE_LISTING, ""),
}

FAKE_DOCKER = """#!/bin/sh
# records its argv (one per line) and answers as the case of its io.rigkit.gpu-proof label says
case_=""
for arg in "$@"; do case "$arg" in io.rigkit.gpu-proof=*) case_=${arg#io.rigkit.gpu-proof=};; esac; done
printf '%s\\n' "$@" > "$FAKE_DIR/$case_.argv"
cat "$FAKE_DIR/$case_.stdout"
cat "$FAKE_DIR/$case_.stderr" >&2
exit "$(cat "$FAKE_DIR/$case_.rc")"
"""


@pytest.fixture(scope="module")
def proved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    work = tmp_path_factory.mktemp("gpu-proof")
    fake, out = work / "fake", work / "out"
    fake.mkdir()
    out.mkdir()
    docker = fake / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(docker.stat().st_mode | stat.S_IXUSR)
    hosts = {}
    for name, (access, rc, stdout, stderr) in CASES.items():
        (fake / f"{name}.stdout").write_text(stdout)
        (fake / f"{name}.stderr").write_text(stderr)
        (fake / f"{name}.rc").write_text(str(rc))
        hosts[name] = {
            "llama_server_instance": name,
            "llama_server_gpu_access": access,
            "llama_server_mlock": name == "mlock",
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
        }
    (work / "hosts.json").write_text(json.dumps({"all": {"hosts": hosts}}))
    env = {**json_callback_env(), "FAKE_DIR": str(fake), "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    playbook = REPO / "tests/unit/playbooks/gpu_proof.yml"
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(work / "hosts.json")]
    cmd += ["-e", json.dumps({"out_dir": str(out)}), str(playbook)]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    try:
        result = json.loads(done.stdout)
    except ValueError:
        pytest.fail(f"unexpected ansible output (rc {done.returncode}):\n{done.stdout}\n{done.stderr}")
    return fake, out, result


def proof_argv(fake: Path, host: str) -> list[str]:
    return ["docker", *(fake / f"{host}.argv").read_text().splitlines()]


def container_flags(unit: str) -> list[str]:
    """The unit's container flags: ExecStart's options between `--network host` and the first --volume."""
    argv = exec_start_argv(unit)
    return argv[argv.index("host") + 1 : argv.index("--volume")]


@pytest.mark.parametrize("host", ["cuda", "legacy", "mlock"])
def test_a_container_that_sees_cuda0_passes(proved: tuple[Path, Path, dict], host: str) -> None:
    _fake, out, _result = proved
    assert not (out / f"{host}.failure").exists(), (out / f"{host}.failure").read_text()


@pytest.mark.parametrize("host", list(CASES))
def test_the_proof_runs_the_image_with_the_units_own_flags(proved: tuple[Path, Path, dict], host: str) -> None:
    fake, out, _result = proved
    flags = container_flags((out / f"{host}.service").read_text())
    argv = proof_argv(fake, host)
    assert argv == [
        "docker",
        "run",
        "--rm",
        "--label",
        f"io.rigkit.gpu-proof={host}",
        *flags,
        "rigkit/llama-server:example",
        "--list-devices",
    ]
    # What the flags are: the server's isolation, its limits and its GPU device.
    for pair in (["--user", "10001:10001"], ["--cap-drop", "ALL"], ["--security-opt", "no-new-privileges"]):
        assert any(flags[i : i + 2] == pair for i in range(len(flags))), (pair, flags)
    assert "--read-only" in flags and "--memory" in flags and "--pids-limit" in flags
    access = CASES[host][0]
    if access == "cdi":
        assert flags[-2:] == ["--device", "nvidia.com/gpu=all"]
    elif access == "gpus":
        assert flags[-2:] == ["--gpus", "all"]
    else:
        assert "--device" not in flags and "--gpus" not in flags
    assert ("--cap-add" in flags) == (host == "mlock")


def test_a_cuda_build_that_found_no_device_is_refused_naming_cuda(proved: tuple[Path, Path, dict]) -> None:
    _fake, out, _result = proved
    message = (out / "cudafailed.failure").read_text()
    assert "serve on the CPU" in message
    assert "CUDA did not initialise in the container: no CUDA-capable device is detected" in message
    assert "/dev/nvidia-uvm" in message
    assert "systemctl status rigkit-nvidia-devices.service" in message and "nvidia-ctk cdi list" in message


def test_a_cdi_injection_failure_is_refused_naming_the_missing_node(proved: tuple[Path, Path, dict]) -> None:
    _fake, out, _result = proved
    message = (out / "cdierror.failure").read_text()
    assert "Docker could not give the container the GPU" in message
    assert 'failed to stat CDI host device "/dev/nvidia-uvm"' in message
    assert "nvidia-ctk cdi list" in message


def test_a_cpu_image_on_a_gpu_rig_is_refused_as_built_without_cuda(proved: tuple[Path, Path, dict]) -> None:
    _fake, out, _result = proved
    message = (out / "cpubuild.failure").read_text()
    assert "built without CUDA" in message and "llamacpp_image_cuda" in message


def test_a_gpu_rigs_unit_requires_the_device_nodes_unit(proved: tuple[Path, Path, dict]) -> None:
    _fake, out, _result = proved
    for host in ("cuda", "legacy"):
        lines = (out / f"{host}.service").read_text().splitlines()
        unit_section = lines[: lines.index("[Service]")]
        assert "Requires=rigkit-nvidia-devices.service" in unit_section, host
        assert "After=rigkit-nvidia-devices.service" in unit_section, host
    assert "rigkit-nvidia-devices" not in (out / "cpurig.service").read_text()


def test_systemd_accepts_a_gpu_rigs_unit_with_the_device_unit(proved: tuple[Path, Path, dict], tmp_path: Path) -> None:
    """`systemd-analyze verify` on the rendered server unit of a GPU rig, beside the device unit it requires."""
    _fake, out, _result = proved
    if not shutil.which("systemd-analyze") or not Path("/usr/bin/docker").exists():
        pytest.skip("needs systemd-analyze and /usr/bin/docker (the unit's ExecStart) on this machine")
    script = tmp_path / "nvidia-device-nodes"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    device_unit = tmp_path / "rigkit-nvidia-devices.service"
    device_unit.write_text(
        "[Unit]\nDescription=device nodes\nBefore=docker.service\n[Service]\nType=oneshot\nRemainAfterExit=yes\n"
        f"ExecStart={script}\n[Install]\nWantedBy=multi-user.target\n"
    )
    server_unit = tmp_path / "rigkit-llama-cuda.service"
    shutil.copy(out / "cuda.service", server_unit)
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(server_unit), str(device_unit)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "rigkit-" not in done.stderr, done.stderr


def test_the_role_skips_the_proof_on_a_cpu_rig_and_in_check_mode() -> None:
    """main.yml includes the proof only where the unit gets a GPU device, and never in check mode."""
    import yaml

    tasks = yaml.safe_load((REPO / "roles/llama_server/tasks/main.yml").read_text())
    proof = next(task for task in tasks if task.get("ansible.builtin.include_tasks") == "gpu_proof.yml")
    assert proof["when"] == "llama_server_gpu_access != 'none' and not ansible_check_mode"
    names = [task.get("ansible.builtin.include_tasks") for task in tasks]
    assert names.index("gpu_proof.yml") < names.index("rollout.yml")  # before the running server is touched


# --- the filter alone -------------------------------------------------------------------------------------
def test_listed_devices_reads_every_device_line() -> None:
    listing = CUDA_LISTING + "  CUDA1: NVIDIA H200 (143771 MiB, 143000 MiB free)\n"
    assert list(listed_devices(listing)) == ["CUDA0", "CUDA1"]
    assert listed_devices(NONE_LISTING) == {}
    # device-like lines before the heading are not devices
    assert listed_devices("  CUDA0: stray\n" + NONE_LISTING) == {}


def test_the_driver_older_than_the_images_cuda_is_named() -> None:
    err = "ggml_cuda_init: failed to initialize CUDA: CUDA driver version is insufficient for CUDA runtime version\n"
    verdict = gpu_proof({"rc": 0, "stdout": NONE_LISTING, "stderr": err})
    assert not verdict["ok"] and "older than the image's CUDA runtime" in verdict["message"]


def test_another_device_than_cuda0_does_not_pass() -> None:
    verdict = gpu_proof({"rc": 0, "stdout": "Available devices:\n  Vulkan0: llvmpipe (1024 MiB, 1024 MiB free)\n"})
    assert not verdict["ok"] and "Vulkan0" in verdict["message"]


def test_a_result_without_rc_is_a_usage_error() -> None:
    with pytest.raises(AnsibleFilterError):
        gpu_proof({"stdout": CUDA_LISTING})
