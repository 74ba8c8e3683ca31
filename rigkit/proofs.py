"""Heavy proofs and their receipts: checks too long for every test run, recorded with the inputs they ran on.

A proof (the DKMS builds of the pinned driver for real kernels, say) runs by its own `make` target and writes
``reports/proofs/<name>.json``: the sha256 of every input file that shapes it, the command, the machine, the wall
time, the result and the decisive lines read back from what it built. ``make test`` does not run the proof; it
recomputes the digest from the tree and fails, naming the target, when the receipt is missing, failed, or was
made from other inputs (tests/unit/test_proof_receipts.py).

A proof's inputs are its own files plus the code its roles run: the modules a role's tasks call (``library/``),
the filter plugins its templates use, and every ``module_utils`` file those import, found by reading them, so
that a change to shared code a proof depends on invalidates its receipt and nothing else does.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import platform
import re
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rigkit import REPO

RECEIPTS = REPO / "reports" / "proofs"
SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".cache"}
SKIPPED_SUFFIXES = (".md", ".pyc")
FILTER_USE_RE = re.compile(r"\|\s*([A-Za-z_][A-Za-z0-9_]*)")
MODULE_UTILS_IMPORT_RE = re.compile(r"^\s*from ansible\.module_utils\.([A-Za-z0-9_.]+) import", re.MULTILINE)


@dataclass(frozen=True)
class Step:
    """One command of a proof, run from ``cwd`` (relative to the repository)."""

    argv: tuple[str, ...]
    cwd: str = "."


@dataclass(frozen=True)
class Proof:
    name: str
    summary: str
    steps: tuple[Step, ...]
    # What the proof leaves behind to read its decisive lines from, and the lines that count.
    readback: Step
    decisive: str
    # How many decisive lines a passing proof must have read back.
    decisive_min: int
    # Files and directories (relative to the repository) that shape the proof, and roles whose code closure counts.
    inputs: tuple[str, ...]
    roles: tuple[str, ...]
    # Run after the readback whatever the result (removes what the proof made).
    cleanup: tuple[Step, ...] = field(default_factory=tuple)

    @property
    def make_target(self) -> str:
        return f"proof-{self.name}"

    @property
    def receipt(self) -> Path:
        return RECEIPTS / f"{self.name}.json"


HARNESS = Step(("ansible-playbook", "playbooks/harness.yml"))
RIG_IMAGE_INPUTS = ("docker/rig", "roles/container_harness", "playbooks/harness.yml", "playbooks/molecule")


def _cuda_image_proof(rig: str, arch: str) -> Proof:
    """The production llama.cpp image of one rig's architecture (tests/proofs/test_cuda_image.py)."""
    return Proof(
        name=f"cuda-image-sm{arch}",
        summary=(
            f"{rig}'s production llama.cpp image (make image's playbook, built on the controller) compiled for sm "
            f"{arch} from Debian trixie's CUDA 12.4 toolchain at the pinned versions; cuobjdump lists sm_{arch} "
            "compiled code and no PTX; ldd complete but for the driver's libcuda.so.1; with the Debian 12 rigs' "
            "libcuda.so.1 and no GPU it reports no CUDA device, serves the tiny MTP pair on the CPU and the offload "
            "check refuses it (tests/proofs/test_cuda_image.py)"
        ),
        steps=(
            HARNESS,
            Step(
                (
                    "env",
                    f"RIGKIT_CUDA_PROOF_RIG={rig}",
                    "pytest",
                    "-p",
                    "no:cacheprovider",
                    "tests/proofs/test_cuda_image.py",
                )
            ),
        ),
        readback=Step(("cat", f"reports/cuda/cuda-image-sm{arch}.txt")),
        decisive=r"^(build|production|sass|package|ldd|libcuda1|cuda|served|offload): ",
        decisive_min=15,
        inputs=(
            "docker/Dockerfile",
            "rigkit/sandbox/tiny_gemma4.py",
            "tests/proofs/test_cuda_image.py",
            "tests/integration/playbooks/image_inputs.yml",
            "playbooks/image.yml",
            "playbooks/validate.yml",
            "inventory/group_vars/gpu_rigs.yml",
            "inventory/group_vars/sandbox_rigs.yml",
            f"inventory/host_vars/{rig}.yml",
            "module_utils/gpu_offload.py",
            "module_utils/cuda_compat.py",
            "module_utils/nvidia_compat.py",
            *RIG_IMAGE_INPUTS,
            "requirements.txt",
            "ansible.cfg",
        ),
        roles=("llamacpp_image",),
    )


