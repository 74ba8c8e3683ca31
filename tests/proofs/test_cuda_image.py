"""The CUDA image proofs (make proof-cuda-image-sm86; too long for every test run on 2 cores).

The production image a GPU rig builds, compiled for real: `playbooks/image.yml` (what `make image host=RIG` runs)
for the rig RIGKIT_CUDA_PROOF_RIG names (desktop3050: the RTX 3050, sm 86; laptop1650ti: the GTX 1650 Ti, sm 75),
built on the controller from the role's own inputs: the kit's Debian trixie base, Debian's CUDA 12.4 toolchain and
runtime at the pinned versions. One input differs from a rig's build, because GitHub is out of reach here: the
source is the sandbox's verified llama-cpp-python sdist, whose vendor/llama.cpp is the pinned commit's tree.

Then: the image's compiled code is exactly the SASS asked (its labels and cuobjdump's listing), the runtime image's
``ldd`` is complete but for the driver's libcuda.so.1, the pinned packages are what the image holds, and the binary,
given the Debian 12 rigs' libcuda.so.1 (535.309.01) as the NVIDIA container toolkit mounts it and run without a GPU
under the server's own container flags, must say that no CUDA device exists (not a driver/runtime mismatch), serve
the tiny MTP pair on the CPU (drafting), and be refused by the rollout's offload check. Writes
reports/cuda/cuda-image-smNN.json and .txt (the decisive lines the receipt reads back) and the server's log.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

import rigkit  # noqa: F401  (first: it makes module_utils/ importable as ansible.module_utils)

# isort: split
from ansible.module_utils import gpu_offload
from ansible.module_utils.cuda_compat import cuda_objects
from ansible.module_utils.nvidia_compat import DRIVER_PINS

from rigkit.sandbox.tiny_gemma4 import write_pair
from tests.support import CACHE_DIR, REPO, group_vars, image_inputs, role_defaults, run

# The rig whose image the proof builds (make proof-cuda-image-sm86 sets it), and its architecture.
ARCHITECTURES = {"laptop1650ti": "75", "desktop3050": "86"}
RIG = os.environ.get("RIGKIT_CUDA_PROOF_RIG", "laptop1650ti")
ARCH = ARCHITECTURES[RIG]
PROBE = f"rigkit/llama-server:proof-sm{ARCH}-libcuda"
REPORTS = REPO / "reports" / "cuda"
REPORT = REPORTS / f"cuda-image-sm{ARCH}.json"
SERVER_LOG = REPORTS / f"cuda-image-sm{ARCH}-no-device.log"
SANDBOX = group_vars("sandbox_rigs")
DEBIAN_12 = DRIVER_PINS[("debian", "12")]
PORT = 18391
FINDINGS: dict[str, object] = {}
# Built on the controller from the sandbox's source (the pinned commit's tree): GitHub is unreachable here.
EXTRA = {
    "llamacpp_image_build_on": "controller",
    **{
        name: SANDBOX[name]
        for name in (
            "llamacpp_image_source",
            "llamacpp_image_source_url",
            "llamacpp_image_source_sha256",
            "llamacpp_image_source_subdir",
        )
    },
}


def docker(*argv: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=timeout, check=False)


def _labels(image: str) -> dict[str, str]:
    return json.loads(docker("image", "inspect", "--format", "{{json .Config.Labels}}", image).stdout)


def _app_file(image: str, name: str) -> str:
    shown = docker("run", "--rm", "--network", "none", "--entrypoint", "cat", image, f"/app/{name}")
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def _compile_record(tag: str, output: str) -> dict[str, object]:
    """Whether this run compiled the image (and how long the role's build task ran, from its last progress line) or
    found it already built on this machine; the role's newest build log of the tag is kept beside the report."""
    slug = "".join(char if char.isalnum() or char in "_.-" else "_" for char in tag)
    logs = sorted((CACHE_DIR / "llamacpp").glob(f"build-{slug}.*.log"), key=lambda path: path.stat().st_mtime)
    kept = REPORTS / f"cuda-image-sm{ARCH}-build.log"
    if logs:
        kept.write_text(logs[-1].read_text(errors="replace"))
    progress = re.findall(r"Build llama-server: ((?:[0-9]+h)?(?:[0-9]+m)?[0-9]+s) elapsed", output)
    created = docker("image", "inspect", "--format", "{{.Created}}", tag).stdout.strip()
    compiled = f"compiled in this run ({progress[-1]} on {os.cpu_count()} cores)" if progress else "reused"
    return {
        "compile": f"{compiled}; image created {created[:19]}Z",
        "build_log": str(kept.relative_to(REPO)) if logs else None,
    }


@pytest.fixture(scope="module")
def cuda_image() -> str:
    """`make image host=RIG`'s playbook, the rig's own inputs built on the controller: the image's tag."""
    harness = run(["ansible-playbook", "playbooks/harness.yml"], log_name="proof-cuda-harness")
    assert harness.returncode == 0, harness.tail()
    rendered = image_inputs(RIG, extra=EXTRA)[RIG]
    args = rendered["build_args"]
    assert args["GGML_CUDA"] == "ON" and args["CUDA_ARCHITECTURES"] == f"{ARCH}-real", args
    assert args["BUILD_BASE_IMAGE"] == args["RUNTIME_BASE_IMAGE"], args
    assert args["BUILD_BASE_IMAGE"].startswith("rigkit/debian:trixie-"), args
    started = time.monotonic()
    built = run(
        ["ansible-playbook", "playbooks/image.yml", "--limit", RIG, "-e", json.dumps(EXTRA)],
        log_name=f"proof-cuda-image-sm{ARCH}",
        timeout=4 * 3600,
    )
    REPORTS.mkdir(parents=True, exist_ok=True)
    assert built.returncode == 0, built.tail()
    tag = rendered["tag"]
    production = image_inputs(RIG)[RIG]
    # the rig's own build differs in its source alone: the same tree, from a git checkout of the commit
    assert {key: value for key, value in production["build_args"].items() if key != "LLAMACPP_SOURCE_SUBDIR"} == {
        key: value for key, value in args.items() if key != "LLAMACPP_SOURCE_SUBDIR"
    }, (production["build_args"], args)
    FINDINGS["production_tag"] = production["tag"]
    FINDINGS["build"] = {
        "tag": tag,
        "build_args": args,
        "playbook_wall_s": round(time.monotonic() - started, 1),
        **_compile_record(tag, built.output),
        "created": docker("image", "inspect", "--format", "{{.Created}}", tag).stdout.strip(),
        "size_mib": round(int(docker("image", "inspect", "--format", "{{.Size}}", tag).stdout.strip()) / 2**20),
        "base": args["BUILD_BASE_IMAGE"],
    }
    return tag


def test_the_image_carries_compiled_code_for_exactly_the_rigs_gpu(cuda_image: str) -> None:
    labels = _labels(cuda_image)
    wanted = cuda_objects(f"{ARCH}-real")
    assert labels["io.rigkit.cuda-sass"] == " ".join(wanted["sass"]) == f"sm_{ARCH}", labels
    assert labels["io.rigkit.cuda-ptx"] == "", labels
    listing = [line.strip() for line in _app_file(cuda_image, "CUDA_OBJECTS").splitlines() if line.strip()]
    elves = [line for line in listing if line.startswith("ELF file")]
    assert elves and all(line.endswith(f".sm_{ARCH}.cubin") for line in elves), listing
    assert not [line for line in listing if line.startswith("PTX file")], listing
    FINDINGS["cuobjdump"] = {
        "elf_files": len(elves),
        "architectures": sorted({line.rsplit(".", 2)[1] for line in elves}),
    }


def test_the_pinned_packages_are_what_the_image_holds(cuda_image: str) -> None:
    defaults = role_defaults("llamacpp_image")
    runtime = dict(line.split("=", 1) for line in _app_file(cuda_image, "PACKAGES.runtime").split())
    build = dict(line.split("=", 1) for line in _app_file(cuda_image, "PACKAGES.build").split())
    for name, version in defaults["llamacpp_image_cuda_runtime_packages"].items():
        assert runtime.get(name) == version, (name, runtime.get(name))
    for name, version in defaults["llamacpp_image_cuda_toolchain_packages"].items():
        assert build.get(name) == version, (name, build.get(name))
    assert "nvidia-cuda-toolkit" not in runtime and "nvidia-cuda-dev" not in runtime, sorted(runtime)
    FINDINGS["packages"] = {
        "toolchain": {name: build[name] for name in defaults["llamacpp_image_cuda_toolchain_packages"]},
        "runtime": {name: runtime[name] for name in defaults["llamacpp_image_cuda_runtime_packages"]},
        "runtime_count": len(runtime),
    }


def test_the_runtime_images_ldd_is_complete_but_for_the_drivers_libcuda(cuda_image: str) -> None:
    ldd = docker("run", "--rm", "--network", "none", "--entrypoint", "ldd", cuda_image, "/app/llama-server")
    assert ldd.returncode == 0, ldd.stderr
    lines = [line.strip() for line in ldd.stdout.splitlines() if line.strip()]
    missing = [line for line in lines if "not found" in line]
    assert [line.split()[0] for line in missing] == ["libcuda.so.1"], lines
    for library in ("libcudart.so.12", "libcublas.so.12", "libcublasLt.so.12", "libssl.so.3"):
        assert any(line.startswith(library + " => /") for line in lines), (library, lines)
    FINDINGS["ldd"] = lines


@pytest.fixture(scope="module")
def probe_image(cuda_image: str) -> str:
    """The CUDA image plus the Debian 12 rigs' libcuda.so.1 (libcuda1 at the pin, from bookworm-security), laid where
    the NVIDIA container toolkit mounts the host driver's library: nothing else of the driver is installed."""
    security = role_defaults("nvidia_driver")["nvidia_driver_debian_security_mirror"]
    library = f"libcuda.so.{DEBIAN_12.version}"
    recipe = f"""FROM {cuda_image}
USER root
RUN set -eu; \\
    printf 'Types: deb\\nURIs: {security}\\nSuites: bookworm-security\\nComponents: non-free\\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\\n' > /etc/apt/sources.list.d/driver.sources; \\
    apt-get update; \\
    cd /tmp; apt-get download libcuda1={DEBIAN_12.version}-0+deb12u1; \\
    dpkg-deb -x libcuda1_*.deb /tmp/libcuda1; \\
    cp /tmp/libcuda1/usr/lib/x86_64-linux-gnu/nvidia/current/{library} /usr/lib/x86_64-linux-gnu/{library}; \\
    ln -s {library} /usr/lib/x86_64-linux-gnu/libcuda.so.1; \\
    ldconfig; \\
    rm -rf /tmp/libcuda1 /tmp/libcuda1_*.deb /etc/apt/sources.list.d/driver.sources /var/lib/apt/lists/*
USER 10001:10001
"""  # noqa: E501
    built = subprocess.run(
        ["docker", "build", "--network", "host", "--tag", PROBE, "-"], input=recipe, capture_output=True, text=True,
        timeout=1800, check=False, env={**os.environ, "DOCKER_BUILDKIT": "0"},
    )  # fmt: skip
    assert built.returncode == 0, (built.stdout + built.stderr)[-3000:]
    ldd = docker("run", "--rm", "--network", "none", "--entrypoint", "ldd", PROBE, "/app/llama-server")
    # trixie merged /lib into /usr/lib: the loader names either spelling
    assert re.search(r"libcuda\.so\.1 => (/usr)?/lib/x86_64-linux-gnu/libcuda\.so\.1 ", ldd.stdout), ldd.stdout
    FINDINGS["libcuda1"] = (
        f"{DEBIAN_12.version} ({library}, from bookworm-security's libcuda1 as the toolkit mounts it)"
    )
    return PROBE


def test_the_image_lists_no_cuda_device_without_a_gpu(probe_image: str) -> None:
    listed = docker("run", "--rm", "--network", "none", "--read-only", "--cap-drop", "ALL", probe_image,
                    "--list-devices")  # fmt: skip
    text = listed.stdout + listed.stderr
    assert "CUDA0" not in text, text
    assert f"ggml_cuda_init: failed to initialize CUDA: {gpu_offload.NO_DEVICE_ERROR}" in text, text
    assert "insufficient" not in text, text
    FINDINGS["list_devices"] = [line for line in text.splitlines() if line.strip()]


def _wait_for_health(url: str, container: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        state = docker("inspect", "--format", "{{.State.Running}}", container).stdout.strip()
        assert state == "true", docker("logs", container).stderr[-4000:]
        time.sleep(1)
    pytest.fail(f"no /health 200 within {timeout} s")


def test_without_a_device_it_serves_the_mtp_pair_on_the_cpu_and_the_offload_check_refuses_it(
    probe_image: str, tmp_path: Path
) -> None:
    target, drafter = write_pair(tmp_path / "tiny-gemma4.gguf", tmp_path / "tiny-gemma4-assistant.gguf")
    tmp_path.chmod(0o755)
    container = "rigkit-proof-cuda-no-device"
    docker("rm", "-f", container)
    server_args = ["-m", f"/models/{target.name}", "-md", f"/models/{drafter.name}", "--spec-type", "draft-mtp",
                   "--spec-draft-n-max", "3", "-c", "1024", "-np", "1", "--metrics", "--n-gpu-layers", "all",
                   "--n-gpu-layers-draft", "all",
                   "--verbosity", "4", "--host", "127.0.0.1", "--port", str(PORT)]  # fmt: skip
    # The server's own container flags (roles/llama_server): read-only, non-root, no capabilities, no new privileges.
    started = docker(
        "run", "-d", "--name", container, "--network", "host", "--read-only", "--user", "10001:10001",
        "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--tmpfs", "/tmp",
        "-v", f"{tmp_path}:/models:ro", probe_image, *server_args,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        url = f"http://127.0.0.1:{PORT}"
        _wait_for_health(url, container)
        request = urllib.request.Request(
            url + "/completion",
            data=json.dumps({"prompt": "def fibonacci(n):", "n_predict": 32, "temperature": 0}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            timings = json.loads(response.read())["timings"]
        time.sleep(1)
    finally:
        logs = docker("logs", container)
        docker("rm", "-f", container)
    log = logs.stdout + logs.stderr
    SERVER_LOG.write_text(log)
    assert timings.get("draft_n", 0) > 0, timings
    verdict = gpu_offload.check(log, drafter=True, gpu_layers="all", gpu_layers_draft="all")
    assert not verdict.on_gpu and verdict.cause == gpu_offload.NO_DEVICE, verdict.message
    acceptance = [line.strip() for line in log.splitlines() if "draft acceptance" in line]
    assert acceptance, log[-3000:]
    FINDINGS["no_device"] = {
        "cuda_lines": [line.strip() for line in log.splitlines() if "ggml_cuda_init" in line],
        "served_on_cpu": {"draft_n": timings["draft_n"], "draft_n_accepted": timings.get("draft_n_accepted", 0)},
        "acceptance_line": acceptance[-1],
        "offload_verdict": {"cause": verdict.cause, "message": verdict.message},
        "server_log": str(SERVER_LOG.relative_to(REPO)),
    }


def test_write_the_report() -> None:
    """Last: the findings of the tests above, and the decisive lines the proof's receipt reads back."""
    assert {"build", "cuobjdump", "packages", "ldd", "libcuda1", "list_devices", "no_device"} <= FINDINGS.keys(), (
        sorted(FINDINGS)
    )
    build, no_device, packages = FINDINGS["build"], FINDINGS["no_device"], FINDINGS["packages"]
    assert isinstance(build, dict) and isinstance(no_device, dict) and isinstance(packages, dict)
    pinned = {**packages["toolchain"], **packages["runtime"]}
    decisive = [
        f"build: {build['tag']} sm{ARCH} GGML_CUDA=ON on {build['base']}, {build['size_mib']} MiB; {build['compile']}",
        f"production: {FINDINGS['production_tag']} (the rig's tag: the same inputs, the source from git)",
        f"sass: {' '.join(FINDINGS['cuobjdump']['architectures'])} (cuobjdump, no PTX)",  # type: ignore[index]
        *(f"package: {name}={version}" for name, version in sorted(pinned.items())),
        *(f"ldd: {line}" for line in FINDINGS["ldd"] if "libcu" in line),  # type: ignore[union-attr]
        f"libcuda1: {FINDINGS['libcuda1']}",
        *(f"cuda: {line}" for line in no_device["cuda_lines"]),
        f"served: {no_device['acceptance_line']}",
        f"offload: refused ({no_device['offload_verdict']['cause']})",
    ]
    REPORT.write_text(json.dumps({**FINDINGS, "decisive": decisive}, indent=2) + "\n")
    (REPORTS / f"cuda-image-sm{ARCH}.txt").write_text("\n".join(decisive) + "\n")
