"""The CUDA image proofs (make proof-cuda-image-sm75 / -sm86; too long for every test run on 2 cores).

docker/Dockerfile's CUDA path, compiled for real: on the stand-in CUDA bases built from NVIDIA's PyPI wheels
(rigkit/cuda_standin.py), with the build arguments the llamacpp_image role renders for the GTX 1650 Ti rig (sm 75)
or, with RIGKIT_CUDA_PROOF_RIG=desktop3050, the RTX 3050 (sm 86): GGML_CUDA=ON and the production flags, from the
sandbox's verified llama.cpp source. Then the runtime image's
``ldd`` must be complete but for the driver's libcuda.so.1, and the binary, started with Debian's libcuda1 at the
Debian 12 pin and no GPU, under the server's own container flags, must start, say why CUDA is unavailable, serve
the tiny MTP pair on the CPU (drafting), and be refused by the rollout's offload check. Writes
reports/cuda/cuda-image-smNN.json and .txt (the decisive lines the receipt reads back) and the whole server log.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

import rigkit  # noqa: F401  (first: it makes module_utils/ importable as ansible.module_utils)

# isort: split
from ansible.module_utils import gpu_offload
from ansible.module_utils.nvidia_compat import DRIVER_PINS

from rigkit.cli.cuda_standin import harness_base_image
from rigkit.cuda_standin import StandinImages, build_images
from rigkit.sandbox.tiny_gemma4 import write_pair
from tests.support import CACHE_DIR, REPO, group_vars, image_inputs, role_defaults, run

# The rig whose build arguments the proof renders (make proof-cuda-image-sm75 / -sm86 set it), and its architecture.
ARCHITECTURES = {"laptop1650ti": "75", "desktop3050": "86"}
RIG = os.environ.get("RIGKIT_CUDA_PROOF_RIG", "laptop1650ti")
ARCH = ARCHITECTURES[RIG]
ALIAS = f"rigkit/llama-server:cuda-standin-sm{ARCH}"  # the name the receipt's readback reads
PROBE = f"{ALIAS}-libcuda1"
REPORTS = REPO / "reports" / "cuda"
REPORT = REPORTS / f"cuda-image-sm{ARCH}.json"
SERVER_LOG = REPORTS / f"cuda-image-sm{ARCH}-no-device.log"
SANDBOX = group_vars("sandbox_rigs")
DEBIAN_12 = DRIVER_PINS[("debian", "12")]
PORT = 18391
FINDINGS: dict[str, object] = {}
# The legacy builder, as the llamacpp_image role builds (no BuildKit frontend image to pull).
LEGACY_BUILDER = {**os.environ, "DOCKER_BUILDKIT": "0"}


def docker(*argv: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def standin() -> StandinImages:
    harness = run(["ansible-playbook", "playbooks/harness.yml"], log_name="proof-cuda-harness")
    assert harness.returncode == 0, harness.tail()
    images = build_images(harness_base_image())
    FINDINGS["standin"] = json.loads(images.as_json())
    return images


def _source_tarball() -> Path:
    """The sandbox's llama.cpp source (the llama-cpp-python sdist), verified against its pin."""
    url, sha256 = SANDBOX["llamacpp_image_source_url"], SANDBOX["llamacpp_image_source_sha256"]
    path = CACHE_DIR / "llamacpp" / url.rsplit("/", 1)[1]
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(url, timeout=120) as response, path.open("wb") as out:
            shutil.copyfileobj(response, out)
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    assert actual == sha256, f"{path}: sha256 {actual}, pinned {sha256}"
    return path