def _molecule_proof(
    role: str, scenario: str, container: str, summary: str, readback: tuple[str, ...], decisive: str, decisive_min: int
) -> Proof:
    """A role's Molecule scenario (converge, idempotence, testinfra verify) kept as a proof: its container stays up
    for the readback (``readback`` run in it), then goes."""
    return Proof(
        name=f"molecule-{role.replace('_', '-')}" + ("" if scenario == "default" else f"-{scenario}"),
        summary=f"{summary} (roles/{role}/molecule/{scenario})",
        steps=(
            HARNESS,
            # --destroy never skips test's own first destroy too: a proof stopped half-way would leave Molecule
            # believing its instance is there
            Step(("molecule", "destroy", "--scenario-name", scenario), f"roles/{role}"),
            Step(("molecule", "test", "--scenario-name", scenario, "--destroy", "never"), f"roles/{role}"),
        ),
        readback=Step(("docker", "exec", container, *readback)),
        decisive=decisive,
        decisive_min=decisive_min,
        inputs=(f"roles/{role}/molecule/{scenario}", *RIG_IMAGE_INPUTS, "requirements.txt", "ansible.cfg"),
        roles=(role,),
        cleanup=(Step(("molecule", "destroy", "--scenario-name", scenario), f"roles/{role}"),),
    )


def _dkms_proof(debian: str, scenario: str, container: str, what: str, kernels: int) -> Proof:
    """The pinned driver's module built by DKMS in one Debian release's Molecule scenario (roles/nvidia_driver)."""
    return replace(
        _molecule_proof(
            "nvidia_driver",
            scenario,
            container,
            what,
            ("dkms", "status"),
            r"^nvidia-current/\S+, \S+, \S+: installed$",
            kernels,
        ),
        name=f"nvidia-driver-dkms-debian{debian}",
    )


def _held_packages(*packages: str) -> tuple[str, ...]:
    """A readback of packages' versions and whether apt holds them: ``<package> <version> <hold|install>``."""
    return ("dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Want}\n", *packages)


PROOFS: tuple[Proof, ...] = (
    _dkms_proof(
        "12",
        "dkms",
        "rigkit-molecule-nvidia-dkms",
        "the pinned proprietary 535.309.01 module built and signed by DKMS for three Debian 12 kernels "
        "(bookworm-security's newest included) and rebuilt when lost",
        3,
    ),
    _dkms_proof(
        "13",
        "dkms-trixie",
        "rigkit-molecule-nvidia-dkms-trixie",
        "the pinned proprietary 550.163.01 module built and signed by DKMS for Debian 13's point-release kernel and "
        "trixie-security's newest, with apt modernize-sources' deb822 sources",
        2,
    ),
    # The laptop's sm 75 image (_cuda_image_proof("laptop1650ti", "75")) is not proven yet: its compile needs a
    # quiet hour of this machine's 2 cores.
    _cuda_image_proof("desktop3050", "86"),
    # The GPU rigs' package installs, hundreds of MB each from Debian's archive, that no sandbox rig runs.
    _molecule_proof(
        "nvidia_driver",
        "default",
        "rigkit-molecule-nvidia-driver",
        "the pinned 535.309.01 userspace (nvidia-smi, libcuda1, libnvidia-ml1) installed and held from an installer's "
        "apt sources on Debian 12, no kernel build in a container, both rigs' full install plans resolving to the pin",
        _held_packages("nvidia-smi", "libcuda1", "libnvidia-ml1"),
        r"^\S+ 535\.309\.01-\S+ hold$",
        3,
    ),
    _molecule_proof(
        "cuda",
        "default",
        "rigkit-molecule-cuda",
        "Debian 12's nvidia-cuda-toolkit 11.8 installed at the pin and held, nvcc compiling for sm_75 without a GPU",
        _held_packages("nvidia-cuda-toolkit"),
        r"^nvidia-cuda-toolkit 11\.8\.89~11\.8\.0-\S+ hold$",
        1,
    ),
)
# Molecule scenarios that are proofs: make test leaves them to their receipts.
PROOF_SCENARIOS = frozenset(
    (Path(step.cwd).name, step.argv[step.argv.index("--scenario-name") + 1])
    for proof in PROOFS
    for step in proof.steps
    if step.argv[:2] == ("molecule", "test")
)


