"""llama-server at the pinned commit, in a content-addressed image, built once and shipped to the rig."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import shutil
import subprocess
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.llama_server.settings import SETTINGS

from rigkit.fleet.monitor import node_exporter_port
from rigkit.validation.server_options import known_options, parse_help, unknown_flags
from tests.support import (
    CACHE_DIR,
    LLAMACPP_BUILD_NUMBER,
    LLAMACPP_COMMIT,
    REPO,
    group_vars,
    image_inputs,
    role_defaults,
    run,
)

COMMIT = LLAMACPP_COMMIT
SANDBOX = group_vars("sandbox_rigs")
SDIST_SHA256 = SANDBOX["llamacpp_image_source_sha256"]
SDIST_SUBDIR = SANDBOX["llamacpp_image_source_subdir"]
SDIST_NAME = SANDBOX["llamacpp_image_source_url"].rsplit("/", 1)[1]


def render(*hosts: str, extra: dict | None = None) -> dict[str, dict]:
    return image_inputs(*hosts, extra={"container_harness_base_image": "rigkit/debian:bookworm-test", **(extra or {})})


@pytest.fixture(scope="module")
def rig_image(sandbox_provisioned) -> str:
    """The image the sandbox runs, which must be the tag the role derives from its inputs."""
    tags = run(
        [
            "docker",
            "exec",
            "rigkit-sandbox",
            "docker",
            "images",
            "rigkit/llama-server",
            "--format",
            "{{.Repository}}:{{.Tag}}",
        ]
    )
    assert tags.returncode == 0, tags.output
    (image,) = tags.output.split()
    base = inspect(image)["Config"]["Labels"]["io.rigkit.build-base-image"]
    assert render("sandbox", extra={"container_harness_base_image": base})["sandbox"]["tag"] == image
    return image


def inspect(image: str, *engine: str) -> dict:
    result = run([*engine, "docker", "image", "inspect", image])
    assert result.returncode == 0, result.output
    return json.loads(result.output)[0]


def test_version_reports_the_pinned_commit(rig_image):
    result = run(["docker", "run", "--rm", "--network", "host", rig_image, "--version"])
    assert result.returncode == 0, result.output
    assert f"build {LLAMACPP_BUILD_NUMBER}, commit {COMMIT[:7]}" in result.output


def test_help_lists_draft_mtp(rig_image):
    result = run(["docker", "run", "--rm", "--network", "host", rig_image, "--help"])
    spec_line = next(line for line in result.output.splitlines() if "--spec-type" in line)
    assert "draft-mtp" in spec_line and "draft-simple" in spec_line


def test_every_flag_the_settings_table_sets_is_one_the_pinned_server_knows(rig_image):
    """Each row's flag and its other spellings are one option of the pinned llama-server (its --help), and each
    flag in the environment file is read from that variable (the help's "env:" line)."""
    result = run(["docker", "run", "--rm", "--network", "none", rig_image, "--help"])
    options: list[tuple[list[str], str]] = []
    for line in result.output.splitlines():
        if names := parse_help(line):
            options.append((names[0], ""))
        elif "(env: " in line and options:
            options[-1] = (options[-1][0], line.split("(env: ", 1)[1].rstrip(")").strip())
    for row in SETTINGS:
        found = [(names, env) for names, env in options if row.flag in names]
        assert found, f"{row.flag} is not an option of the pinned llama-server"
        names, env = found[0]
        assert set(row.spellings) <= set(names), (row.flag, names)
        if row.env:
            assert env == row.env, (row.flag, env)


def test_the_recorded_options_are_the_pinned_servers_and_it_refuses_others(rig_image):
    """The controller refuses an extra argument the pin does not know (rigkit/validation/server_options.py) from
    the list recorded here; the real server refuses it the same way at start."""
    commit, names = known_options()
    result = run(["docker", "run", "--rm", "--network", "none", rig_image, "--help"])
    helped = {name for option in parse_help(result.output) for name in option}
    assert (commit, names) == (COMMIT, helped), (
        f"re-record it: .venv/bin/python -m rigkit.validation.server_options {rig_image} {COMMIT}"
    )
    for flag in ("--no-numa", "--mlock"):
        refused = run(["docker", "run", "--rm", "--network", "none", rig_image, flag, "--version"])
        assert refused.returncode != 0 and f"error: invalid argument: {flag}" in refused.output, refused.output
        assert unknown_flags([flag, "--jinja"], COMMIT) == [flag]


def test_the_ports_the_controller_refuses_are_ports_the_server_cannot_bind(rig_image):
    """llama_server_port below 1024, or the node exporter's port: refused before contact (rigkit/validation/rules.py,
    _check_ports), because llama-server started as its unit starts it (uid 10001, no capabilities, the host's
    network) stops at once on either."""
    unit_like = ["docker", "run", "--rm", "--network", "host", "--user", "10001:10001", "--cap-drop", "ALL"]
    server = [*unit_like, "--security-opt", "no-new-privileges", rig_image, "--host", "127.0.0.1", "-m", "/none.gguf"]
    privileged = run([*server, "--port", "80"])
    assert privileged.returncode != 0, privileged.output
    assert "couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 80" in privileged.output
    # the sandbox's own node exporter (Debian's prometheus-node-exporter) holds its port on this machine's network
    sandbox_port = yaml.safe_load((REPO / "inventory/host_vars/sandbox.yml").read_text())["llama_server_port"]
    exporter = node_exporter_port("sandbox", sandbox_port)
    with urllib.request.urlopen(f"http://127.0.0.1:{exporter}/metrics", timeout=10) as answer:
        assert b"node_exporter_build_info" in answer.read()
    taken = run([*server, "--port", str(exporter)])
    assert taken.returncode != 0, taken.output
    assert f"couldn't bind HTTP server socket, hostname: 127.0.0.1, port: {exporter}" in taken.output


def test_runs_as_non_root(rig_image):
    result = run(["docker", "run", "--rm", "--network", "host", "--entrypoint", "id", rig_image])
    assert result.output.startswith("uid=10001(llama) gid=10001(llama)")


def test_labels_record_every_input(rig_image):
    labels = inspect(rig_image)["Config"]["Labels"]
    assert labels["io.rigkit.llamacpp.commit"] == COMMIT
    assert labels["io.rigkit.llamacpp.build-number"] == LLAMACPP_BUILD_NUMBER
    assert labels["io.rigkit.llamacpp.source-sha256"] == SDIST_SHA256
    assert labels["io.rigkit.ggml-cuda"] == "OFF"
    assert labels["io.rigkit.build-base-image"].startswith("rigkit/debian:bookworm-")
    assert labels["io.rigkit.runtime-base-image"] == labels["io.rigkit.build-base-image"]
    # the CPU path: the distribution's own compilers, no CUDA code for cuobjdump to check
    assert labels["io.rigkit.toolchain-packages"] == "gcc g++ cmake" and labels["io.rigkit.apt-components"] == "main"
    assert labels["io.rigkit.cuda-sass"] == labels["io.rigkit.cuda-ptx"] == labels["io.rigkit.runtime-packages"] == ""


def test_the_image_keeps_the_package_versions_it_was_built_with(rig_image):
    shown = run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "cat", rig_image,
                 "/app/PACKAGES.build", "/app/PACKAGES.runtime"])  # fmt: skip
    assert shown.returncode == 0, shown.output
    names = {line.split("=", 1)[0] for line in shown.output.split()}
    assert {"g++", "cmake", "libssl-dev", "libgomp1", "openssl"} <= names, sorted(names)


