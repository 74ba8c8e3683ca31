"""Verify the nvidia_container_toolkit role in a systemd rig container (no GPU, no NVIDIA repository: the packages
are not installed; the daemon.json merge, the Docker restart, the device nodes' unit and the masks of the toolkit's
own CDI refresh are real)."""

from __future__ import annotations

import json


def test_runtime_merged_next_to_other_owners_keys(host):
    config = json.loads(host.file("/etc/docker/daemon.json").content_string)
    assert config["runtimes"] == {"nvidia": {"path": "nvidia-container-runtime", "args": []}}
    assert "default-runtime" not in config
    # The docker role's keys and a key another owner wrote are all still there.
    assert config["bridge"] == "none"
    assert config["log-opts"] == {"max-size": "10m"}
    assert config["max-concurrent-downloads"] == 4


def test_running_engine_knows_the_runtime(host):
    assert host.service("docker").is_running
    runtimes = json.loads(host.check_output("docker info --format '{{json .Runtimes}}'"))
    assert "nvidia" in runtimes
    assert runtimes["nvidia"]["path"] == "nvidia-container-runtime"


def test_no_toolkit_packages_faked(host):
    for name in ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container1"):
        assert not host.package(name).is_installed
    assert not host.file("/etc/apt/sources.list.d/nvidia-container-toolkit.sources").exists
    # No key either: the pinned key is fetched only with the packages (unreachable here).
    assert not host.file("/etc/apt/keyrings/nvidia-container-toolkit.asc").exists


def test_no_cdi_spec_without_a_gpu(host):
    assert not host.file("/etc/cdi/nvidia.yaml").exists
    assert not host.file("/etc/cdi/nvidia.yaml.stamp").exists


# --- device nodes before anything needs them (no GPU here: installed and enabled, not started) -------------
UNIT = "rigkit-nvidia-devices.service"


def show(host, unit: str, *properties: str) -> dict[str, str]:
    out = host.check_output(f"systemctl show {unit} " + " ".join(f"--property={name}" for name in properties))
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_device_unit_installed_enabled_and_ordered_before_docker(host):
    unit = host.file(f"/etc/systemd/system/{UNIT}")
    assert unit.exists and unit.user == "root" and unit.mode == 0o644
    assert host.service(UNIT).is_enabled
    # systemd's own view of the loaded unit, not the file's text
    props = show(host, UNIT, "Type", "RemainAfterExit", "Before", "WantedBy", "ExecStart", "LoadState")
    assert props["LoadState"] == "loaded"
    assert props["Type"] == "oneshot" and props["RemainAfterExit"] == "yes"
    assert "docker.service" in props["Before"].split()
    assert "multi-user.target" in props["WantedBy"].split()
    assert "/usr/local/lib/rigkit/nvidia-device-nodes" in props["ExecStart"]
    assert UNIT in show(host, "docker.service", "After")["After"].split()
    # no GPU in this container: the role does not start it (it would fail without a driver)
    assert show(host, UNIT, "ActiveState")["ActiveState"] == "inactive"


def test_device_script_installed(host):
    script = host.file("/usr/local/lib/rigkit/nvidia-device-nodes")
    assert script.exists and script.user == "root" and script.mode == 0o755
    text = script.content_string
    assert 'modules="nvidia nvidia_uvm nvidia_modeset"' in text
    # no driver in this container: it fails, naming the module and what to do, rather than doing nothing
    done = host.run("/usr/local/lib/rigkit/nvidia-device-nodes")
    cause = "will not load: check 'dmesg | grep -i nvrm'" if host.exists("modprobe") else "modprobe is missing"
    assert done.rc == 1 and done.stderr.startswith("rigkit-nvidia-devices: the nvidia module "), done.stderr
    assert cause in done.stderr, done.stderr


def test_toolkits_own_cdi_refresh_masked(host):
    for unit in ("nvidia-cdi-refresh.service", "nvidia-cdi-refresh.path"):
        link = host.file(f"/etc/systemd/system/{unit}")
        assert link.is_symlink and link.linked_to == "/dev/null", unit
        assert host.run(f"systemctl is-enabled {unit}").stdout.strip() == "masked", unit
        assert show(host, unit, "ActiveState")["ActiveState"] == "inactive", unit
    assert not host.file("/var/run/cdi/nvidia.yaml").exists
