"""The Ubuntu and NVIDIA-repository paths, which cannot be reached here: resolve the roles' own variables for
each distribution, source and branch (a check-mode playbook with faked facts) and assert the exact packages,
repository lines and holds they produce. No role logic is re-implemented here."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jinja2
import pytest
import yaml

from tests.support import REPO, run

PLAYBOOK = REPO / "tests/unit/playbooks/nvidia_plan.yml"

FACTS = {
    "debian12": {
        "distribution": "Debian",
        "distribution_release": "bookworm",
        "distribution_major_version": "12",
        "distribution_version": "12.12",
        "os_family": "Debian",
        "architecture": "x86_64",
    },
    "debian13": {
        "distribution": "Debian",
        "distribution_release": "trixie",
        "distribution_major_version": "13",
        "distribution_version": "13.2",
        "os_family": "Debian",
        "architecture": "x86_64",
    },
    "ubuntu2204": {
        "distribution": "Ubuntu",
        "distribution_release": "jammy",
        "distribution_major_version": "22",
        "distribution_version": "22.04",
        "os_family": "Debian",
        "architecture": "x86_64",
    },
    "ubuntu2404": {
        "distribution": "Ubuntu",
        "distribution_release": "noble",
        "distribution_major_version": "24",
        "distribution_version": "24.04",
        "os_family": "Debian",
        "architecture": "x86_64",
    },
}

CUDA_REPO = "https://developer.download.nvidia.com/compute/cuda/repos/{dist}/x86_64/"

# (distribution, case, expected packages, expected repository or None)
V580 = "580.95.05"
V590 = "590.44.01"


def pinned(version: str, *names: str) -> list[str]:
    return [f"{name}={version}-*" for name in names]


CUDA_KEYS = {  # NVIDIA signs each distribution tree with its own key: (file name, fingerprint)
    "debian12": ("3bf863cc", "EB693B3035CD5710E231E123A4B469963BF863CC"),
    "debian13": ("8793F200", "02182E60104FCDC26EAE1B8597A5D4CB8793F200"),
    "ubuntu2204": ("3bf863cc", "EB693B3035CD5710E231E123A4B469963BF863CC"),
    "ubuntu2404": ("3bf863cc", "EB693B3035CD5710E231E123A4B469963BF863CC"),
}
KEYRINGS = {
    "bookworm": "/usr/share/keyrings/debian-archive-keyring.gpg",
    "trixie": "/usr/share/keyrings/debian-archive-keyring.pgp",
}
TOOLKIT_KEY_FINGERPRINT = "C95B321B61E88C1809C4F759DDCAE044F796ECB0"


def nvidia_repo(dist: str, variable: str = "nvidia_driver_cuda_repo_key_fingerprints") -> dict:
    """NVIDIA's CUDA repository, signed by a key file the kit installs only when its fingerprint is pinned."""
    url = CUDA_REPO.format(dist=dist)
    return {
        "name": "nvidia-cuda",
        "uris": [url],
        "suites": ["/"],
        "components": [],
        "signed_by": "/etc/apt/keyrings/nvidia-cuda.asc",
        "key_url": url + CUDA_KEYS[dist][0] + ".pub",
        "key_fingerprints": [CUDA_KEYS[dist][1]],
        "key_fingerprints_variable": variable,
    }


def debian_nonfree(release: str) -> dict:
    return {
        "name": "debian-nonfree",
        "uris": ["http://deb.debian.org/debian"],
        "suites": [release, f"{release}-updates"],
        "components": ["contrib", "non-free", "non-free-firmware"],
        "signed_by": KEYRINGS[release],
    }


def debian_sources(release: str) -> list[dict]:
    """The driver's Debian sources: the release's non-free components and its security suite's, one keyring."""
    security = {
        "name": "debian-security-nonfree",
        "uris": ["http://deb.debian.org/debian-security"],
        "suites": [f"{release}-security"],
        "components": ["contrib", "non-free", "non-free-firmware"],
        "signed_by": KEYRINGS[release],
    }
    return [debian_nonfree(release), security]


def case(source: str, branch: str, version: str, **extra) -> dict:
    return {"source": source, "branch": branch, "version": version, **extra}


