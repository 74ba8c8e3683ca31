"""The llama.cpp source, wheels and models that tests/gpu/run.sh needs on a machine without internet.

    .venv/bin/python tests/gpu/make_bundle.py [bundle]       # writes .device/ (what `make gpu-bundle` runs)
    .venv/bin/python tests/gpu/make_bundle.py prove [--build] # shows the trimmed tree configures (and builds)
    python3 tests/gpu/make_bundle.py verify --dest DIR        # on the device: unpack and check every file
    python3 tests/gpu/make_bundle.py flags [--cuda-arch 90]   # docker/Dockerfile's cmake flags, one per line
    .venv/bin/python tests/gpu/make_bundle.py image --image TAG  # the kit's CUDA image's llama-server, for the device

The only offline copy of llama.cpp at the pinned commit is PyPI's llama-cpp-python 0.3.36 sdist (76 MB, its
vendor/llama.cpp is commit 0c1e57098, b11312). ``bundle`` checks the sdist's sha256 against the pin in
inventory/group_vars/sandbox_rigs.yml, then writes vendor/llama.cpp without what a llama-server build never
reads (EXCLUDED) as a reproducible .device/llama.cpp-src.tar.gz, and a manifest with the sha256 of every kept file
as it was in the verified sdist. ``verify`` (standard library only: it runs on the device) re-checks the tarball,
the file set and every file's hash before anything is built.

``image`` copies the llama-server binary and BUILD_INFO out of an image the llamacpp_image role built with CUDA
(docker/Dockerfile on the stand-in CUDA base here), gzipped, with its sha256 and the image's id, so that the device
can run what the rigs' image runs on a real GPU.

``flags`` reads the cmake flags from docker/Dockerfile's build stage, so the device builds exactly what the rigs'
image builds (only the CUDA architecture differs).

Why one file (567 lines): one pipeline (fetch, verify, trim, pack, verify again on the device); its verify
step runs with the device's plain python3, outside the kit's virtualenv, so the file carries what it needs.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEVICE_DIR = REPO / ".device"
SRC_TARBALL = "llama.cpp-src.tar.gz"
MANIFEST = "llama.cpp-manifest.json"
DOCKERFILE = REPO / "docker" / "Dockerfile"
PINS_FILE = REPO / "inventory" / "group_vars" / "sandbox_rigs.yml"
IMAGE_DEFAULTS = REPO / "roles" / "llamacpp_image" / "defaults" / "main.yml"
SDIST_NAME = "llama_cpp_python-0.3.36.tar.gz"
CHUNK = 1 << 20

# Paths (relative to the llama.cpp root, fnmatch patterns; "x" also covers everything under x/) that a
# llama-server build with the Dockerfile's flags never reads. `prove` checks it: configure + build without them.
EXCLUDED: dict[str, str] = {
    ".git": "a dangling submodule pointer (docker/Dockerfile deletes it too)",
    ".github": "CI",
    ".devops": "upstream Dockerfiles",
    "ci": "CI scripts",
    "docs": "documentation (38 MB)",
    "models": "vocab GGUFs and templates for tests (75 MB)",
    "benches": "benchmark data",
    "tests": "LLAMA_BUILD_TESTS=OFF",
    "examples": "LLAMA_BUILD_EXAMPLES=OFF",
    "pocs": "added only with LLAMA_BUILD_EXAMPLES",
    "media": "images",
    "gguf-py": "Python package",
    "conversion": "Python converters",
    "requirements": "Python requirements",
    "skills": "agent notes",
    "grammars": "GBNF samples (read at run time, not built in)",
    "scripts/*": "helper scripts; scripts/ui-assets.cmake is kept (tools/ui runs it at build time)",
    "tools/ui/*": "Web UI sources (LLAMA_BUILD_UI=OFF); its CMakeLists and ui.*.in templates are kept",
    # ggml/src/CMakeLists.txt: ggml_add_backend(X) adds ggml-x/ only when GGML_X is ON (here only CPU, CUDA).
    **{
        f"ggml/src/ggml-{name}": "another ggml backend (GGML_* OFF)"
        for name in (
            "blas",
            "cann",
            "et",
            "hexagon",
            "hip",
            "metal",
            "musa",
            "opencl",
            "openvino",
            "rpc",
            "sycl",
            "virtgpu",
            "vulkan",
            "webgpu",
            "zdnn",
            "zendnn",
        )
    },
}
KEPT: tuple[str, ...] = ("scripts/ui-assets.cmake", "tools/ui/CMakeLists.txt", "tools/ui/ui.h.in", "tools/ui/ui.cpp.in")


class BundleError(Exception):
    """The sdist, the bundle or the tree is not what it must be."""


# ---------------------------------------------------------------------------------------------- helpers
def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def excluded(rel: str) -> str | None:
    """The EXCLUDED pattern that drops this path, or None when the build may read it."""
    if rel in KEPT:
        return None
    for pattern in EXCLUDED:
        if pattern.endswith("/*"):
            if rel.startswith(pattern[:-1]):
                return pattern
        elif rel == pattern or rel.startswith(pattern + "/"):
            return pattern
    return None


def _yaml_scalar(path: Path, key: str) -> str:
    """A top-level scalar of a YAML file (no PyYAML needed: these pins are plain `key: value` lines)."""
    match = re.search(rf"^{re.escape(key)}:\s*(\S+)\s*$", path.read_text(), re.MULTILINE)
    if not match:
        raise BundleError(f"{path.relative_to(REPO)} has no `{key}:` line")
    return match.group(1).strip("'\"")


def pins() -> dict[str, Any]:
    return {
        "sha256": _yaml_scalar(PINS_FILE, "llamacpp_image_source_sha256"),
        "subdir": _yaml_scalar(PINS_FILE, "llamacpp_image_source_subdir"),
        "commit": _yaml_scalar(IMAGE_DEFAULTS, "llamacpp_image_commit"),
        "build_number": int(_yaml_scalar(IMAGE_DEFAULTS, "llamacpp_image_build_number")),
    }


def default_sdist() -> Path:
    from rigkit.paths import cache_dir  # controller only: the device's verify runs without the kit

    return cache_dir() / "llamacpp" / SDIST_NAME  # where roles/llamacpp_image keeps it


def sdist_of(args: argparse.Namespace) -> Path:
    """--sdist, else the kit's cached copy (looked up only when a command needs it)."""
    return Path(args.sdist) if args.sdist else default_sdist()