@pytest.fixture(scope="module")
def cuda_image(standin: StandinImages, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The role's build for the 1650 Ti rig, on the stand-ins and the sandbox's source: its tag, aliased."""
    extra = {
        "llamacpp_image_build_base": standin.devel,
        "llamacpp_image_runtime_base": standin.runtime,
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
    rendered = image_inputs(RIG, extra=extra)[RIG]
    args = {**rendered["build_args"], "LLAMACPP_SOURCE_SHA256": SANDBOX["llamacpp_image_source_sha256"]}
    assert args["GGML_CUDA"] == "ON" and args["CUDA_ARCHITECTURES"] == ARCH, args
    context = tmp_path_factory.mktemp("cuda-context")
    shutil.copy2(REPO / "docker" / "Dockerfile", context / "Dockerfile")
    shutil.copy2(_source_tarball(), context / "llamacpp-src.tar.gz")
    argv = ["build", "--network", "host", "--tag", rendered["tag"]]
    argv += [f"--build-arg={key}={value}" for key, value in sorted(args.items())] + [str(context)]
    started = time.monotonic()
    built = subprocess.run(
        ["docker", *argv], capture_output=True, text=True, timeout=4 * 3600, check=False, env=LEGACY_BUILDER,
    )  # fmt: skip
    REPORTS.mkdir(parents=True, exist_ok=True)
    (REPORTS / f"cuda-image-sm{ARCH}-build.log").write_text(built.stdout + built.stderr)
    assert built.returncode == 0, (built.stdout + built.stderr)[-4000:]
    assert docker("tag", rendered["tag"], ALIAS).returncode == 0
    sizes = {
        name: int(docker("image", "inspect", "--format", "{{.Size}}", image).stdout.strip())
        for name, image in (("devel", standin.devel), ("runtime", standin.runtime), ("image", ALIAS))
    }
    FINDINGS["build"] = {
        "tag": rendered["tag"],
        "build_args": args,
        "wall_s": round(time.monotonic() - started, 1),
        "created": docker("image", "inspect", "--format", "{{.Created}}", rendered["tag"]).stdout.strip(),
        "sizes_mib": {name: round(size / 2**20) for name, size in sizes.items()},
    }
    return rendered["tag"]


def test_the_runtime_images_ldd_is_complete_but_for_the_drivers_libcuda(cuda_image: str) -> None:
    ldd = docker("run", "--rm", "--network", "host", "--entrypoint", "ldd", cuda_image, "/app/llama-server")
    assert ldd.returncode == 0, ldd.stderr
    lines = [line.strip() for line in ldd.stdout.splitlines() if line.strip()]
    missing = [line for line in lines if "not found" in line]
    assert [line.split()[0] for line in missing] == ["libcuda.so.1"], lines
    for library in ("libcublas.so.13", "libcublasLt.so.13", "libssl.so.3"):
        assert any(line.startswith(library + " => /") for line in lines), (library, lines)
    FINDINGS["ldd"] = lines


@pytest.fixture(scope="module")
def probe_image(cuda_image: str) -> str:
    """The CUDA image plus Debian's libcuda1 at the Debian 12 pin (what the toolkit would mount from the host)."""
    defaults = role_defaults("nvidia_driver")
    mirror, security = defaults["nvidia_driver_debian_mirror"], defaults["nvidia_driver_debian_security_mirror"]
    source = "Types: deb\\nURIs: {}\\nSuites: {}\\nComponents: main contrib non-free non-free-firmware\\n"
    source += "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\\n"
    sources = source.format(mirror, "bookworm bookworm-updates") + "\\n" + source.format(security, "bookworm-security")
    recipe = f"""FROM {cuda_image}
USER root
RUN set -eu; \\
    printf '{sources}' > /etc/apt/sources.list.d/nvidia-driver.sources; \\
    printf 'Package: *\\nPin: version {DEBIAN_12.version}-*\\nPin-Priority: 1001\\n' > /etc/apt/preferences.d/nvidia-driver; \\
    apt-get update; \\
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libcuda1; \\
    rm -rf /var/lib/apt/lists/*; \\
    dpkg-query -W -f '${{Package}} ${{Version}}\\n' libcuda1
USER 10001:10001
"""  # noqa: E501
    built = subprocess.run(
        ["docker", "build", "--network", "host", "--tag", PROBE, "-"], input=recipe, capture_output=True, text=True,
        timeout=1800, check=False, env=LEGACY_BUILDER,
    )  # fmt: skip
    assert built.returncode == 0, (built.stdout + built.stderr)[-3000:]
    version = docker("run", "--rm", "--entrypoint", "dpkg-query", PROBE, "-W", "-f", "${Version}", "libcuda1")
    assert version.stdout.startswith(DEBIAN_12.version + "-"), version.stdout
    FINDINGS["libcuda1"] = version.stdout.strip()
    return PROBE


def test_the_image_lists_no_cuda_device_without_a_gpu(probe_image: str) -> None:
    listed = docker("run", "--rm", "--network", "host", "--read-only", "--cap-drop", "ALL", probe_image,
                    "--list-devices")  # fmt: skip
    text = listed.stdout + listed.stderr
    assert "CUDA0" not in text, text
    assert "ggml_cuda_init: failed to initialize CUDA" in text, text
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
    assert not verdict.on_gpu and verdict.cause in (gpu_offload.CUDA_INIT, gpu_offload.NO_DEVICE), verdict.message
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
    assert {"build", "ldd", "libcuda1", "list_devices", "no_device"} <= FINDINGS.keys(), sorted(FINDINGS)
    no_device = FINDINGS["no_device"]
    assert isinstance(no_device, dict)
    decisive = [
        f"build: {FINDINGS['build']['tag']} sm{ARCH} GGML_CUDA=ON on {FINDINGS['standin']['devel']}",  # type: ignore[index]
        *(f"ldd: {line}" for line in FINDINGS["ldd"] if "libcu" in line),  # type: ignore[union-attr]
        f"libcuda1: {FINDINGS['libcuda1']}",
        *(f"cuda: {line}" for line in no_device["cuda_lines"]),
        f"served: {no_device['acceptance_line']}",
        f"offload: refused ({no_device['offload_verdict']['cause']})",
    ]
    REPORT.write_text(json.dumps({**FINDINGS, "decisive": decisive}, indent=2) + "\n")
    (REPORTS / f"cuda-image-sm{ARCH}.txt").write_text("\n".join(decisive) + "\n")