def test_shipped_image_has_the_same_id_in_the_rig(rig_image):
    built = inspect(rig_image)["Id"]
    arrived = inspect(rig_image, "docker", "exec", "rigkit-sandbox")["Id"]
    assert built == arrived


def test_tag_follows_build_inputs_only():
    base = render("sandbox")["sandbox"]["tag"]
    same = {
        "llama_server_spec_draft_n_max": 7,  # a server flag
        "llamacpp_image_build_jobs": 1,  # build parallelism
    }
    for key, value in same.items():
        assert render("sandbox", extra={key: value})["sandbox"]["tag"] == base, key
    different = {
        "llamacpp_image_commit": "77c4540ce" + "0" * 31,
        "llamacpp_image_runtime_base": "rigkit/debian:bookworm-other",
        "llamacpp_image_extra_cmake_args": "-DGGML_AVX512=ON",
        "llamacpp_image_source_sha256": "0" * 64,
    }
    tags = {render("sandbox", extra={key: value})["sandbox"]["tag"] for key, value in different.items()}
    assert base not in tags and len(tags) == len(different)


def test_production_build_for_each_gpu_rig():
    shown = render("desktop3050", "laptop1650ti")
    for host, arch in (("desktop3050", "86"), ("laptop1650ti", "75")):
        args = shown[host]["build_args"]
        assert args["GGML_CUDA"] == "ON" and args["CUDA_ARCHITECTURES"] == f"{arch}-real"
        assert args["CUDA_SASS"] == f"sm_{arch}" and args["CUDA_PTX"] == ""
        assert args["LLAMACPP_COMMIT"] == COMMIT and args["LLAMACPP_BUILD_NUMBER"] == LLAMACPP_BUILD_NUMBER
        # The kit's own Debian trixie base, Debian's CUDA 12.4 toolchain and runtime at exact versions.
        assert args["BUILD_BASE_IMAGE"] == args["RUNTIME_BASE_IMAGE"]
        assert re.fullmatch(r"rigkit/debian:trixie-[0-9a-f]{12}", args["BUILD_BASE_IMAGE"]), args
        assert args["APT_COMPONENTS"] == "main contrib non-free" and args["GCC_VERSION"] == "13"
        assert "nvidia-cuda-toolkit=12.4.131~12.4.1-2" in args["TOOLCHAIN_PACKAGES"].split()
        assert "libcudart12=12.4.127~12.4.1-2" in args["RUNTIME_PACKAGES"].split()
        assert args["LLAMACPP_SOURCE_SUBDIR"] == f"llama.cpp-{COMMIT}"
        assert shown[host]["source"] == "git" and shown[host]["git_url"] == "https://github.com/ggml-org/llama.cpp.git"
        assert shown[host]["build_host"] == host
        assert f"-cuda-sm{arch}-" in shown[host]["tag"]
    assert shown["desktop3050"]["tag"] != shown["laptop1650ti"]["tag"]
    # One image for both GPUs is one variable away.
    both = render("desktop3050", extra={"llamacpp_image_cuda_architectures": "75-real;86-real"})["desktop3050"]
    assert "-cuda-sm75-86-" in both["tag"] and both["build_args"]["CUDA_ARCHITECTURES"] == "75-real;86-real"
    assert both["build_args"]["CUDA_SASS"] == "sm_75 sm_86"


