"""The compatibility rules (module_utils/cuda_compat.py) and `make plan`: driver, CUDA, GPU and kernels."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from ansible.module_utils.cuda_compat import (
    CUDA_MIN_DRIVER,
    arch_problem,
    branch_problem,
    cuda_objects,
    cuda_version_of_package,
    default_architectures,
    flavour_problem,
    minor_compat_problem,
    runs_on_gpu_problem,
)

from rigkit import REPO, proofs
from rigkit.validation.compat import ROLES, compat_findings, known_good_kernels, plan_lines
from rigkit.validation.rules import role_defaults
from tests.fixtures.debian_archive import StandInArchive, publish_bookworm, publish_trixie_cuda
from tests.support import copy_proof_inputs, recap, run, seed_values

CUDA_1241 = (12, 4, 1)


def test_the_image_cuda_is_read_from_the_pinned_runtime_package():
    runtime = role_defaults(*ROLES)["llamacpp_image_cuda_runtime_packages"]
    assert cuda_version_of_package(runtime["libcudart12"]) == CUDA_1241
    assert cuda_version_of_package("12.4.5.8~12.4.1-2") == CUDA_1241
    assert cuda_version_of_package("12.4.127") is None


@pytest.mark.parametrize(
    ("architectures", "sass", "ptx"),
    [
        ("86-real", ["sm_86"], []),
        ("75-real;86-real", ["sm_75", "sm_86"], []),
        ("86", ["sm_86"], ["compute_86"]),
        ("86-virtual", [], ["compute_86"]),
        ("90a-real", ["sm_90a"], []),
    ],
)
def test_the_architectures_name_the_code_cuobjdump_must_find(architectures, sass, ptx):
    assert cuda_objects(architectures) == {"sass": sass, "ptx": ptx}
    assert default_architectures("8.6") == "86-real" and default_architectures("") == ""


def test_an_architecture_that_is_not_one_is_refused():
    with pytest.raises(ValueError, match="'native' is not a CUDA architecture"):
        cuda_objects("native")


@pytest.mark.parametrize(
    ("architectures", "capability", "version", "problem"),
    [
        ("86-real", (8, 6), "535.309.01", None),  # SASS: minor-version compatibility, any 12.x driver
        ("80-real", (8, 6), "535.309.01", None),  # Ampere's sm_80 code runs on 8.6 (same major, lower minor)
        ("75-real;86-real", (7, 5), "535.309.01", None),
        ("86-real", (7, 5), "550.163.01", "compiled code for sm_86 and no PTX a compute capability 7.5 GPU can use"),
        ("86-real", (9, 0), "580.95.05", "add 90-real to llamacpp_image_cuda_architectures"),
        ("75-virtual", (8, 6), "535.309.01", "PTX from CUDA 12.4.1 needs driver 550.54.15 or newer"),
        ("75-virtual", (8, 6), "550.163.01", None),  # 550 knows CUDA 12.4: it JITs the PTX
        ("86", (9, 0), "535.309.01", "would run the image's PTX (compute_86) only"),
    ],
)
def test_a_gpu_runs_the_image_through_its_own_sass_or_ptx_its_driver_can_jit(
    architectures, capability, version, problem
):
    found = runs_on_gpu_problem(cuda_objects(architectures), capability, CUDA_1241, version.split(".")[0], version)
    assert found == problem if problem is None else problem in found


def test_compiled_code_runs_on_any_driver_of_minor_version_compatibility():
    assert minor_compat_problem(CUDA_1241, "535", "535.309.01") is None
    assert minor_compat_problem(CUDA_1241, "525", "525.60.13") is None
    assert "runs on driver 525.60.13 or newer" in minor_compat_problem(CUDA_1241, "520", "520.61.05")
    assert "runs on driver 580.65.06 or newer" in minor_compat_problem((13, 0, 2), "550", "")


def test_ptx_of_a_cuda_release_the_table_does_not_know_says_where_to_add_it():
    assert "CUDA_MIN_DRIVER" in runs_on_gpu_problem(cuda_objects("86-virtual"), (8, 6), (12, 7, 0), "580", "580.95.05")
    assert all(version.count(".") >= 1 for version in CUDA_MIN_DRIVER.values())


@pytest.mark.parametrize(
    ("capability", "problem"),
    [
        ((7, 5), None),
        ((8, 6), None),
        ((9, 0), None),
        ((12, 0), "compiles for compute capability 9.0 at most, not 12.0: use a CUDA 12.8 toolchain or newer"),
        ((3, 7), "no longer compiles for compute capability 3.7"),
    ],
)
def test_the_images_cuda_must_compile_for_the_gpu(capability, problem):
    found = arch_problem(CUDA_1241, capability)
    assert found == problem if problem is None else problem in found
    assert arch_problem((12, 8, 1), (12, 0)) is None


@pytest.mark.parametrize(
    ("branch", "capability", "problem"),
    [
        ("535", (7, 5), None),
        ("535", (8, 6), None),
        ("450", (8, 6), "Ampere (GA10x) GPUs (compute capability 8.6) need driver branch 455 or newer"),
        ("550", (12, 0), "need driver branch 570 or newer"),
        ("590", (6, 1), "Maxwell, Pascal and Volta GPUs (compute capability 6.1) end with driver branch 580"),
        ("535", (3, 5), "Kepler GPUs (compute capability 3.5) end with driver branch 470"),
        ("470", (3, 5), None),
    ],
)
def test_the_driver_branch_must_support_the_gpu(branch, capability, problem):
    found = branch_problem(branch, capability)
    assert found == problem if problem is None else problem in found


def test_blackwell_runs_on_the_open_modules_only():
    assert "open kernel modules only" in flavour_problem("proprietary", (12, 0))
    assert flavour_problem("open", (12, 0)) is None and flavour_problem("proprietary", (8, 6)) is None


@pytest.mark.parametrize("host", ["desktop3050", "laptop1650ti"])
def test_the_seed_rigs_pins_are_consistent(host):
    assert compat_findings(seed_values(host)) == []


def test_known_good_kernels_come_from_the_dkms_receipt(tmp_path: Path):
    item = proofs.proof("nvidia-driver-dkms-debian12")
    copy_proof_inputs(item, tmp_path)
    inputs = proofs.input_digests(item, tmp_path)
    receipt = {
        "result": "passed",
        "inputs_digest": proofs.digest_of(inputs),
        "inputs": inputs,
        "decisive_lines": [
            "nvidia-current/535.309.01, 6.1.0-47-amd64, x86_64: installed",
            "nvidia-current/535.309.01, 6.1.0-57-amd64, x86_64: installed",
        ],
    }
    (tmp_path / "reports/proofs" / f"{item.name}.json").write_text(json.dumps(receipt))
    found = known_good_kernels(tmp_path)
    assert found["535.309.01"]["kernels"] == ["6.1.0-47-amd64", "6.1.0-57-amd64"] and found["535.309.01"]["valid"]
    lines = plan_lines("desktop3050", seed_values("desktop3050"), tmp_path)
    assert any("DKMS built 535.309.01 for 6.1.0-47-amd64, 6.1.0-57-amd64" in line for line in lines), lines
    # a receipt made from other inputs is shown as stale, with the target that renews it
    (tmp_path / "roles/nvidia_driver/vars/Debian.yml").write_text("# changed\n")
    lines = plan_lines("desktop3050", seed_values("desktop3050"), tmp_path)
    assert any("receipt stale: make proof-nvidia-driver-dkms-debian12" in line for line in lines), lines


@pytest.fixture
def archive_env(tmp_path: Path) -> Iterator[tuple[dict[str, str], object]]:
    """`make plan`'s environment pointing at a stand-in Debian archive (never the real one), and the stand-in."""
    archive = StandInArchive()
    env = {
        "RIGKIT_DEBIAN_MIRROR": archive.url("debian"),
        "RIGKIT_DEBIAN_SECURITY_MIRROR": archive.url("debian-security"),
        "RIGKIT_CACHE_DIR": str(tmp_path / "cache"),
        "RIGKIT_DEBIAN_KEYRING": str(archive.keyring),
    }
    yield env, archive
    archive.stop()