# ---------------------------------------------------------------------------------------------- cmake flags
def dockerfile_cmake_flags(*, cuda_arch: str | None, commit: str, build_number: int) -> list[str]:
    """The -D flags docker/Dockerfile's build stage passes to cmake, for a CUDA (cuda_arch) or CPU build."""
    text = DOCKERFILE.read_text()
    joined = re.sub(r"\\\n", " ", text)
    common = re.search(r"cmake -S /src/llama\.cpp -B /src/build(.*?)\"\$@\"", joined)
    cuda_on = re.search(r"set -- (-DGGML_CUDA=ON[^;]*);", joined)
    cuda_off = re.search(r"set -- (-DGGML_CUDA=OFF[^;]*);", joined)
    if not (common and cuda_on and cuda_off):
        raise BundleError(f"cannot find the cmake invocation in {DOCKERFILE} (did its build stage change?)")
    variables = {
        "$LLAMACPP_BUILD_NUMBER": str(build_number),
        "$short_commit": commit[:7],
        "${CUDA_ARCHITECTURES}": cuda_arch or "",
    }
    flags = []
    for token in shlex.split(common.group(1)) + shlex.split((cuda_on if cuda_arch else cuda_off).group(1)):
        for name, value in variables.items():
            token = token.replace(name, value)
        if not token.startswith("-D") or "$" in token:
            raise BundleError(f"unexpected cmake argument {token!r} in {DOCKERFILE}")
        flags.append(token)
    return flags


# ---------------------------------------------------------------------------------------------- bundle
def _members(sdist: Path, subdir: str) -> Iterator[tuple[str, tarfile.TarInfo, tarfile.TarFile]]:
    with tarfile.open(sdist, "r:gz") as archive:
        prefix = subdir.rstrip("/") + "/"
        for member in archive:
            if member.name.startswith(prefix) and not member.isdir():
                yield member.name[len(prefix) :], member, archive