def test_a_missing_base_image_the_kit_does_not_make_is_refused_before_any_build(tmp_path):
    missing = "rigkit/debian:absent-0000"
    result = run(
        ["ansible-playbook", "playbooks/image.yml", "--limit", "sandbox", "-e",
         json.dumps({"llamacpp_image_build_base": missing, "llamacpp_image_runtime_base": missing})],
        RIGKIT_CACHE_DIR=str(tmp_path / "cache"),
    )  # fmt: skip
    assert result.returncode != 0, result.tail()
    assert f"{missing} is not in the Docker engine of localhost and is not the kit's own base" in result.output
    assert "Build llama-server" not in result.output


def test_the_gpu_rigs_build_on_the_kits_own_debian_base():
    """The base's name is the harness's recipe rule for trixie (debootstrap minbase, suite, mirror): the role makes it
    on the build host when the engine lacks it."""
    import hashlib

    defaults = role_defaults("llamacpp_image")
    recipe = "|".join(["minbase", defaults["llamacpp_image_debian_suite"], defaults["llamacpp_image_debian_mirror"]])
    expected = f"rigkit/debian:trixie-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"
    assert render("desktop3050")["desktop3050"]["build_args"]["BUILD_BASE_IMAGE"] == expected


def test_unsupported_architecture_string_is_refused():
    result = run(
        [
            "ansible-playbook",
            "tests/integration/playbooks/image_inputs.yml",
            "--limit",
            "desktop3050",
            "-e",
            "llamacpp_image_cuda_architectures=native",
        ]
    )
    assert result.returncode != 0
    assert "llamacpp_image_cuda_architectures" in result.output