def test_make_plan_prints_the_plan_and_exits_1_on_a_refused_pin(archive_env):
    env, archive = archive_env
    publish_bookworm(archive)
    result = run(["make", "--no-print-directory", "plan", "host=laptop1650ti"], **env)
    assert result.returncode == 0, result.tail()
    for text in (
        "laptop1650ti: NVIDIA GeForce GTX 1650 Ti, compute capability 7.5",
        "CUDA 12.4.1 runtime (Debian's libcudart12 12.4.127~12.4.1-2): its compiled code runs on driver 525.60.13 or "
        "newer -> ok",
        "driver    535.309.01, proprietary kernel modules",
        "modules   proprietary: ok",
        "archive   Debian bookworm, the release whose non-free archive carries branch 535",
        "nvidia-smi 535.309.01-0+deb12u1 (bookworm-security/non-free) -> ok",
        "next kernel  linux-image-amd64 6.1.192-3 (bookworm-security/main) installs 6.1.0-57-amd64 -> ok",
    ):
        assert text in result.output, result.output
    assert archive.requests, "the plan read the stand-in archive"


def test_the_plans_compile_row_reads_the_code_the_receipt_found_in_the_built_image():
    lines = plan_lines("desktop3050", seed_values("desktop3050"))
    assert "  compile   86-real -> sm_86; built: sm_86 (reports/proofs/cuda-image-sm86.json) -> ok" in lines, lines