def write_source_bundle(sdist: Path, out_dir: Path) -> dict[str, Any]:
    """Verify the sdist, write the trimmed tree + manifest; return the manifest."""
    pin = pins()
    actual = sha256_file(sdist)
    if actual != pin["sha256"]:
        raise BundleError(
            f"{sdist}: sha256 {actual} is not the pinned {pin['sha256']} ({PINS_FILE.relative_to(REPO)}); "
            "refusing to bundle an unverified source"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, dict[str, Any]] = {}
    dropped: dict[str, list[int]] = {pattern: [0, 0] for pattern in EXCLUDED}
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as bundle:
        for rel, member, archive in _members(sdist, pin["subdir"]):
            if not member.isfile():
                raise BundleError(f"{member.name}: not a regular file ({member.type!r}); the bundle holds files only")
            pattern = excluded(rel)
            if pattern:
                dropped[pattern][0] += 1
                dropped[pattern][1] += member.size
                continue
            data = archive.extractfile(member).read()  # type: ignore[union-attr]
            mode = 0o755 if member.mode & 0o111 else 0o644
            files[rel] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "mode": f"{mode:o}"}
            info = tarfile.TarInfo(f"llama.cpp/{rel}")
            info.size, info.mode, info.mtime, info.uname, info.gname = len(data), mode, 0, "", ""
            bundle.addfile(info, io.BytesIO(data))
    for must in ("CMakeLists.txt", "tools/server/CMakeLists.txt", "ggml/src/ggml-cuda/CMakeLists.txt", *KEPT):
        if must not in files:
            raise BundleError(f"the trimmed tree lacks {must}")
    tarball = out_dir / SRC_TARBALL
    with tarball.open("wb") as handle, gzip.GzipFile(fileobj=handle, mode="wb", compresslevel=9, mtime=0) as gz:
        gz.write(raw.getvalue())
    manifest = {
        "format": 1,
        "source": {"file": sdist.name, "sha256": actual, "subdir": pin["subdir"]},
        "commit": pin["commit"],
        "build_number": pin["build_number"],
        "bundle": {"file": SRC_TARBALL, "sha256": sha256_file(tarball), "size": tarball.stat().st_size},
        "kept": {"files": len(files), "bytes": sum(f["size"] for f in files.values())},
        "excluded": {
            pattern: {"why": EXCLUDED[pattern], "files": count, "bytes": size}
            for pattern, (count, size) in dropped.items()
        },
        "files": dict(sorted(files.items())),
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def verify_bundle(bundle_dir: Path, dest: Path) -> dict[str, Any]:
    """Check the tarball's hash, unpack it into dest/llama.cpp, check the file set and every file's sha256."""
    started = time.monotonic()
    manifest = json.loads((bundle_dir / MANIFEST).read_text())
    tarball = bundle_dir / manifest["bundle"]["file"]
    actual = sha256_file(tarball)
    if actual != manifest["bundle"]["sha256"]:
        raise BundleError(f"{tarball}: sha256 {actual}, manifest says {manifest['bundle']['sha256']}")
    root = dest / "llama.cpp"
    if root.exists():
        shutil.rmtree(root)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball, "r:gz") as archive:
        for member in archive.getmembers():
            if not member.isfile() or not member.name.startswith("llama.cpp/") or ".." in member.name.split("/"):
                raise BundleError(f"{tarball}: unexpected member {member.name!r}")
        archive.extractall(dest, filter="data")
    expected: dict[str, dict[str, Any]] = manifest["files"]
    present = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()}
    missing, extra = sorted(set(expected) - present), sorted(present - set(expected))
    bad = [rel for rel in sorted(set(expected) & present) if sha256_file(root / rel) != expected[rel]["sha256"]]
    if missing or extra or bad:
        raise BundleError(
            f"the unpacked tree differs from the manifest: {len(missing)} missing {missing[:5]}, "
            f"{len(extra)} extra {extra[:5]}, {len(bad)} with another sha256 {bad[:5]}"
        )
    return {
        "tree": str(root),
        "files": len(expected),
        "bytes": sum(f["size"] for f in expected.values()),
        "bundle_sha256": actual,
        "source_sha256": manifest["source"]["sha256"],
        "commit": manifest["commit"],
        "build_number": manifest["build_number"],
        "seconds": round(time.monotonic() - started, 2),
    }