V535, V550 = "535.309.01", "550.163.01"
EXPECTED = {
    "debian12": [
        (
            case("distro", "535", V535),
            pinned(V535, "nvidia-driver", "nvidia-open-kernel-dkms"),
            debian_sources("bookworm"),
        ),
        (
            case("distro", "535", V535, modules="proprietary"),
            pinned(V535, "nvidia-driver", "nvidia-kernel-dkms"),
            debian_sources("bookworm"),
        ),
        (
            case("distro", "535", V535, headless=True),
            pinned(V535, "nvidia-smi", "libcuda1", "nvidia-open-kernel-dkms"),
            debian_sources("bookworm"),
        ),
        (
            case("distro", "535", V535, hardware=False),
            pinned(V535, "nvidia-smi", "libcuda1"),
            debian_sources("bookworm"),
        ),
        (case("nvidia", "580", V580), pinned(V580, "nvidia-open-580"), [nvidia_repo("debian12")]),
        (
            case("nvidia", "580", V580, modules="proprietary"),
            pinned(V580, "cuda-drivers-580"),
            [nvidia_repo("debian12")],
        ),
        (
            case("nvidia", "580", V580, headless=True),
            pinned(V580, "nvidia-driver-cuda", "nvidia-kernel-open-dkms"),
            [nvidia_repo("debian12")],
        ),
        (
            case("nvidia", "590", V590),
            pinned(V590, "nvidia-driver-pinning-590", "nvidia-open"),
            [nvidia_repo("debian12")],
        ),
    ],
    "debian13": [
        (
            case("distro", "550", V550),
            pinned(V550, "nvidia-driver", "nvidia-open-kernel-dkms"),
            debian_sources("trixie"),
        ),
        (
            case("distro", "550", V550, headless=True),
            pinned(V550, "nvidia-smi", "libcuda1", "nvidia-open-kernel-dkms"),
            debian_sources("trixie"),
        ),
        (case("nvidia", "580", V580), pinned(V580, "nvidia-open-580"), [nvidia_repo("debian13")]),
        (
            case("nvidia", "590", V590, modules="proprietary"),
            pinned(V590, "nvidia-driver-pinning-590", "cuda-drivers"),
            [nvidia_repo("debian13")],
        ),
    ],
    "ubuntu2204": [
        (case("distro", "580", V580), pinned(V580, "nvidia-driver-580-server-open"), []),
        (case("distro", "580", V580, modules="proprietary"), pinned(V580, "nvidia-driver-580-server"), []),
        (
            case("distro", "580", V580, headless=True),
            pinned(V580, "nvidia-headless-580-server-open", "nvidia-utils-580-server"),
            [],
        ),
        (
            case("distro", "535", V535, hardware=False),
            pinned(V535, "nvidia-utils-535-server", "libnvidia-compute-535-server"),
            [],
        ),
        (case("nvidia", "580", V580), pinned(V580, "nvidia-open-580"), [nvidia_repo("ubuntu2204")]),
        (
            case("nvidia", "580", V580, headless=True),
            pinned(V580, "libnvidia-compute-580", "nvidia-dkms-580-open", "nvidia-utils-580"),
            [nvidia_repo("ubuntu2204")],
        ),
    ],
    "ubuntu2404": [
        (case("distro", "580", V580), pinned(V580, "nvidia-driver-580-server-open"), []),
        # the branch as the pin: the rig's apt names the build (tasks/setup-Debian.yml), the plan names packages
        (case("distro", "580", "", headless=True), ["nvidia-headless-580-server-open", "nvidia-utils-580-server"], []),
        (
            case("distro", "580", V580, headless=True),
            pinned(V580, "nvidia-headless-580-server-open", "nvidia-utils-580-server"),
            [],
        ),
        (
            case("nvidia", "580", V580, modules="proprietary"),
            pinned(V580, "cuda-drivers-580"),
            [nvidia_repo("ubuntu2404")],
        ),
        (
            case("nvidia", "590", V590),
            pinned(V590, "nvidia-driver-pinning-590", "nvidia-open"),
            [nvidia_repo("ubuntu2404")],
        ),
        (
            case("nvidia", "590", V590, headless=True),
            pinned(V590, "libnvidia-compute-590", "nvidia-dkms-590-open", "nvidia-utils-590"),
            [nvidia_repo("ubuntu2404")],
        ),
    ],
}


def resolve(role: str, facts: dict, cases: list[dict]) -> tuple[list[dict], str]:
    """Run the plan playbook in check mode; return the plans printed by the role (in case order)."""
    extra = json.dumps({"ansible_facts": facts, "plan_role": role, "plan_cases": cases})
    result = run(
        ["ansible-playbook", "--check", "-i", "localhost,", "-e", extra, str(PLAYBOOK)],
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
    )
    if result.returncode != 0:
        return [], result.output
    report = json.loads(result.output[result.output.index("{") :])
    plans = [
        task["hosts"]["localhost"][f"__{role}_plan"]
        for play in report["plays"]
        for task in play["tasks"]
        if task["task"]["name"].endswith(" : Show the resolved plan")
    ]
    return plans, result.output


