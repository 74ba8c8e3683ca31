"""Heavy proofs run by their make target, not by make test: here each receipt is checked against the tree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rigkit import proofs
from tests.support import copy_proof_inputs, molecule_scenarios

DKMS = proofs.proof("nvidia-driver-dkms-debian12")
CUDA_IMAGE = proofs.proof("cuda-image-sm86")


@pytest.mark.parametrize("item", proofs.PROOFS, ids=[item.name for item in proofs.PROOFS])
def test_every_proof_has_a_passing_receipt_made_from_the_current_inputs(item):
    problem = proofs.receipt_problem(item)
    assert problem is None, problem


@pytest.mark.parametrize("item", proofs.PROOFS, ids=[item.name for item in proofs.PROOFS])
def test_a_receipt_records_what_a_reader_needs(item):
    assert item.receipt.is_file(), proofs.receipt_problem(item)
    receipt = json.loads(item.receipt.read_text())
    assert receipt["make_target"] == item.make_target and receipt["wall_s"] > 0
    assert len(receipt["decisive_lines"]) >= item.decisive_min, receipt["decisive_lines"]
    assert receipt["machine"]["cpus"] and receipt["machine"]["kernel"], receipt["machine"]


def write_receipt(item: proofs.Proof, root: Path, **changes) -> None:
    inputs = proofs.input_digests(item, root)
    receipt = {"result": "passed", "inputs_digest": proofs.digest_of(inputs), "inputs": inputs, **changes}
    (root / "reports" / "proofs" / f"{item.name}.json").write_text(json.dumps(receipt))


def test_the_dkms_proofs_inputs_are_the_role_its_scenario_and_the_code_it_runs():
    files = proofs.input_files(DKMS)
    assert "roles/nvidia_driver/molecule/dkms/molecule.yml" in files
    assert "roles/nvidia_driver/vars/Debian.yml" in files
    # found by reading the role: the module its tasks call, the filters its tasks use, what those import
    assert "library/nvidia_kernel_modules.py" in files and "module_utils/nvidia_kernels.py" in files
    assert "filter_plugins/nvidia_driver.py" in files and "module_utils/nvidia_compat.py" in files
    assert "docker/rig/Dockerfile" in files
    # what does not shape it: the role's other scenarios, its README, other roles' code
    assert "roles/nvidia_driver/molecule/default/molecule.yml" not in files
    assert not any(name.endswith(".md") for name in files)
    assert "library/gguf_fetch.py" not in files and "module_utils/fetch/http.py" not in files


def test_each_debian_releases_dkms_proof_has_its_own_scenario_and_rig_image():
    trixie = proofs.input_files(proofs.proof("nvidia-driver-dkms-debian13"))
    assert {
        "roles/nvidia_driver/molecule/dkms-trixie/molecule.yml",
        "roles/nvidia_driver/molecule/dkms-trixie/create.yml",
        "playbooks/molecule/create.yml",
        "roles/container_harness/defaults/main.yml",
    } <= set(trixie)
    assert not any("/molecule/dkms/" in name for name in trixie)
    assert not any("/molecule/dkms-trixie/" in name for name in proofs.input_files(DKMS))


def test_the_code_closure_follows_imports_into_module_utils_packages(tmp_path):
    """``from ansible.module_utils.pkg.mod import x`` counts pkg/__init__.py and pkg/mod.py, and what mod imports."""
    (tmp_path / "library").mkdir()
    (tmp_path / "filter_plugins").mkdir()
    package = tmp_path / "module_utils" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text("from ansible.module_utils.plain import y\n")
    (tmp_path / "module_utils" / "plain.py").write_text("y = 1\n")
    (tmp_path / "module_utils" / "unused.py").write_text("z = 1\n")
    role = tmp_path / "roles" / "r" / "files"
    role.mkdir(parents=True)
    (role / "script.py").write_text("from ansible.module_utils.pkg.mod import x\n")
    assert proofs._code_closure(tmp_path, ["roles/r/files/script.py"]) == {
        "module_utils/pkg/__init__.py",
        "module_utils/pkg/mod.py",
        "module_utils/plain.py",
    }


def test_changing_a_pinned_input_makes_the_receipt_stale_and_names_the_target(tmp_path):
    copy_proof_inputs(DKMS, tmp_path)
    write_receipt(DKMS, tmp_path)
    assert proofs.receipt_problem(DKMS, tmp_path) is None

    scenario = tmp_path / "roles/nvidia_driver/molecule/dkms/molecule.yml"
    scenario.write_text(scenario.read_text().replace('"535.309.01"', '"535.309.02"'))
    problem = proofs.receipt_problem(DKMS, tmp_path)
    assert problem and "roles/nvidia_driver/molecule/dkms/molecule.yml" in problem
    assert "make proof-nvidia-driver-dkms-debian12" in problem


def test_the_cuda_image_receipt_follows_the_package_pins_the_dockerfile_and_the_role(tmp_path):
    files = proofs.input_files(CUDA_IMAGE)
    assert {"docker/Dockerfile", "playbooks/image.yml", "filter_plugins/llamacpp_image.py"} <= set(files)
    assert "module_utils/cuda_compat.py" in files and "inventory/group_vars/gpu_rigs.yml" in files
    assert "roles/llamacpp_image/defaults/main.yml" in files and "tests/proofs/test_cuda_image.py" in files
    copy_proof_inputs(CUDA_IMAGE, tmp_path)
    write_receipt(CUDA_IMAGE, tmp_path)
    assert proofs.receipt_problem(CUDA_IMAGE, tmp_path) is None
    defaults = tmp_path / "roles/llamacpp_image/defaults/main.yml"
    defaults.write_text(
        defaults.read_text().replace("libcudart12: 12.4.127~12.4.1-2", "libcudart12: 12.4.127~12.4.1-3")
    )
    problem = proofs.receipt_problem(CUDA_IMAGE, tmp_path)
    assert problem and "roles/llamacpp_image/defaults/main.yml" in problem and "make proof-cuda-image-sm86" in problem


def test_a_change_to_shared_code_the_role_imports_makes_the_receipt_stale(tmp_path):
    copy_proof_inputs(DKMS, tmp_path)
    write_receipt(DKMS, tmp_path)
    shared = tmp_path / "module_utils/nvidia_kernels.py"
    shared.write_text(shared.read_text() + "\n# changed\n")
    assert "module_utils/nvidia_kernels.py changed" in proofs.receipt_problem(DKMS, tmp_path)
    # a module_utils file the role never imports does not
    write_receipt(DKMS, tmp_path)
    other = tmp_path / "module_utils/fetch/http.py"
    other.write_text(other.read_text() + "\n# changed\n")
    assert proofs.receipt_problem(DKMS, tmp_path) is None


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"result": "failed"}, "records a failed proof"),
        ({"inputs": {}}, "was made from other inputs"),
        ({"inputs_digest": "0" * 64}, "was made from other inputs"),
    ],
)
def test_a_failed_or_forged_receipt_is_refused(tmp_path, changes, expected):
    copy_proof_inputs(DKMS, tmp_path)
    write_receipt(DKMS, tmp_path, **changes)
    problem = proofs.receipt_problem(DKMS, tmp_path)
    assert problem and expected in problem and DKMS.make_target in problem


def test_a_missing_or_unreadable_receipt_names_the_target(tmp_path):
    copy_proof_inputs(DKMS, tmp_path)
    assert "is missing: run `make proof-nvidia-driver-dkms-debian12`" in proofs.receipt_problem(DKMS, tmp_path)
    (tmp_path / "reports/proofs" / f"{DKMS.name}.json").write_text("{not json")
    assert "cannot be read" in proofs.receipt_problem(DKMS, tmp_path)


def test_proof_scenarios_are_left_out_of_make_tests_molecule_runs():
    scenarios = molecule_scenarios()
    # the DKMS builds and the GPU rigs' package installs run by their make targets
    for role, scenario in (
        ("nvidia_driver", "dkms"),
        ("nvidia_driver", "dkms-trixie"),
        ("nvidia_driver", "default"),
        ("cuda", "default"),
    ):
        assert (role, scenario) in proofs.PROOF_SCENARIOS
        assert (role, scenario) not in scenarios
    # the scenarios that install no GPU package stay in make test
    for role in ("docker", "models", "llama_server", "nvidia_container_toolkit"):
        assert (role, "default") in scenarios


def _toy(steps: tuple[tuple[str, ...], ...], readback: tuple[str, ...], decisive_min: int = 2) -> proofs.Proof:
    """A proof of real commands whose only input is rigkit/proofs.py."""
    return proofs.Proof(
        name="toy",
        summary="a toy proof",
        steps=tuple(proofs.Step(argv) for argv in steps),
        readback=proofs.Step(readback),
        decisive=r"^ok: ",
        decisive_min=decisive_min,
        inputs=("rigkit/proofs.py",),
        roles=(),
    )


@pytest.fixture
def receipts_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(proofs, "RECEIPTS", tmp_path / "receipts")
    return tmp_path


def test_run_proof_writes_passed_only_when_every_step_passed_and_the_lines_are_read_back(receipts_dir):
    item = _toy((("true",),), ("printf", "ok: one\\nnoise\\nok: two\\n"))
    receipt = proofs.run_proof(item, receipts_dir / "logs")
    assert receipt["result"] == "passed" and receipt["decisive_lines"] == ["ok: one", "ok: two"]
    assert json.loads(item.receipt.read_text())["result"] == "passed"
    assert "ok: two" in (receipts_dir / "logs" / "proof-toy.log").read_text()


def test_run_proof_records_a_failing_step_and_never_reads_back(receipts_dir):
    item = _toy((("true",), ("false",), ("true",)), ("printf", "ok: one\\nok: two\\n"))
    receipt = proofs.run_proof(item, receipts_dir / "logs")
    assert receipt["result"] == "failed" and receipt["failed_step"] == "false"
    assert receipt["decisive_lines"] == []


@pytest.mark.parametrize(
    "readback",
    [
        ("printf", "nothing the pattern knows\\n"),  # the pattern matches nothing
        ("printf", "ok: only one\\n"),  # fewer decisive lines than the minimum
        ("sh", "-c", "echo 'ok: one'; echo 'ok: two'; exit 3"),  # the readback itself failed
    ],
)
def test_run_proof_fails_a_readback_that_does_not_prove_the_claim(receipts_dir, readback):
    receipt = proofs.run_proof(_toy((("true",),), readback), receipts_dir / "logs")
    assert receipt["result"] == "failed" and receipt["failed_step"] == " ".join(readback)