# ---------------------------------------------------------------------------------------------- wheels, models
def venv_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


# What the device's Python lacks for ansible-playbook + testinfra (KINDS.md lists jinja2, pyyaml, packaging,
# markupsafe, pytest there). Versions: the kit's .venv's.
WHEELS = ("ansible-core", "resolvelib", "cryptography", "cffi", "pycparser", "pytest-testinfra")
WHEEL_PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def download_wheels(out_dir: Path) -> list[str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.whl"):
        old.unlink()
    specs = [f"{name}=={venv_version(name)}" for name in WHEELS]
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    argv += ["--python-version", "3.12", "--implementation", "cp", "-d", str(out_dir)]
    for platform in WHEEL_PLATFORMS:
        argv += ["--platform", platform]
    subprocess.run([*argv, *specs], check=True)
    return sorted(p.name for p in out_dir.glob("*.whl"))


def write_models(out_dir: Path) -> dict[str, str]:
    sys.path.insert(0, str(REPO))
    from rigkit.sandbox.tiny_gemma4 import write_pair

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = write_pair(out_dir / "tiny-gemma4.gguf", out_dir / "tiny-gemma4-assistant.gguf")
    return {p.name: sha256_file(p) for p in paths}


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def cmd_bundle(args: argparse.Namespace) -> int:
    out = Path(args.out)
    t0 = time.monotonic()
    manifest = write_source_bundle(sdist_of(args), out)
    wheels = [] if args.no_wheels else download_wheels(out / "wheels")
    models = write_models(out / "models")
    summary = {
        "source": manifest["source"],
        "bundle": manifest["bundle"],
        "kept": manifest["kept"],
        "excluded": {k: v for k, v in manifest["excluded"].items() if v["files"]},
        "wheels": wheels,
        "models": models,
        "device_dir_bytes": dir_size(out),
        "seconds": round(time.monotonic() - t0, 1),
    }
    (out / "bundle.json").write_text(json.dumps(summary, indent=1) + "\n")
    summary["device_dir_bytes"] = dir_size(out)
    print(json.dumps({k: v for k, v in summary.items() if k != "excluded"}, indent=1))
    print(f"{out}: {summary['device_dir_bytes'] / 2**20:.1f} MiB")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    try:
        result = verify_bundle(Path(args.bundle_dir), Path(args.dest))
    except (BundleError, OSError, KeyError, ValueError) as exc:
        print(json.dumps({"ok": False, "error": str(exc)}))
        return 1
    print(json.dumps({"ok": True, **result}))
    return 0


def cmd_flags(args: argparse.Namespace) -> int:
    manifest = json.loads((Path(args.bundle_dir) / MANIFEST).read_text())
    flags = dockerfile_cmake_flags(
        cuda_arch=args.cuda_arch, commit=manifest["commit"], build_number=manifest["build_number"]
    )
    print("\n".join(flags))
    return 0


IMAGE_DIR = "image"
IMAGE_BINARY = "/app/llama-server"
IMAGE_BUILD_INFO = "/app/BUILD_INFO"


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True).stdout.strip()