@pytest.fixture(scope="module")
def driver_plans() -> dict[str, list[dict]]:
    def one(dist: str) -> tuple[str, list[dict], str]:
        plans, output = resolve("nvidia_driver", FACTS[dist], [c for c, _, _ in EXPECTED[dist]])
        return dist, plans, output

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(one, EXPECTED))
    out = {}
    for dist, plans, output in results:
        assert len(plans) == len(EXPECTED[dist]), output[-3000:]
        out[dist] = plans
    return out


@pytest.mark.parametrize(
    ("dist", "index"),
    [(dist, i) for dist, cases in EXPECTED.items() for i in range(len(cases))],
    ids=[
        f"{dist}-{c['source']}-{c['branch']}-{c.get('modules', 'open')}"
        f"{'-headless' if c.get('headless') else ''}{'-nohw' if c.get('hardware') is False else ''}"
        for dist, cases in EXPECTED.items()
        for c, _, _ in cases
    ],
)
def test_driver_packages_and_repository(driver_plans, dist, index):
    _, packages, repository = EXPECTED[dist][index]
    plan = driver_plans[dist][index]
    assert plan["packages"] == packages
    assert plan["repositories"] == repository


def test_driver_holds_every_driver_package(driver_plans):
    plan = driver_plans["debian12"][0]
    hold = re.compile(plan["hold_regex"].strip())
    for name in (
        "nvidia-driver",
        "nvidia-smi",
        "libcuda1",
        "libnvidia-ml1",
        "nvidia-open-kernel-dkms",
        "xserver-xorg-video-nvidia",
        "firmware-nvidia-gsp",
        "cuda-drivers-580",
        "nvidia-open",
    ):
        assert hold.match(name), name
    assert not hold.match("linux-image-amd64")
    assert not hold.match("dkms")
    assert plan["unattended_blacklist"][:3] == ["^nvidia-", "^libnvidia-", "^libcuda1"]


@pytest.mark.parametrize(
    ("dist", "bad"),
    [
        ("debian12", case("distro", "580", V580)),  # bookworm's non-free carries 535 only
        ("debian13", case("distro", "535", V535)),  # trixie's carries 550
        ("ubuntu2404", case("distro", "580", V535)),  # the version is not of the branch
        ("ubuntu2404", case("nvidia", "580", "")),  # NVIDIA's repository keeps every build: pin one
    ],
)
def test_driver_refuses_impossible_combinations(dist, bad):
    plans, output = resolve("nvidia_driver", FACTS[dist], [bad])
    assert plans == []
    assert "cannot install on" in output
    if bad["version"] == "":
        assert "is for nvidia_driver_source: distro" in output


def test_a_followed_branch_says_where_its_build_comes_from(driver_plans):
    plan = driver_plans["ubuntu2404"][1]
    assert plan["apt_pin"] == "the build of branch 580 installed on the rig, else the archive's newest"


GEFORCE = {"name": "NVIDIA GeForce GTX 1650 Ti", "compute_capability": "7.5", "vram_mib": 4096}


@pytest.mark.parametrize(
    ("dist", "bad", "expected"),
    [
        ("debian12", case("distro", "535", V535, rig_gpu=GEFORCE), "open kernel module refuses the NVIDIA GeForce"),
        (
            "debian13",
            case("distro", "550", V550, modules="open", rig_gpu={**GEFORCE, "compute_capability": "6.1"}),
            "need Turing (compute capability 7.5) or newer",
        ),
    ],
)
def test_driver_refuses_open_modules_that_would_not_drive_the_gpu(dist, bad, expected):
    plans, output = resolve("nvidia_driver", FACTS[dist], [bad])
    assert plans == []
    assert expected in output and "nvidia_driver_kernel_modules" in output


def test_open_modules_on_a_data_center_gpu_or_from_545_resolve():
    cases = [
        case("distro", "535", V535, rig_gpu={"name": "NVIDIA H200", "compute_capability": "9.0"}),
        case("nvidia", "580", V580, rig_gpu=GEFORCE),
    ]
    plans, output = resolve("nvidia_driver", FACTS["debian12"], cases)
    assert [plan["kernel_modules"] for plan in plans] == ["open", "open"], output[-3000:]