def test_make_plan_exits_1_on_a_pin_the_archive_dropped(archive_env):
    env, archive = archive_env
    publish_bookworm(archive, driver=("535.320.01-0+deb12u1",))
    result = run(["make", "--no-print-directory", "plan", "host=laptop1650ti"], **env)
    assert result.returncode != 0, result.output
    assert (
        "rigkit plan: laptop1650ti: nvidia_driver_version is '535.309.01': Debian's archive no longer carries "
        "nvidia-smi, libcuda1, nvidia-kernel-dkms at 535.309.01 (branch 535's newest there is 535.320.01): set "
        'nvidia_driver_version: "535.320.01" in inventory/host_vars/laptop1650ti.yml' in result.output
    ), result.output


def test_make_check_refuses_a_pin_the_archive_dropped_before_any_rig_is_contacted(archive_env):
    """The validation play reads the same cached indexes: the dropped pin is refused, naming the version to move
    to, and the play stops before the fast path's first contact with the rig."""
    env, archive = archive_env
    publish_bookworm(archive, driver=("535.320.01-0+deb12u1",))
    result = run(["make", "--no-print-directory", "check", "host=laptop1650ti"], **env)
    assert result.returncode != 0, result.tail()
    text = " ".join(result.output.split())
    assert (
        'inventory/host_vars/laptop1650ti.yml: nvidia_driver_version is "535.309.01"; Debian\'s archive no longer '
        "carries nvidia-smi, libcuda1, nvidia-kernel-dkms at 535.309.01 (branch 535's newest there is 535.320.01)"
    ) in text, result.tail()
    assert "Compare the rig with" not in result.output and "UNREACHABLE" not in result.output
    publish_bookworm(archive)
    fresh = {**env, "RIGKIT_CACHE_DIR": env["RIGKIT_CACHE_DIR"] + "-fresh"}  # the cached indexes are 6 h fresh
    accepted = run(["make", "--no-print-directory", "check", "host=laptop1650ti"], **fresh)
    assert "archive no longer carries" not in accepted.output, accepted.tail()


def test_make_plan_exits_1_naming_the_refused_pin(tmp_path: Path, archive_env):
    env, _ = archive_env
    inventory = tmp_path / "inventory"
    shutil.copytree(REPO / "inventory", inventory, ignore=shutil.ignore_patterns("rigs.lock.json"))
    host_file = inventory / "host_vars" / "laptop1650ti.yml"
    text = host_file.read_text().replace('nvidia_driver_branch: "535"', 'nvidia_driver_branch: "520"')
    host_file.write_text(text.replace('nvidia_driver_version: "535.309.01"', 'nvidia_driver_version: "520.61.05"'))
    result = run(
        ["make", "--no-print-directory", "plan", "host=laptop1650ti"],
        ANSIBLE_INVENTORY=str(inventory / "hosts.yml"),
        **env,
    )
    assert result.returncode != 0
    assert "or newer -> refused: CUDA 12.4.1 (the image's runtime) runs on driver 525.60.13" in result.output
    assert (
        "rigkit plan: laptop1650ti: nvidia_driver_version is '520.61.05': CUDA 12.4.1 (the image's runtime) runs on "
        "driver 525.60.13 or newer" in result.output
    ), result.output