def cmd_image(args: argparse.Namespace) -> int:
    """The image's llama-server (gzipped) and BUILD_INFO under BUNDLE/image/, described by image.json."""
    out = Path(args.bundle_dir) / IMAGE_DIR
    try:
        image_id = _docker("image", "inspect", "--format", "{{.Id}}", args.image)
    except subprocess.CalledProcessError as exc:
        raise BundleError(f"no image {args.image} here ({exc.stderr.strip()}): build it with make image") from exc
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    container = _docker("create", args.image)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            _docker("cp", f"{container}:{IMAGE_BINARY}", f"{tmp}/llama-server")
            _docker("cp", f"{container}:{IMAGE_BUILD_INFO}", str(out / "BUILD_INFO"))
            binary = Path(tmp, "llama-server")
            digest, size = sha256_file(binary), binary.stat().st_size
            with binary.open("rb") as src, gzip.GzipFile(out / "llama-server.gz", "wb", mtime=0) as dst:
                shutil.copyfileobj(src, dst, CHUNK)
    finally:
        _docker("rm", container)
    build_info = dict(line.split("=", 1) for line in (out / "BUILD_INFO").read_text().splitlines() if "=" in line)
    if build_info.get("GGML_CUDA") != "ON":
        raise BundleError(f"{args.image} is not a CUDA build (BUILD_INFO: GGML_CUDA={build_info.get('GGML_CUDA')})")
    summary = {"image": args.image, "image_id": image_id, "binary_sha256": digest, "binary_bytes": size,
               "build_info": build_info, "gz_bytes": (out / "llama-server.gz").stat().st_size}  # fmt: skip
    (out / "image.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


# ---------------------------------------------------------------------------------------------- prove
def _run(argv: list[str], log: Path, **kwargs: Any) -> tuple[int, float]:
    started = time.monotonic()
    with log.open("a") as handle:
        handle.write(f"\n$ {shlex.join(argv)}\n")
        handle.flush()
        proc = subprocess.run(argv, stdout=handle, stderr=subprocess.STDOUT, check=False, **kwargs)
    return proc.returncode, round(time.monotonic() - started, 1)


@contextlib.contextmanager
def _stand_in_cublas() -> Iterator[list[str]]:
    """Empty cuBLAS files, only so that a CUDA configure can run on a machine without cuBLAS (no compiling)."""
    with tempfile.TemporaryDirectory(prefix="cublas-stand-in-") as tmp:
        lib = Path(tmp)
        for name in ("libcublas.so", "libcublasLt.so", "libcuda.so"):
            (lib / name).write_bytes(b"")
        yield [f"-DCUDA_cublas_LIBRARY={lib}/libcublas.so", f"-DCUDA_cublasLt_LIBRARY={lib}/libcublasLt.so"] + (
            []
            if Path("/usr/local/cuda/lib64/stubs/libcuda.so").exists()
            else [f"-DCUDA_cuda_driver_LIBRARY={lib}/libcuda.so"]
        )


def scan_cuda_includes(build: Path, tree: Path, log: Path) -> dict[str, Any]:
    """Preprocess (nvcc -M) every CUDA source of the llama-server target: each #include must resolve in the tree."""
    started = time.monotonic()
    commands = subprocess.run(
        ["ninja", "-C", str(build), "-t", "commands", "llama-server"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    with tempfile.TemporaryDirectory(prefix="cublas-headers-") as stand_in:
        for header in ("cublas_v2.h", "cublas_api.h", "cublasLt.h"):
            Path(stand_in, header).write_text("")
        jobs = []
        for command in commands:
            if " -x cu -c " not in command:
                continue
            command = re.sub(r" -MD -MT \S+ -MF \S+", "", command)
            command = re.sub(r" -o \S+$", "", command).replace(" -x cu -c ", f" -I{stand_in} -x cu -M ")
            jobs.append(command)
        failed: list[str] = []
        read: set[str] = set()
        running: list[tuple[str, subprocess.Popen[str]]] = []
        root = str(tree.resolve()) + "/"

        def reap(job: tuple[str, subprocess.Popen[str]]) -> None:
            command, proc = job
            out, err = proc.communicate()
            if proc.returncode != 0:
                failed.append(command.rsplit(" ", 1)[-1])
                with log.open("a") as handle:
                    handle.write(f"\n$ {command}\n{err}\n")
            for path in out.replace("\\\n", " ").split()[2:]:
                resolved = os.path.normpath(path)
                if resolved.startswith(root):
                    read.add(resolved[len(root) :])

        for command in jobs:
            while len(running) >= (os.cpu_count() or 2):
                reap(running.pop(0))
            proc = subprocess.Popen(  # noqa: S602 - ninja's own command line, from our build dir
                command, shell=True, cwd=build, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            running.append((command, proc))
        for job in running:
            reap(job)
    return {
        "sources": len(jobs),
        "failed": failed,
        "tree_files_read": len(read),
        "tree_files_read_excluded": sorted(r for r in read if excluded(r)),
        "seconds": round(time.monotonic() - started, 1),
    }


def cmd_prove(args: argparse.Namespace) -> int:
    """Configure the full and the trimmed tree with the Dockerfile's flags (and a CUDA configure); optionally build."""
    bundle_dir = Path(args.bundle_dir)
    manifest = json.loads((bundle_dir / MANIFEST).read_text())
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    log = work / "prove.log"
    log.write_text("")
    generator = ["-G", args.generator] if args.generator else []
    report: dict[str, Any] = {"work": str(work), "log": str(log), "steps": {}}

    trimmed = verify_bundle(bundle_dir, work / "trimmed")
    report["steps"]["verify"] = trimmed
    full = work / "full"
    if not (full / "llama.cpp" / "CMakeLists.txt").exists():
        full.mkdir(exist_ok=True)
        sdist = sdist_of(args)
        with tarfile.open(sdist, "r:gz") as archive:
            subdir = manifest["source"]["subdir"].rstrip("/") + "/"
            members = [m for m in archive.getmembers() if m.name.startswith(subdir)]
            for member in members:
                member.name = "llama.cpp/" + member.name[len(subdir) :]
            archive.extractall(full, members=members, filter="data")
        with contextlib.suppress(FileNotFoundError):
            (full / "llama.cpp" / ".git").unlink()
    cpu = dockerfile_cmake_flags(cuda_arch=None, commit=manifest["commit"], build_number=manifest["build_number"])
    cuda = dockerfile_cmake_flags(
        cuda_arch=args.cuda_arch, commit=manifest["commit"], build_number=manifest["build_number"]
    )
    ok = True
    configs = [("full-cpu", full, cpu, []), ("trimmed-cpu", work / "trimmed", cpu, [])]
    if shutil.which("nvcc") and not args.no_cuda:
        configs.append(("trimmed-cuda", work / "trimmed", cuda, ["stand-in-cublas"]))
        configs.append(("full-cuda", full, cuda, ["stand-in-cublas"]))
    for name, tree, flags, extras in configs:
        build = work / f"build-{name}"
        shutil.rmtree(build, ignore_errors=True)
        with contextlib.ExitStack() as stack:
            extra = stack.enter_context(_stand_in_cublas()) if extras else []
            rc, secs = _run(["cmake", "-S", str(tree / "llama.cpp"), "-B", str(build), *generator, *flags, *extra], log)
        cache = (build / "CMakeCache.txt").read_text() if (build / "CMakeCache.txt").exists() else ""
        step: dict[str, Any] = {"rc": rc, "seconds": secs, "flags": flags + extra}
        if generator == ["-G", "Ninja"] and rc == 0:
            # every file the llama-server target's build graph names inside the source tree
            inputs = subprocess.run(
                ["ninja", "-C", str(build), "-t", "inputs", "llama-server"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.split()
            root = str((tree / "llama.cpp").resolve()) + "/"
            in_tree = sorted(
                {i[len(root) :] for i in (str(Path(build, i).resolve()) for i in inputs) if i.startswith(root)}
            )
            step["target_inputs"] = in_tree
            step["target_inputs_in_tree"] = len(in_tree)
            step["target_inputs_excluded"] = [i for i in in_tree if excluded(i)]
            step["cuda_sources"] = sum(1 for i in in_tree if i.endswith(".cu"))
        step["ggml_cuda"] = "GGML_CUDA:BOOL=ON" in cache
        report["steps"][f"configure-{name}"] = step
        ok = ok and rc == 0 and not step.get("target_inputs_excluded")
    for kind in ("cpu", "cuda"):
        steps = report["steps"]
        if f"configure-full-{kind}" in steps and "target_inputs" in steps[f"configure-full-{kind}"]:
            same = steps[f"configure-full-{kind}"].pop("target_inputs") == steps[f"configure-trimmed-{kind}"].pop(
                "target_inputs"
            )
            steps[f"configure-trimmed-{kind}"]["target_inputs_same_as_full_tree"] = same
            ok = ok and same
    if "configure-trimmed-cuda" in report["steps"] and generator == ["-G", "Ninja"] and not args.no_scan:
        scan = scan_cuda_includes(work / "build-trimmed-cuda", work / "trimmed" / "llama.cpp", log)
        report["steps"]["scan-cuda-includes"] = scan
        ok = ok and not scan["failed"] and not scan["tree_files_read_excluded"]
    if args.build:
        build = work / "build-trimmed-cpu"
        rc, secs = _run(
            ["cmake", "--build", str(build), "--config", "Release", "--target", "llama-server", f"-j{os.cpu_count()}"],
            log,
        )
        binary = build / "bin" / "llama-server"
        version = ""
        if rc == 0 and binary.exists():
            version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False).stderr
        step = {"rc": rc, "seconds": secs, "version": version.strip()}
        if rc == 0 and generator == ["-G", "Ninja"]:
            # every source and header the compilers read (their depfiles), relative to the tree
            deps = subprocess.run(
                ["ninja", "-C", str(build), "-t", "deps"], capture_output=True, text=True, check=False
            ).stdout
            root = str((work / "trimmed" / "llama.cpp").resolve()) + "/"
            read = {
                os.path.normpath(line.strip())[len(root) :]
                for line in deps.splitlines()
                if line.startswith("    ") and os.path.normpath(line.strip()).startswith(root)
            }
            step["tree_files_read"] = len(read)
            step["tree_files_read_excluded"] = sorted(r for r in read if excluded(r))
            ok = ok and not step["tree_files_read_excluded"]
        report["steps"]["build-trimmed-cpu"] = step
        ok = ok and rc == 0 and f"build {manifest['build_number']}" in version
    report["ok"] = ok
    (bundle_dir / "trim-proof.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("bundle", help="write .device/ (source bundle + manifest, wheels, models)")
    p.add_argument("--sdist", help=f"default: the kit's cache, llamacpp/{SDIST_NAME}")
    p.add_argument("--out", default=str(DEVICE_DIR))
    p.add_argument("--no-wheels", action="store_true")
    p.set_defaults(func=cmd_bundle)
    p = sub.add_parser("verify", help="unpack the bundle into DEST/llama.cpp and check it against the manifest")
    p.add_argument("--bundle-dir", default=str(DEVICE_DIR))
    p.add_argument("--dest", required=True)
    p.set_defaults(func=cmd_verify)
    p = sub.add_parser("flags", help="docker/Dockerfile's cmake flags, one per line")
    p.add_argument("--bundle-dir", default=str(DEVICE_DIR))
    p.add_argument("--cuda-arch", help="CMAKE_CUDA_ARCHITECTURES (e.g. 90); omitted: the CPU build's flags")
    p.set_defaults(func=cmd_flags)
    p = sub.add_parser("image", help="the llama-server of a CUDA image the kit built, for the device to run")
    p.add_argument("--bundle-dir", default=str(DEVICE_DIR))
    p.add_argument("--image", required=True, help="e.g. rigkit/llama-server:b11312-0c1e570-cuda-sm86-667068a2a8ac")
    p.set_defaults(func=cmd_image)
    p = sub.add_parser("prove", help="configure the full and the trimmed tree (and build the trimmed one)")
    p.add_argument("--bundle-dir", default=str(DEVICE_DIR))
    p.add_argument("--sdist", help=f"default: the kit's cache, llamacpp/{SDIST_NAME}")
    p.add_argument("--work", default="/tmp/rigkit-trim-proof")
    p.add_argument("--cuda-arch", default="90")
    p.add_argument("--generator", default="Ninja", help="cmake generator ('' = cmake's default)")
    p.add_argument("--no-cuda", action="store_true")
    p.add_argument("--no-scan", action="store_true", help="skip the nvcc -M include scan of the CUDA sources")
    p.add_argument("--build", action="store_true", help="also build llama-server (CPU) from the trimmed tree")
    p.set_defaults(func=cmd_prove)
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["bundle", *(argv or sys.argv[1:])])
    try:
        return int(args.func(args))
    except BundleError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