def tampered_sdist(tmp_path: Path) -> Path:
    """The pinned sdist with one byte of its llama.cpp tree changed (a valid tar.gz, a different hash)."""
    original = CACHE_DIR / "llamacpp" / SDIST_NAME
    if original.is_file():
        raw = original.read_bytes()
    else:  # the image came from the engine by its tag, so this cache never downloaded the source: fetch it
        import urllib.request

        with urllib.request.urlopen(SANDBOX["llamacpp_image_source_url"], timeout=300) as answer:
            raw = answer.read()
    assert hashlib.sha256(raw).hexdigest() == SDIST_SHA256, "the pinned sdist does not match its sha256"
    data = bytearray(gzip.decompress(raw))
    marker = data.find(b"draft-mtp")
    data[marker] ^= 0x20
    out = tmp_path / "llamacpp-src.tar.gz"
    out.write_bytes(gzip.compress(bytes(data), compresslevel=1, mtime=0))
    with tarfile.open(out) as archive:  # still a readable tarball
        assert archive.getmember(SDIST_SUBDIR + "/CMakeLists.txt")
    return out


def test_dockerfile_refuses_a_tampered_source(rig_image, tmp_path):
    context = tmp_path / "context"
    context.mkdir()
    shutil.copy(REPO / "docker" / "Dockerfile", context / "Dockerfile")
    shutil.move(tampered_sdist(tmp_path), context / "llamacpp-src.tar.gz")
    base = inspect(rig_image)["Config"]["Labels"]["io.rigkit.build-base-image"]
    args = {
        "BUILD_BASE_IMAGE": base,
        "RUNTIME_BASE_IMAGE": base,
        "LLAMACPP_COMMIT": COMMIT,
        "LLAMACPP_BUILD_NUMBER": LLAMACPP_BUILD_NUMBER,
        "LLAMACPP_SOURCE_SHA256": SDIST_SHA256,
        "LLAMACPP_SOURCE_SUBDIR": SDIST_SUBDIR,
    }
    argv = ["docker", "build", "--network", "host", "--force-rm", "-t", "rigkit/tampered:test"]
    for key, value in args.items():
        argv += ["--build-arg", f"{key}={value}"]
    result = run([*argv, str(context)], timeout=300)
    assert result.returncode != 0
    assert "checksum mismatch" in result.output
    assert f"expected sha256: {SDIST_SHA256}" in result.output
    assert "refusing to build from an unverified source tree" in result.output
    assert run(["docker", "image", "inspect", "rigkit/tampered:test"]).returncode != 0


def test_role_refuses_a_tampered_download(rig_image, tmp_path):
    """The role's own download check: a source URL serving other bytes fails before any build."""
    served = tmp_path / "www"
    served.mkdir()
    shutil.move(tampered_sdist(tmp_path), served / SDIST_NAME)
    server = subprocess.Popen(
        ["python3", "-m", "http.server", "--bind", "127.0.0.1", "0", "--directory", str(served)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(server.stdout.readline().split("port ")[1].split()[0])
        extra = {
            "llamacpp_image_source_url": f"http://127.0.0.1:{port}/{SDIST_NAME}",
            "llamacpp_image_work_dir": str(tmp_path / "work"),
            "llamacpp_image_extra_cmake_args": "-DRIGKIT_TAMPER_TEST=1",  # a tag that does not exist yet
        }
        result = run(
            ["ansible-playbook", "playbooks/provision.yml", "--limit", "sandbox", "-e", json.dumps(extra)],
            log_name="image-tampered-download",
            results=True,
        )
    finally:
        server.terminate()
        server.wait()
    assert result.returncode != 0
    (download,) = result.tasks("sandbox", "llamacpp_image : Download the pinned source tarball")
    assert download["status"] == "failed" and "did not match" in download["msg"], download
    assert result.tasks("sandbox", "llamacpp_image : Build llama-server") == []
    # The image the rig runs is untouched.
    assert inspect(rig_image, "docker", "exec", "rigkit-sandbox")["Id"] == inspect(rig_image)["Id"]


def test_build_context_is_removed_after_build(rig_image):
    """The sandbox's build context is gone; another one may only be a build in flight (younger than the build
    timeout: the role removes older ones, left by runs killed mid-build, before it builds)."""
    leftovers = list((CACHE_DIR / "llamacpp").glob("context-*"))
    timeout = role_defaults("llamacpp_image")["llamacpp_image_build_timeout"]
    assert [path for path in leftovers if time.time() - path.stat().st_mtime > timeout] == []
    assert not list((CACHE_DIR / "llamacpp").glob(f"context-{re.sub(r'[^A-Za-z0-9_.-]', '_', rig_image)}.*"))
