"""GPU checks on a real rig, expectations from its inventory (rig_gpu, nvidia_driver_version):

    pytest tests/rig/test_nvidia.py --hosts='ansible://gpu_rigs' --ansible-inventory=inventory/hosts.yml

A host the inventory gives no GPU (a sandbox, CI's containers) skips every check with the reason; a GPU rig
without /dev/nvidiactl fails.
"""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

from tests.support import REPO, exec_start_argv, not_applicable, plain

DRIVER_DEFAULTS = yaml.safe_load((REPO / "roles/nvidia_driver/defaults/main.yml").read_text())
QUERY = "nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv,noheader,nounits"


@pytest.fixture(scope="module")
def gpu_rig(host):
    hostvars = plain(host.ansible.get_variables())  # make discover writes the GPU's name !unsafe
    name = hostvars.get("inventory_hostname", host.backend.get_hostname())
    if host.file("/dev/nvidiactl").exists:
        return host, hostvars
    if "gpu_rigs" in hostvars.get("group_names", []) or hostvars.get("rig_gpu"):
        # A rig the inventory says has a GPU must show it: a missing device is the failure this suite exists for.
        pytest.fail(f"{name} is a GPU rig (gpu_rigs / rig_gpu) but /dev/nvidiactl is absent: no driver loaded")
    not_applicable(f"{name} has no GPU by inventory (not in gpu_rigs, no rig_gpu)")


def setting(hostvars: dict, key: str):
    return hostvars.get(key, DRIVER_DEFAULTS[key])


def query(host) -> list[str]:
    return [field.strip() for field in host.check_output(QUERY).splitlines()[0].split(",")]


def test_nvidia_smi_answers_with_the_pinned_driver(gpu_rig):
    host, hostvars = gpu_rig
    assert query(host)[3] == str(setting(hostvars, "nvidia_driver_version"))


def test_gpu_matches_rig_gpu(gpu_rig):
    host, hostvars = gpu_rig
    expected = hostvars.get("rig_gpu") or {}
    if not expected:
        not_applicable("rig_gpu is not set for this host: no GPU model to compare with")
    name, memory, compute_cap, _ = query(host)
    assert name == expected["name"]
    assert abs(int(memory) - int(expected["vram_mib"])) <= int(setting(hostvars, "nvidia_driver_vram_tolerance_mib"))
    assert compute_cap == str(expected["compute_capability"])


def test_loaded_module_is_the_pinned_version(gpu_rig):
    host, hostvars = gpu_rig
    assert host.file("/sys/module/nvidia/version").content_string.strip() == str(
        setting(hostvars, "nvidia_driver_version")
    )


def test_dkms_status_clean(gpu_rig):
    host, _ = gpu_rig
    # The nvidia_driver role installs the DKMS packages on every GPU rig (vars/<Distribution>.yml).
    assert host.exists("dkms"), "dkms is not installed: the nvidia_driver role installs the driver's DKMS packages"
    lines = [line for line in host.check_output("dkms status").splitlines() if "nvidia" in line]
    assert lines, "dkms knows no NVIDIA module"
    kernel = host.check_output("uname -r")
    assert any(kernel in line and ": installed" in line for line in lines), lines
    assert all(": installed" in line for line in lines), lines


def test_nouveau_not_loaded(gpu_rig):
    host, _ = gpu_rig
    assert not host.file("/sys/module/nouveau").exists


def test_driver_packages_held(gpu_rig):
    host, hostvars = gpu_rig
    version = str(setting(hostvars, "nvidia_driver_version"))
    installed = host.check_output(
        "dpkg-query -W -f '${Package} ${Version} ${Status}\\n' 'nvidia-*' 'libnvidia-*' 'libcuda1'"
    )
    driver = [line.split() for line in installed.splitlines() if f" {version}-" in line and line.endswith("installed")]
    assert driver, f"no package at {version}"
    assert all(fields[2] == "hold" for fields in driver), driver


def test_container_sees_the_gpu_through_cdi(gpu_rig):
    """The production container sees CUDA0: the image the server's unit runs, with the unit's own container flags
    (read back from the installed unit), lists it (`llama-server --list-devices`)."""
    host, hostvars = gpu_rig
    defaults = yaml.safe_load((REPO / "roles/nvidia_container_toolkit/defaults/main.yml").read_text())
    spec = hostvars.get("nvidia_container_toolkit_cdi_spec", defaults["nvidia_container_toolkit_cdi_spec"])
    # The nvidia_container_toolkit role generates the spec on every GPU rig (tasks/cdi.yml).
    assert host.file(spec).exists, f"no CDI spec ({spec}): the nvidia_container_toolkit role did not run here"
    assert host.service("rigkit-nvidia-devices.service").is_enabled
    for node in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0"):
        assert host.file(node).exists, f"{node} is missing: rigkit-nvidia-devices.service creates it"
    instance = hostvars.get("llama_server_instance", "main")
    unit = host.file(f"/etc/systemd/system/rigkit-llama-{instance}.service").content_string
    assert "Requires=rigkit-nvidia-devices.service" in unit
    argv = exec_start_argv(unit)
    image = host.check_output(f"docker inspect --format '{{{{.Config.Image}}}}' rigkit-llama-{instance}").strip()
    options = argv[2 : argv.index(image)]  # after `docker run`, up to the image: the container's flags
    dropped = {"--rm", "--name", "--env-file", "--label", "--volume"}
    kept: list[str] = []
    skip = False
    for option in options:
        if skip:
            skip = False
        elif option in dropped:
            skip = option != "--rm"
        else:
            kept.append(option)
    assert "--read-only" in kept and "--cap-drop" in kept and "--device" in kept, kept
    command = " ".join(shlex.quote(arg) for arg in ["docker", "run", "--rm", *kept, image, "--list-devices"])
    out = host.check_output(command)
    assert re.search(r"^\s+CUDA0: ", out, re.MULTILINE), out
