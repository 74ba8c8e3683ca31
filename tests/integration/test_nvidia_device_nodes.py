"""The device nodes' script, as the nvidia_container_toolkit role renders it, run in a container of each supported
Debian release and in one laid out as an Ubuntu rig: no nvidia-modprobe, the open kernel module's
``/proc/devices`` name (``nvidia``, not ``nvidia-frontend``) and an ``nvidia-caps`` entry.

No kernel here has the NVIDIA modules, so what the loaded driver would show is laid over the kernel's own files
inside the container (``mount --bind`` over ``/proc/devices``, a tmpfs over ``/proc/driver`` and ``/sys/module``,
as lxcfs does): the script reads the real paths, and ``mknod`` makes real character devices whose numbers are read
back with ``stat``. Ubuntu's archive cannot be reached from here, so the Ubuntu layout runs on Debian 12's userland.

Needs the Docker engine and the rig images (``make harness``; Debian 13's is made here by the same playbook);
creates only containers named ``$RIGKIT_TEST_CONTAINER_PREFIX-*`` (default ``rigkit-devnodes``), removed after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import REPO, json_callback_env, run, unavailable

PREFIX = os.environ.get("RIGKIT_TEST_CONTAINER_PREFIX", "rigkit-devnodes")
SCRIPT = "/usr/local/lib/rigkit/nvidia-device-nodes"
UVM_MAJOR = 508
INFORMATION = "Model: \t\t NVIDIA GeForce RTX 3050\nBus Location: \t 0000:{bus}:00.0\nDevice Minor: \t {minor}\n"


@dataclass(frozen=True)
class Layout:
    name: str
    suite: str
    gpu_device: str  # the name the nvidia module gives its major in /proc/devices
    extra_devices: tuple[str, ...] = ()


LAYOUTS = (
    Layout("debian12", "bookworm", "nvidia-frontend"),
    Layout("debian13", "trixie", "nvidia-frontend"),
    Layout("ubuntu", "bookworm", "nvidia", ("237 nvidia-caps",)),
)


def docker(*args: str, check: bool = True, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=check)


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("nvidia-device-script")
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local"]
    cmd += ["-e", f"ansible_python_interpreter={sys.executable}", "-e", json.dumps({"out_dir": str(out)})]
    cmd.append(str(REPO / "tests/unit/playbooks/render_nvidia_devices.yml"))
    done = subprocess.run(cmd, cwd=REPO, env=json_callback_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out / "nvidia-device-nodes"


def rig_image(suite: str) -> str:
    image = f"rigkit/rig:{suite}"
    if docker("image", "inspect", image, check=False).returncode != 0:
        made = run(
            ["ansible-playbook", "playbooks/harness.yml", "-e", f"container_harness_debian_suite={suite}"],
            log_name=f"harness-{suite}",
        )
        if made.returncode != 0:
            unavailable(f"{image} could not be built: {made.tail(20)}")
    return image


class Rig:
    """One container of a layout, its driver's view laid over the kernel's files; nothing else of it is touched."""

    def __init__(self, layout: Layout, script: Path) -> None:
        self.layout = layout
        self.name = f"{PREFIX}-{layout.name}"
        docker("rm", "--force", self.name, check=False)
        docker(
            "run", "--detach", "--name", self.name, "--network", "none",
            "--cap-add", "SYS_ADMIN",  # the mounts that lay the driver's view over /proc and /sys
            "--security-opt", "apparmor=unconfined", "--security-opt", "seccomp=unconfined",
            "--volume", f"{script}:{SCRIPT}:ro",
            "--entrypoint", "sleep", rig_image(layout.suite), "infinity",
        )  # fmt: skip

    def sh(self, command: str) -> subprocess.CompletedProcess[str]:
        return docker("exec", self.name, "sh", "-ec", command, check=False)

    def driver(self, *, modules: tuple[str, ...], minors: tuple[int, ...], uvm: bool = True) -> None:
        """What a loaded driver shows: its modules, its majors, the GPUs it lists (replacing any earlier view)."""
        chars = ["  1 mem", "  4 /dev/vc/0", f"195 {self.layout.gpu_device}", *self.layout.extra_devices]
        chars += [f"{UVM_MAJOR} nvidia-uvm"] if uvm else []
        devices = "Character devices:\n" + "\n".join(chars) + "\n\nBlock devices:\n  8 sd\n259 blkext\n"
        gpus = ""
        for index, minor in enumerate(minors):
            gpu = f"/proc/driver/nvidia/gpus/0000:0{index + 1}:00.0"
            information = INFORMATION.format(bus=f"0{index + 1}", minor=minor)
            gpus += f"mkdir -p {gpu} && printf '%s' '{information}' > {gpu}/information\n"
        setup = (
            "umount /proc/devices 2>/dev/null || true; umount /proc/driver 2>/dev/null || true\n"
            "umount /sys/module 2>/dev/null || true\n"
            f"printf '%s' '{devices}' > /tmp/devices && mount --bind /tmp/devices /proc/devices\n"
            "mount -t tmpfs driver /proc/driver && mount -t tmpfs modules /sys/module\n"
            + "".join(f"mkdir /sys/module/{module}\n" for module in modules)
            + gpus
        )
        done = self.sh(setup)
        assert done.returncode == 0, done.stderr

    def nodes(self) -> dict[str, str]:
        """Every /dev/nvidia* node: its type, major:minor (decimal), mode and owner."""
        done = self.sh('for n in /dev/nvidia*; do [ -e "$n" ] && stat -c \'%n %F %t %T %a %U:%G\' "$n"; done; true')
        nodes = {}
        for line in done.stdout.splitlines():
            path, *kind, major, minor, mode, owner = line.split()
            nodes[path] = f"{' '.join(kind)} {int(major, 16)}:{int(minor, 16)} {mode} {owner}"
        return nodes

    def remove(self) -> None:
        docker("rm", "--force", self.name, check=False)


@pytest.fixture(scope="module", params=LAYOUTS, ids=[layout.name for layout in LAYOUTS])
def rig(request: pytest.FixtureRequest, script: Path, harness: dict[str, int]) -> Iterator[Rig]:
    made = Rig(request.param, script)
    try:
        yield made
    finally:
        made.remove()


def expected(gpu_minors: tuple[int, ...]) -> dict[str, str]:
    char = "character special file"
    nodes = {
        "/dev/nvidiactl": f"{char} 195:255 666 root:root",
        "/dev/nvidia-modeset": f"{char} 195:254 666 root:root",
        "/dev/nvidia-uvm": f"{char} {UVM_MAJOR}:0 666 root:root",
        "/dev/nvidia-uvm-tools": f"{char} {UVM_MAJOR}:1 666 root:root",
    }
    return nodes | {f"/dev/nvidia{m}": f"{char} 195:{m} 666 root:root" for m in gpu_minors}


LOADED = ("nvidia", "nvidia_uvm", "nvidia_modeset")


def test_the_layout_is_what_it_claims(rig: Rig) -> None:
    release = rig.sh(". /etc/os-release && echo $VERSION_CODENAME").stdout.strip()
    assert release == rig.layout.suite
    # no nvidia-modprobe anywhere (Ubuntu's -server driver packages lack it), and nothing made the nodes before
    assert rig.sh("command -v nvidia-modprobe").returncode != 0
    assert rig.nodes() == {}


def test_with_the_driver_loaded_it_makes_every_node_once(rig: Rig) -> None:
    rig.driver(modules=LOADED, minors=(0, 1))
    first = rig.sh(SCRIPT)
    assert first.returncode == 0, first.stderr
    assert rig.nodes() == expected((0, 1))
    assert first.stdout.startswith(
        "rigkit-nvidia-devices: control nodes and 2 GPU node(s) present; made: /dev/nvidiactl"
    )
    again = rig.sh(SCRIPT)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "rigkit-nvidia-devices: control nodes and 2 GPU node(s) present; made: none"


def test_a_node_left_from_an_earlier_load_is_made_again(rig: Rig) -> None:
    """nvidia-uvm's major is the kernel's choice at each load: a node with the old one would open another device."""
    rig.driver(modules=LOADED, minors=(0,))
    rig.sh(f"rm -f /dev/nvidia*; mknod -m 0600 /dev/nvidia-uvm c {UVM_MAJOR + 3} 0")
    done = rig.sh(SCRIPT)
    assert done.returncode == 0, done.stderr
    assert rig.nodes() == expected((0,))


def test_a_module_that_is_not_loaded_names_what_is_missing(rig: Rig) -> None:
    rig.driver(modules=("nvidia", "nvidia_modeset"), minors=(0,), uvm=False)
    rig.sh("rm -f /dev/nvidia*")
    done = rig.sh(SCRIPT)
    assert done.returncode == 1
    # the rig images carry no kmod; a rig does (dkms depends on it), and the script says which is which
    assert done.stderr.strip() == (
        "rigkit-nvidia-devices: the nvidia_uvm module is not loaded and modprobe is missing: install kmod "
        "('apt-get install kmod'), then 'systemctl restart rigkit-nvidia-devices'"
    )
    assert rig.nodes() == {}


def test_a_loaded_module_without_its_device_entry_is_named(rig: Rig) -> None:
    rig.driver(modules=LOADED, minors=(0,), uvm=False)
    done = rig.sh(SCRIPT)
    assert done.returncode == 1
    assert "/proc/devices lists no nvidia-uvm although the nvidia_uvm module is loaded" in done.stderr


def test_a_driver_that_lists_no_gpu_is_named(rig: Rig) -> None:
    rig.driver(modules=LOADED, minors=())
    done = rig.sh(SCRIPT)
    assert done.returncode == 1
    assert "lists no GPU" in done.stderr and "lspci -nn | grep -i nvidia" in done.stderr