def test_a_debian_13_rig_with_debian_12s_pin_is_refused_before_contact_naming_the_pin(tmp_path: Path, archive_env):
    """The laptop upgraded to Debian 13 (rig_os: debian13, as make discover writes it) still carries Debian 12's 535
    pin: make plan and the validation refuse it, naming the pin its release packages; before, both passed and the
    rig's apt stopped the run."""
    env, _ = archive_env
    inventory = tmp_path / "inventory"
    shutil.copytree(REPO / "inventory", inventory, ignore=shutil.ignore_patterns("rigs.lock.json"))
    host_file = inventory / "host_vars" / "laptop1650ti.yml"
    host_file.write_text(host_file.read_text() + "rig_os: debian13\n")
    wanted = (
        "nvidia_driver_branch is '535': the rig runs debian13 (rig_os), whose archive packages branch 550, not 535 "
        '(Debian 13\'s non-free (the 550 whose module builds on 6.12.118)): set nvidia_driver_branch: "550" and '
        'nvidia_driver_version: "550.163.01"'
    )
    planned = run(
        ["make", "--no-print-directory", "plan", "host=laptop1650ti"],
        ANSIBLE_INVENTORY=str(inventory / "hosts.yml"),
        **env,
    )
    assert planned.returncode != 0 and f"rigkit plan: laptop1650ti: {wanted}" in planned.output, planned.output
    checked = run(
        [
            "make",
            "--no-print-directory",
            "check",
            "host=laptop1650ti",
            "ARGS=-e ansible_host=127.0.0.1 -e ansible_port=1",
        ],
        ANSIBLE_INVENTORY=str(inventory / "hosts.yml"),
        **env,
    )
    assert checked.returncode != 0 and "inventory/host_vars/laptop1650ti.yml: nvidia_driver_branch is" in checked.output
    assert (
        "the rig runs debian13 (rig_os)" in checked.output and recap(checked.output)["laptop1650ti"]["unreachable"] == 0
    )
    host_file.write_text(
        host_file.read_text()
        .replace('nvidia_driver_branch: "535"', 'nvidia_driver_branch: "550"')
        .replace('nvidia_driver_version: "535.309.01"', 'nvidia_driver_version: "550.163.01"')
    )
    fixed = run(
        ["make", "--no-print-directory", "plan", "host=laptop1650ti"],
        ANSIBLE_INVENTORY=str(inventory / "hosts.yml"),
        **env,
    )
    assert (
        "the rig runs debian13" not in fixed.output and "Debian 13 (trixie), the rig's release (rig_os)" in fixed.output
    )


def test_make_plan_names_an_image_pin_the_archive_dropped_and_the_version_to_move_to(archive_env):
    env, archive = archive_env
    publish_bookworm(archive)
    defaults = role_defaults(*ROLES)
    pins = {**defaults["llamacpp_image_cuda_toolchain_packages"], **defaults["llamacpp_image_cuda_runtime_packages"]}
    publish_trixie_cuda(archive, {**pins, "libcudart12": "12.4.127~12.4.1-3"})
    result = run(["make", "--no-print-directory", "plan", "host=desktop3050"], **env)
    assert result.returncode != 0, result.output
    assert "nvidia-cuda-toolkit 12.4.131~12.4.1-2 (trixie/non-free) -> ok" in result.output, result.output
    assert "libcudart12=12.4.127~12.4.1-2: not in trixie -> refused" in result.output, result.output
    assert (
        "rigkit plan: desktop3050: llamacpp_image_cuda_runtime_packages is 'libcudart12=12.4.127~12.4.1-2': Debian's "
        "archive no longer carries libcudart12 12.4.127~12.4.1-2 (trixie carries 12.4.127~12.4.1-3 now): set "
        'libcudart12: "12.4.127~12.4.1-3" under llamacpp_image_cuda_runtime_packages in '
        "inventory/group_vars/gpu_rigs.yml"
    ) in result.output, result.output
    publish_trixie_cuda(archive, pins)
    fresh = {**env, "RIGKIT_CACHE_DIR": env["RIGKIT_CACHE_DIR"] + "-fresh"}
    accepted = run(["make", "--no-print-directory", "plan", "host=desktop3050"], **fresh)
    assert accepted.returncode == 0 and "libcudart12 12.4.127~12.4.1-2 (trixie/non-free) -> ok" in accepted.output


@pytest.mark.parametrize("host", ["desktop3050", "laptop1650ti"])
def test_every_seed_rigs_exact_driver_pin_is_proven_by_a_valid_dkms_receipt(host):
    from rigkit.validation.compat import unproven_pin_findings

    assert unproven_pin_findings(host, seed_values(host)) == []