def proof(name: str) -> Proof:
    for candidate in PROOFS:
        if candidate.name == name:
            return candidate
    known = ", ".join(candidate.name for candidate in PROOFS)
    raise KeyError(f"no proof named {name!r} (known: {known}); proofs are defined in rigkit/proofs.py")


def _files_under(root: Path, relative: str, skipped: frozenset[str] = frozenset()) -> Iterable[str]:
    path = root / relative
    if path.is_file():
        yield relative
        return
    for base, dirnames, filenames in os.walk(path):
        top = Path(base) == path
        dirnames[:] = sorted(name for name in dirnames if name not in SKIPPED_DIRS and not (top and name in skipped))
        for name in sorted(filenames):
            if not name.endswith(SKIPPED_SUFFIXES):
                yield str(Path(base, name).relative_to(root))


def _filter_names(source: str) -> set[str]:
    """The filter names a filter plugin's FilterModule.filters() returns (its dict literal's keys)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == "filters":
            for returned in ast.walk(node):
                if isinstance(returned, ast.Dict):
                    names.update(key.value for key in returned.keys if isinstance(key, ast.Constant))
    return names


def _module_utils_files(root: Path, dotted: str) -> list[str]:
    """The files of module_utils that ``ansible.module_utils.<dotted>`` loads: the module, or the package's
    ``__init__.py``, and the ``__init__.py`` of every package above it."""
    parts = dotted.split(".")
    candidates = [f"module_utils/{'/'.join(parts[:depth])}/__init__.py" for depth in range(1, len(parts) + 1)]
    candidates.append(f"module_utils/{'/'.join(parts)}.py")
    return [relative for relative in candidates if (root / relative).is_file()]


def _code_closure(root: Path, role_files: Sequence[str]) -> set[str]:
    """The library modules, filter plugins and module_utils files the given role files use."""
    text = "\n".join((root / path).read_text(errors="replace") for path in role_files if path.endswith((".yml", ".j2")))
    used: set[str] = set()
    for module in sorted((root / "library").glob("*.py")):
        if re.search(rf"^\s*-?\s*{re.escape(module.stem)}:\s*$", text, re.MULTILINE):
            used.add(str(module.relative_to(root)))
    filters_used = set(FILTER_USE_RE.findall(text))
    for plugin in sorted((root / "filter_plugins").glob("*.py")):
        if _filter_names(plugin.read_text()) & filters_used:
            used.add(str(plugin.relative_to(root)))
    pending = [root / path for path in used] + [root / path for path in role_files if path.endswith(".py")]
    while pending:
        for name in MODULE_UTILS_IMPORT_RE.findall(pending.pop().read_text(errors="replace")):
            for relative in _module_utils_files(root, name):
                if relative not in used:
                    used.add(relative)
                    pending.append(root / relative)
    return used


def input_files(item: Proof, root: Path = REPO) -> list[str]:
    files: set[str] = set()
    for relative in item.inputs:
        files.update(_files_under(root, relative))
    role_files: list[str] = []
    for role in item.roles:
        # a role's other Molecule scenarios do not shape this proof; its own scenario is among the inputs
        role_files.extend(_files_under(root, f"roles/{role}", frozenset({"molecule"})))
    files.update(role_files)
    files.update(_code_closure(root, role_files))
    return sorted(files)


def input_digests(item: Proof, root: Path = REPO) -> dict[str, str]:
    return {path: hashlib.sha256((root / path).read_bytes()).hexdigest() for path in input_files(item, root)}


def digest_of(files: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(dict(sorted(files.items())), separators=(",", ":")).encode()).hexdigest()


def receipt_problem(item: Proof, root: Path = REPO) -> str | None:
    """Why the tree has no valid receipt for this proof (None: the receipt passed on exactly these inputs)."""
    rerun = f"run `make {item.make_target}` (rigkit/proofs.py: {item.summary})"
    path = root / "reports" / "proofs" / f"{item.name}.json"
    if not path.is_file():
        return f"{path.relative_to(root)} is missing: {rerun}"
    try:
        receipt = json.loads(path.read_text())
        recorded = receipt["inputs"]
        result = receipt["result"]
    except (ValueError, KeyError, TypeError) as exc:
        return f"{path.relative_to(root)} cannot be read ({exc}): {rerun}"
    if result != "passed":
        return f"{path.relative_to(root)} records a {result} proof: fix it, then {rerun}"
    now = input_digests(item, root)
    if digest_of(now) != receipt.get("inputs_digest") or now != recorded:
        changed = sorted(name for name in now.keys() | recorded.keys() if now.get(name) != recorded.get(name))
        shown = ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
        return f"{path.relative_to(root)} was made from other inputs ({shown} changed since): {rerun}"
    return None


def _machine() -> dict[str, Any]:
    docker = subprocess.run(
        ["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True, check=False
    )
    return {
        "hostname": platform.node(),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "docker_server": docker.stdout.strip() or None,
    }


def _run_step(step: Step, log: Any, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    log.write(f"$ (cd {step.cwd} && {' '.join(step.argv)})\n")
    log.flush()
    done = subprocess.run(
        list(step.argv), cwd=REPO / step.cwd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    log.write(done.stdout)
    log.write(f"[exit {done.returncode}]\n")
    log.flush()
    return done


def run_proof(item: Proof, log_dir: Path, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run the proof, write its receipt and return it. The inputs are digested before the first step, so a tree
    edited while a proof runs yields a receipt that the check refuses."""
    inputs = input_digests(item)
    environment = dict(env if env is not None else os.environ)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"proof-{item.name}.log"
    started = datetime.now(UTC)
    clock = time.monotonic()
    failed_step: str | None = None
    decisive: list[str] = []
    with log_path.open("w") as log:
        try:
            for step in item.steps:
                if _run_step(step, log, environment).returncode != 0:
                    failed_step = " ".join(step.argv)
                    break
            if failed_step is None:
                read = _run_step(item.readback, log, environment)
                decisive = [line for line in read.stdout.splitlines() if re.search(item.decisive, line)]
                if read.returncode != 0 or len(decisive) < item.decisive_min:
                    failed_step = " ".join(item.readback.argv)
        finally:
            for step in item.cleanup:
                _run_step(step, log, environment)
    receipt = {
        "proof": item.name,
        "summary": item.summary,
        "make_target": item.make_target,
        "result": "passed" if failed_step is None else "failed",
        "failed_step": failed_step,
        "commands": [{"cwd": step.cwd, "argv": list(step.argv)} for step in item.steps],
        "readback": {"cwd": item.readback.cwd, "argv": list(item.readback.argv), "pattern": item.decisive},
        "decisive_lines": decisive,
        "started": started.isoformat(timespec="seconds"),
        "wall_s": round(time.monotonic() - clock, 1),
        "machine": _machine(),
        "log": str(log_path),
        "inputs_digest": digest_of(inputs),
        "inputs": inputs,
    }
    item.receipt.parent.mkdir(parents=True, exist_ok=True)
    item.receipt.write_text(json.dumps(receipt, indent=2) + "\n")
    return receipt
