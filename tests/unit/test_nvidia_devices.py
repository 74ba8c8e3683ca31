"""Device nodes before anything needs them: the nvidia_container_toolkit role's oneshot unit and
its script, rendered by the role's own templates; the CDI spec's refresh decision (the stamp: the loaded driver and
the device nodes present); the llama-server unit's link to the device unit on GPU rigs.

The unit is checked by `systemd-analyze verify`; the script runs for real in a container of each release
(tests/integration/test_nvidia_device_nodes.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from filter_plugins.nvidia_container_toolkit import required_device_nodes, spec_plan, stamp
from tests.support import REPO, json_callback_env

TOOLKIT_VARS = yaml.safe_load((REPO / "roles/nvidia_container_toolkit/vars/main.yml").read_text())
SERVER_VARS = yaml.safe_load((REPO / "roles/llama_server/vars/main.yml").read_text())
UNIT = TOOLKIT_VARS["__nvidia_container_toolkit_device_unit"]

# /proc/driver/nvidia/gpus/<pci>/information as driver 535 writes it (tab after the colon).
INFORMATION = (
    "Model: \t\t NVIDIA GeForce RTX 3050 OEM\nIRQ:   \t\t 139\nGPU UUID: \t GPU-5a0d3f0e-1b4c-2d8e-9f60-7a1b2c3d4e5f\n"
    "Video BIOS: \t 94.06.2f.00.9a\nBus Type: \t PCIe\nDMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\n"
    "Bus Location: \t 0000:{bus}:00.0\nDevice Minor: \t {minor}\nGPU Firmware: \t N/A\nGPU Excluded:\t No\n"
)
NODES = ["/dev/dri/card0", "/dev/dri/renderD128", "/dev/nvidia0", "/dev/nvidia-modeset", "/dev/nvidiactl"]
UVM = ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


# --- the stamp decision -----------------------------------------------------------------------------------
def test_the_spec_is_current_when_driver_and_nodes_are_those_recorded() -> None:
    recorded = stamp("535.309.01", NODES + UVM)
    plan = spec_plan(recorded, "535.309.01", list(reversed(NODES + UVM)), True)  # order does not matter
    assert plan == {"regenerate": False, "stamp": recorded, "reason": ""}


def test_a_node_created_since_the_spec_was_made_regenerates_it() -> None:
    """D4: the spec of a first provision lacked /dev/nvidia-uvm; once the device unit made it, the spec follows."""
    plan = spec_plan(stamp("535.309.01", NODES), "535.309.01", NODES + UVM, True)
    assert plan["regenerate"]
    assert plan["reason"] == "device nodes added: /dev/nvidia-uvm, /dev/nvidia-uvm-tools"
    assert "device /dev/nvidia-uvm\n" in plan["stamp"]


def test_a_node_gone_or_a_driver_change_regenerates_it() -> None:
    gone = spec_plan(stamp("535.309.01", [*NODES, "/dev/nvidia1"]), "535.309.01", NODES, True)
    assert gone["regenerate"] and gone["reason"] == "device nodes gone: /dev/nvidia1"
    upgraded = spec_plan(stamp("535.261.03", NODES), "535.309.01", NODES, True)
    assert upgraded["regenerate"] and upgraded["reason"] == "driver 535.261.03 -> 535.309.01"
    assert "driver 535.309.01\n" in upgraded["stamp"]


def test_no_spec_no_stamp_or_an_older_kits_stamp_regenerates_it() -> None:
    current = stamp("535.309.01", NODES)
    assert spec_plan(current, "535.309.01", NODES, False)["reason"] == "no CDI spec yet"
    assert spec_plan("", "535.309.01", NODES, True)["reason"].startswith("no stamp next to the spec")
    # the stamp an older kit wrote: the driver version alone (same driver, but which nodes is unknown)
    older = spec_plan("535.309.01\n", "535.309.01", NODES, True)
    assert older["regenerate"] and "older kit" in older["reason"]


def test_a_stamp_needs_a_loaded_driver() -> None:
    with pytest.raises(AnsibleFilterError, match="no loaded NVIDIA driver"):
        stamp("", NODES)


def test_required_nodes_are_the_control_nodes_and_one_per_gpu() -> None:
    infos = [INFORMATION.format(bus="02", minor=1), INFORMATION.format(bus="01", minor=0)]
    assert required_device_nodes(infos) == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidia1"]
    slurped = [{"content": "RGV2aWNlIE1pbm9yOiAJIDMK", "source": "/proc/x/information"}]  # "Device Minor: \t 3"
    assert required_device_nodes(slurped)[-1] == "/dev/nvidia3"
    with pytest.raises(AnsibleFilterError, match="no 'Device Minor:' line"):
        required_device_nodes(["Model: something\n"])


# --- the unit and its script, as the role renders them ----------------------------------------------------
@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    work = tmp_path_factory.mktemp("nvidia-devices")
    out = work / "out"
    out.mkdir()
    extra = {"out_dir": str(out)}
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local"]
    cmd += ["-e", f"ansible_python_interpreter={sys.executable}", "-e", json.dumps(extra)]
    cmd.append(str(REPO / "tests/unit/playbooks/render_nvidia_devices.yml"))
    done = subprocess.run(cmd, cwd=REPO, env=json_callback_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return work, out


def unit_settings(text: str) -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current = ""
    for line in text.splitlines():
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            sections[current] = {}
        elif "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            sections[current].setdefault(key, []).append(value)
    return sections


def test_the_unit_is_a_oneshot_before_docker_wanted_at_boot(rendered: tuple[Path, Path]) -> None:
    _work, out = rendered
    unit = unit_settings((out / UNIT).read_text())
    assert unit["Unit"]["Before"] == ["docker.service"]
    assert unit["Service"]["Type"] == ["oneshot"]
    assert unit["Service"]["RemainAfterExit"] == ["yes"]
    assert unit["Service"]["ExecStart"] == [TOOLKIT_VARS["__nvidia_container_toolkit_device_script"]]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_systemd_accepts_the_unit(rendered: tuple[Path, Path]) -> None:
    work, out = rendered
    if not shutil.which("systemd-analyze"):
        pytest.skip("no systemd-analyze on this machine")
    # verify needs the ExecStart binary to exist: point it at the rendered script
    unit = (
        (out / UNIT)
        .read_text()
        .replace(TOOLKIT_VARS["__nvidia_container_toolkit_device_script"], str(out / "nvidia-device-nodes"))
    )
    checked = work / "verify"
    checked.mkdir()
    (checked / UNIT).write_text(unit)
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(checked / UNIT)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert not [line for line in done.stderr.splitlines() if UNIT in line], done.stderr  # no warning either


# --- the two roles name one unit --------------------------------------------------------------------------
def test_the_server_requires_the_unit_the_toolkit_installs() -> None:
    assert SERVER_VARS["__llama_server_gpu_device_unit"] == UNIT