def test_make_plan_refuses_a_driver_pin_no_receipt_proves(tmp_path: Path):
    from rigkit.validation.compat import unproven_pin_findings

    values = {**seed_values("laptop1650ti"), "nvidia_driver_version": "535.320.01"}
    ((variable, value, why),) = unproven_pin_findings("laptop1650ti", values)
    assert (variable, value) == ("nvidia_driver_version", "535.320.01")
    assert why.startswith("no DKMS receipt built 535.320.01: prove it (make proof-nvidia-driver-dkms-debian12")
    assert any("no DKMS proof for 535.320.01 -> refused" in line for line in plan_lines("laptop1650ti", values))
    # a receipt made from other inputs proves nothing either
    item = proofs.proof("nvidia-driver-dkms-debian12")
    copy_proof_inputs(item, tmp_path)
    (tmp_path / "reports/proofs" / f"{item.name}.json").write_text(
        json.dumps(
            {
                "result": "passed",
                "inputs_digest": "0" * 64,
                "inputs": {},
                "decisive_lines": ["nvidia-current/535.309.01, 6.1.0-57-amd64, x86_64: installed"],
            }
        )
    )
    ((_, _, why),) = unproven_pin_findings("laptop1650ti", seed_values("laptop1650ti"), tmp_path)
    assert "was made from other inputs: run make proof-nvidia-driver-dkms-debian12" in why


# --- CDI needs an engine that runs it ------------------------------------------------------------------------
def gpu_rig(**override: object) -> dict:
    return {**role_defaults(*ROLES), **seed_values("desktop3050"), **override}


@pytest.mark.parametrize(
    ("override", "variable", "words"),
    [
        ({"rig_os": "debian12", "docker_source": "debian"}, "docker_source", "Docker 20.10, Debian 12's docker.io"),
        ({"docker_version": "24.0.7"}, "docker_version", "Set docker_version to 28.2 or newer"),
        ({"rig_os": "debian13", "docker_source": "debian"}, "docker_daemon_options", "Docker 26.1, Debian 13's"),
        ({"docker_version": "28.1.1"}, "docker_daemon_options", "Add features: {cdi: true} to docker_daemon_options"),
    ],
)
def test_an_engine_that_cannot_run_cdi_devices_is_refused(override: dict, variable: str, words: str) -> None:
    refused = [found for found in compat_findings(gpu_rig(**override)) if found[0] == variable]
    assert len(refused) == 1 and words in refused[0][2], refused
    assert 'could not select device driver "cdi" with capabilities: []' in refused[0][2]


@pytest.mark.parametrize(
    "override",
    [
        {},  # Docker's own 28.5.2, the gpu_rigs default
        {"docker_version": "28.2.0"},
        {"rig_os": "debian13", "docker_source": "debian", "docker_daemon_options": {"features": {"cdi": True}}},
        {"rig_os": "debian12", "docker_source": "debian", "llama_server_gpu_access": "none"},
        {"docker_source": "debian"},  # no rig_os: which docker.io is not known here; the rig's run says
    ],
)
def test_an_engine_that_runs_cdi_devices_or_a_rig_without_them_passes(override: dict) -> None:
    assert not [found for found in compat_findings(gpu_rig(**override)) if found[0].startswith("docker_")]


def test_a_debian_12_rig_on_debians_docker_is_refused_before_contact(tmp_path: Path, archive_env) -> None:
    env, _ = archive_env
    inventory = tmp_path / "inventory"
    shutil.copytree(REPO / "inventory", inventory, ignore=shutil.ignore_patterns("rigs.lock.json"))
    host_file = inventory / "host_vars" / "desktop3050.yml"
    host_file.write_text(host_file.read_text() + "rig_os: debian12\ndocker_source: debian\n")
    checked = run(
        [
            "make",
            "--no-print-directory",
            "check",
            "host=desktop3050",
            "ARGS=-e ansible_host=127.0.0.1 -e ansible_port=1",
        ],
        ANSIBLE_INVENTORY=str(inventory / "hosts.yml"),
        **env,
    )
    assert checked.returncode != 0
    assert 'inventory/host_vars/desktop3050.yml: docker_source is "debian"; Docker 20.10, Debian 12' in checked.output
    assert recap(checked.output)["desktop3050"]["unreachable"] == 0  # refused before any contact