def test_every_driver_dependency_follows_the_pin(driver_plans):
    """apt preferences at the pinned version, except where NVIDIA's pinning package (590+) does that job."""
    for dist, cases in EXPECTED.items():
        for (given, _, _), plan in zip(cases, driver_plans[dist], strict=True):
            by_package = given["source"] == "nvidia" and int(given["branch"]) >= 590
            if given["version"]:  # a followed branch: the apt pin is named on the rig
                assert plan["apt_pin"] == ("" if by_package else f"{given['version']}-*"), (dist, given)


TOOLKIT_VERSION = "1.18.0"
TOOLKIT_PACKAGES = [
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
]


@pytest.mark.parametrize("dist", list(FACTS))
def test_toolkit_packages_repository_and_runtime(dist):
    cases = [{}, {"default_runtime": True}]
    plans, output = resolve("nvidia_container_toolkit", FACTS[dist], cases)
    assert len(plans) == 2, output[-3000:]
    plan, with_default = plans
    assert plan["packages"] == [f"{name}={TOOLKIT_VERSION}-*" for name in TOOLKIT_PACKAGES]
    assert plan["holds"] == TOOLKIT_PACKAGES
    assert plan["repository"] == {
        "name": "nvidia-container-toolkit",
        "uris": ["https://nvidia.github.io/libnvidia-container/stable/deb/amd64"],
        "suites": ["/"],
        "components": [],
        "signed_by": "/etc/apt/keyrings/nvidia-container-toolkit.asc",
        "key_url": "https://nvidia.github.io/libnvidia-container/gpgkey",
        "key_fingerprints": [TOOLKIT_KEY_FINGERPRINT],
        "key_fingerprints_variable": "nvidia_container_toolkit_repo_key_fingerprints",
    }
    runtime = {"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}
    assert plan["daemon_settings"] == runtime
    assert with_default["daemon_settings"] == {**runtime, "default-runtime": "nvidia"}


GCC = "nvidia-cuda-toolkit-gcc"
CUDA_DISTRO = {
    "debian12": ("11.8", "11.8.89~11.8.0-*", {GCC: "11.8.0-*"}, debian_nonfree("bookworm")),
    "debian13": ("12.4", "12.4.131~12.4.1-*", {GCC: "12.4.1-*"}, debian_nonfree("trixie")),
    "ubuntu2204": ("11.5", "11.5.1-*", {}, {}),
    "ubuntu2404": ("12.0", "12.0.140~12.0.1-*", {GCC: "12.0.1-*"}, {}),
}


@pytest.mark.parametrize("dist", list(FACTS))
def test_cuda_packages_repository_and_nvcc(dist):
    plans, output = resolve("cuda", FACTS[dist], [{"source": "distro"}, {"source": "nvidia"}])
    assert len(plans) == 2, output[-3000:]
    distro, nvidia = plans
    version, package_version, compiler, repository = CUDA_DISTRO[dist]
    names = ["nvidia-cuda-toolkit", *compiler]
    assert distro == {
        "source": "distro",
        "version": version,
        "packages": [f"nvidia-cuda-toolkit={package_version}"] + [f"{n}={v}" for n, v in compiler.items()],
        "holds": names,
        "nvcc": "/usr/bin/nvcc",
        "repository": repository,
    }
    # NVIDIA's repository: the same repository file as the driver role writes for that source.
    assert nvidia == {
        "source": "nvidia",
        "version": "12.8",
        "packages": ["cuda-toolkit-12-8"],
        "holds": ["cuda-toolkit-12-8"],
        "nvcc": "/usr/local/cuda-12.8/bin/nvcc",
        "repository": nvidia_repo(dist, "cuda_repo_key_fingerprints"),
    }


# --- The inventory's real GPU rigs: their own variables, resolved by the roles, on the two paths they can take ---
RIG_PLAYBOOK = REPO / "tests/unit/playbooks/rig_nvidia_plan.yml"
NVIDIA_ROLES = ("nvidia_driver", "nvidia_container_toolkit", "cuda")
RIG_DRIVER_VERSION = (
    V535  # host_vars: branch 535, Debian 12's non-free line; CUDA 12.2 (the image's runtime) needs >= 535
)
# (facts, extra variables): Debian 12 as the rigs are set up, and Ubuntu 24.04 from NVIDIA's repository with the
# same pins (only the source changes).
RIG_PATHS = {
    "debian12-distro": ("debian12", {}),
    "ubuntu2404-nvidia": ("ubuntu2404", {"nvidia_driver_source": "nvidia"}),
}
RIG_DRIVER_EXPECTED = {
    # (path, rig): (flavour, packages, repositories); both rigs take the proprietary modules (branch 535's open
    # module refuses GeForce cards)
    ("debian12-distro", "desktop3050"): (
        "full",
        pinned(RIG_DRIVER_VERSION, "nvidia-driver", "nvidia-kernel-dkms"),
        debian_sources("bookworm"),
    ),
    ("debian12-distro", "laptop1650ti"): (
        "headless",
        pinned(RIG_DRIVER_VERSION, "nvidia-smi", "libcuda1", "nvidia-kernel-dkms"),
        debian_sources("bookworm"),
    ),
    ("ubuntu2404-nvidia", "desktop3050"): (
        "full",
        pinned(RIG_DRIVER_VERSION, "cuda-drivers-535"),
        [nvidia_repo("ubuntu2404")],
    ),
    ("ubuntu2404-nvidia", "laptop1650ti"): (
        "headless",
        pinned(RIG_DRIVER_VERSION, "libnvidia-compute-535", "nvidia-dkms-535", "nvidia-utils-535"),
        [nvidia_repo("ubuntu2404")],
    ),
}
RIG_CUDA_EXPECTED = {
    "debian12-distro": {
        "source": "distro",
        "version": "11.8",
        "packages": ["nvidia-cuda-toolkit=11.8.89~11.8.0-*", "nvidia-cuda-toolkit-gcc=11.8.0-*"],
        "holds": ["nvidia-cuda-toolkit", "nvidia-cuda-toolkit-gcc"],
        "nvcc": "/usr/bin/nvcc",
        "repository": debian_nonfree("bookworm"),
    },
    "ubuntu2404-nvidia": {
        "source": "nvidia",
        "version": "12.8",
        "packages": ["cuda-toolkit-12-8"],
        "holds": ["cuda-toolkit-12-8"],
        "nvcc": "/usr/local/cuda-12.8/bin/nvcc",
        "repository": nvidia_repo("ubuntu2404", "cuda_repo_key_fingerprints"),
    },
}
UNATTENDED_BLACKLIST = [
    "^nvidia-",
    "^libnvidia-",
    "^libcuda1",
    "^libnvcuvid1",
    "^libnvoptix1",
    "^xserver-xorg-video-nvidia",
    "^firmware-nvidia-gsp",
    "^cuda-drivers",
]


@pytest.fixture(scope="module")
def rig_plans() -> dict[str, dict[str, dict[str, dict]]]:
    """{path: {rig: {role: plan}}} from the real inventory, every role setting checked against its argument spec."""

    def one(path: str) -> tuple[str, dict, str]:
        dist, extra = RIG_PATHS[path]
        result = run(
            [
                "ansible-playbook",
                "--check",
                "-e",
                json.dumps({"ansible_facts": FACTS[dist], **extra}),
                str(RIG_PLAYBOOK),
            ],
            ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        )
        if result.returncode != 0:
            return path, {}, result.output
        report = json.loads(result.output[result.output.index("{") :])
        plans: dict[str, dict[str, dict]] = {}
        for play in report["plays"]:
            for task in play["tasks"]:
                role, _, name = task["task"]["name"].partition(" : ")
                if name == "Show the resolved plan":
                    for rig, res in task["hosts"].items():
                        plans.setdefault(rig, {})[role] = res[f"__{role}_plan"]
        return path, plans, result.output

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(one, RIG_PATHS))
    out = {}
    for path, plans, output in results:
        assert sorted(plans) == ["desktop3050", "laptop1650ti"], output[-3000:]
        for rig, by_role in plans.items():
            assert sorted(by_role) == sorted(NVIDIA_ROLES), (rig, output[-3000:])
        out[path] = plans
    return out


@pytest.mark.parametrize(
    ("path", "rig"), sorted(RIG_DRIVER_EXPECTED), ids=["-".join(k) for k in sorted(RIG_DRIVER_EXPECTED)]
)
def test_rig_driver_plan(rig_plans, path, rig):
    flavour, packages, repository = RIG_DRIVER_EXPECTED[(path, rig)]
    plan = rig_plans[path][rig]["nvidia_driver"]
    assert plan["source"] == RIG_PATHS[path][1].get("nvidia_driver_source", "distro")
    assert plan["branch"] == "535"
    assert plan["flavour"] == flavour  # desktop3050 drives its display; laptop1650ti is compute only
    assert plan["packages"] == packages
    assert plan["repositories"] == repository
    assert plan["apt_pin"] == f"{RIG_DRIVER_VERSION}-*"
    # Every package of the plan is held once installed, and kept off unattended-upgrades.
    hold = re.compile(plan["hold_regex"].strip())
    for name in (package.split("=")[0] for package in packages):
        assert hold.match(name), name
    assert plan["unattended_blacklist"] == UNATTENDED_BLACKLIST


@pytest.mark.parametrize("path", sorted(RIG_PATHS))
@pytest.mark.parametrize("rig", ["desktop3050", "laptop1650ti"])
def test_rig_toolkit_and_cuda_plans(rig_plans, path, rig):
    toolkit = rig_plans[path][rig]["nvidia_container_toolkit"]
    assert toolkit["packages"] == [f"{name}={TOOLKIT_VERSION}-*" for name in TOOLKIT_PACKAGES]
    assert toolkit["holds"] == TOOLKIT_PACKAGES
    assert toolkit["repository"]["uris"] == ["https://nvidia.github.io/libnvidia-container/stable/deb/amd64"]
    assert toolkit["repository"]["suites"] == ["/"]
    assert toolkit["repository"]["signed_by"] == "/etc/apt/keyrings/nvidia-container-toolkit.asc"
    assert toolkit["repository"]["key_url"] == "https://nvidia.github.io/libnvidia-container/gpgkey"
    assert toolkit["repository"]["key_fingerprints"] == [TOOLKIT_KEY_FINGERPRINT]
    assert toolkit["daemon_settings"] == {"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}
    # What the cuda role would install if the rig set rig_wants_cuda (it follows the driver's source).
    assert rig_plans[path][rig]["cuda"] == RIG_CUDA_EXPECTED[path]


@pytest.fixture(scope="module")
def inventory_hostvars() -> dict[str, dict]:
    result = run(["ansible-inventory", "--list"])
    assert result.returncode == 0, result.tail()
    return json.loads(result.output[result.output.index("{") :])["_meta"]["hostvars"]


def test_rig_settings_for_the_nvidia_roles(inventory_hostvars):
    for rig in ("desktop3050", "laptop1650ti"):
        hostvars = inventory_hostvars[rig]
        assert hostvars["rig_kind"] == "gpu"
        assert (hostvars["nvidia_driver_branch"], hostvars["nvidia_driver_version"]) == ("535", RIG_DRIVER_VERSION)
        assert hostvars["nvidia_driver_source"] == "distro"
        assert hostvars["nvidia_driver_reboot_allowed"] is True  # remote rigs; the role never reboots the controller
        assert hostvars["llama_server_gpu_access"] == "cdi"  # the container toolkit's CDI device
        assert hostvars["rig_wants_cuda"] is False  # the llama.cpp image brings its own CUDA
    for rig in ("sandbox", "sandbox-mtp"):
        assert inventory_hostvars[rig]["rig_kind"] == "sandbox"
        assert inventory_hostvars[rig]["llama_server_gpu_access"] == "none"


def test_provision_play_orders_the_nvidia_roles_with_gpu_conditions():
    plays = yaml.safe_load((REPO / "playbooks/provision.yml").read_text())
    play = next(play for play in plays if play.get("name") == "Provision the rigs, one at a time")
    assert play["hosts"] == "rigs:!rigs_in_sync"  # the fast path's group_by leaves the rigs in sync out
    # rolling: one rig at a time, stop at the first failed rig; in check mode (make check) every rig at once
    serial = jinja2.Template(str(play["serial"]))
    assert serial.render(ansible_check_mode=False) == "1" and serial.render(ansible_check_mode=True) == "0"
    assert play["max_fail_percentage"] == 0
    assert [(entry["role"], entry.get("when")) for entry in play["roles"]] == [
        ("rig_power", "rig_kind == 'gpu'"),  # first: a laptop must not sleep through the reboot or the build
        ("nvidia_driver", "rig_kind == 'gpu'"),  # before Docker: it may reboot the rig
        ("docker", None),
        ("nvidia_container_toolkit", "rig_kind == 'gpu'"),  # after docker: notifies its handler
        ("cuda", "rig_kind == 'gpu' and rig_wants_cuda | default(false) | bool"),
        ("llamacpp_image", None),
        ("llama_server", None),
        ("node_exporter", None),  # the fleet monitor's view of the rig and its GPU
        ("rig_lock", None),  # records what the rig runs once it is healthy
    ]
