"""Stand-in CUDA base images from NVIDIA's PyPI wheels, for machines that cannot reach Docker Hub's nvidia/cuda.

``build_images(base_image)`` downloads the wheels pinned in docker/cuda-standin/wheels.json (pip, no
dependencies, binary only), refuses any whose sha256 differs, lays their files out as NVIDIA's images do
(bin/, nvvm/, targets/x86_64-linux/{include,lib}) and builds the devel and runtime images of
docker/cuda-standin/Dockerfile on the kit's Debian base. The tags are content-addressed
(``rigkit/cuda:<version>-devel-<base>-<digest>``): an unchanged recipe builds nothing. The production bases stay
nvidia/cuda by digest (roles/llamacpp_image); these only prove the Dockerfile's CUDA path where no registry is.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ansible.module_utils.fetch.hash import sha256_file

from rigkit import REPO
from rigkit.paths import cache_dir

RECIPE = REPO / "docker" / "cuda-standin"
PINS = RECIPE / "wheels.json"
REPOSITORY = "rigkit/cuda"
# Where each wheel's top directory lands in the image's CUDA tree.
LAYOUT = {"bin": "bin", "nvvm": "nvvm", "include": "targets/x86_64-linux/include", "lib": "targets/x86_64-linux/lib"}
CHUNK = 1 << 20
# What the runtime image keeps of the wheels: the shared CUDA runtime and cuBLAS, as NVIDIA's runtime images.
RUNTIME_LIBRARIES = ("libcudart.so.", "libcublas.so.", "libcublasLt.so.")


class StandinError(Exception):
    """A wheel could not be fetched or verified, or an image did not build; the message says what to do."""


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    image: str  # devel, or both (devel and runtime)
    sha256: str


@dataclass(frozen=True)
class StandinImages:
    cuda_version: str
    devel: str
    runtime: str
    wheels: dict[str, str]  # file name -> sha256

    def as_json(self) -> str:
        return json.dumps(
            {"cuda_version": self.cuda_version, "devel": self.devel, "runtime": self.runtime, "wheels": self.wheels},
            indent=2,
            sort_keys=True,
        )


def pins(path: Path = PINS) -> tuple[str, list[Wheel]]:
    data = json.loads(path.read_text())
    return str(data["cuda_version"]), [
        Wheel(str(w["name"]), str(w["version"]), str(w["image"]), str(w["sha256"])) for w in data["wheels"]
    ]


def fetch_wheels(wheels: list[Wheel], into: Path) -> dict[str, Path]:
    """Each pinned wheel in ``into`` (downloaded once), verified: {name: path}. A wheel whose sha256 differs is
    removed and refused."""
    into.mkdir(parents=True, exist_ok=True)
    found: dict[str, Path] = {}
    for wheel in wheels:
        prefix = wheel.name.replace("-", "_") + "-" + wheel.version + "-"
        present = sorted(into.glob(prefix + "*.whl"))
        if not present:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps", "--only-binary",
                 ":all:", "--dest", str(into), f"{wheel.name}=={wheel.version}"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            present = sorted(into.glob(prefix + "*.whl"))
            if done.returncode != 0 or not present:
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                raise StandinError(
                    f"cannot download {wheel.name}=={wheel.version} from the package index: {' / '.join(tail)}; "
                    f"check the pin in {PINS.relative_to(REPO)} and the machine's pip configuration"
                )
        path = present[0]
        actual = sha256_file(str(path))
        if actual != wheel.sha256:
            path.unlink()
            raise StandinError(
                f"{path.name}: sha256 {actual}, but {PINS.relative_to(REPO)} pins {wheel.sha256} for "
                f"{wheel.name}=={wheel.version}; the file was removed (a tampered mirror, or a wrong pin)"
            )
        found[wheel.name] = path
    return found


def _unpack(wheel: Path, tree: Path, only_libs: bool) -> None:
    """The wheel's nvidia/cuNN/<top>/... files under ``tree`` per LAYOUT (only RUNTIME_LIBRARIES for the runtime
    image), keeping their mode bits; anything outside LAYOUT (metadata, dist-info) is left out."""
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            parts = Path(info.filename).parts
            if info.is_dir() or len(parts) < 4 or parts[0] != "nvidia" or parts[2] not in LAYOUT:
                continue
            top, rest = parts[2], Path(*parts[3:])
            if only_libs and (top != "lib" or not rest.name.startswith(RUNTIME_LIBRARIES)):
                continue
            target = tree / rest if only_libs else tree / LAYOUT[top] / rest
            if ".." in rest.parts:
                raise StandinError(f"{wheel.name}: refusing the path {info.filename}")
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as source, target.open("wb") as out:
                shutil.copyfileobj(source, out, CHUNK)
            mode = (info.external_attr >> 16) & 0o777
            target.chmod(mode if mode else (0o755 if top == "bin" else 0o644))


def recipe_digest(wheels: list[Wheel], base_image_id: str) -> str:
    digest = hashlib.sha256()
    for path in sorted(RECIPE.iterdir()):
        if path.is_file() and path.suffix != ".md":
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(Path(__file__).read_bytes())  # how the wheels are laid out
    digest.update(json.dumps([w.__dict__ for w in wheels], sort_keys=True).encode())
    digest.update(base_image_id.encode())
    return digest.hexdigest()[:12]


def _docker(*argv: str, log: Path | None = None) -> subprocess.CompletedProcess[str]:
    if log is None:
        return subprocess.run(["docker", *argv], capture_output=True, text=True, check=False)
    with log.open("a") as out:
        return subprocess.run(["docker", *argv], stdout=out, stderr=subprocess.STDOUT, text=True, check=False)


def _image_exists(tag: str) -> bool:
    return _docker("image", "inspect", "--format", "{{.Id}}", tag).returncode == 0


def build_images(base_image: str, *, cache: Path | None = None) -> StandinImages:
    """Build (or find) the devel and runtime stand-ins on ``base_image`` (the kit's Debian base)."""
    cuda_version, wheels = pins()
    inspected = _docker("image", "inspect", "--format", "{{.Id}}", base_image)
    if inspected.returncode != 0:
        raise StandinError(f"base image {base_image} is not in the engine: run `make harness` first")
    digest = recipe_digest(wheels, inspected.stdout.strip())
    base_name = base_image.split("/")[-1].split(":")[-1].split("-")[0]
    tags = {target: f"{REPOSITORY}:{cuda_version}-{target}-{base_name}-{digest}" for target in ("devel", "runtime")}
    work = (cache or cache_dir()) / "cuda-standin"
    paths = fetch_wheels(wheels, work / "wheels")
    verified = {paths[wheel.name].name: wheel.sha256 for wheel in wheels}  # fetch_wheels refused any other
    images = StandinImages(cuda_version, tags["devel"], tags["runtime"], verified)
    if all(_image_exists(tag) for tag in tags.values()):
        return images
    major_minor = ".".join(cuda_version.split(".")[:2])
    with tempfile.TemporaryDirectory(dir=work, prefix="context-") as scratch:
        context = Path(scratch)
        shutil.copy2(RECIPE / "Dockerfile", context / "Dockerfile")
        for wheel in wheels:
            _unpack(paths[wheel.name], context / "cuda", only_libs=False)
            if wheel.image == "both":
                _unpack(paths[wheel.name], context / "runtime", only_libs=True)
        for target, tag in tags.items():
            log = work / f"build-{target}-{digest}.log"
            built = _docker(
                "build", "--network", "host", "--target", target, "--tag", tag,
                "--build-arg", f"BASE_IMAGE={base_image}", "--build-arg", f"CUDA_VERSION={cuda_version}",
                "--build-arg", f"CUDA_MAJOR_MINOR={major_minor}",
                "--label", f"io.rigkit.cuda-standin.wheels={json.dumps(images.wheels, sort_keys=True)}",
                "--label", f"io.rigkit.cuda-standin.base-image={base_image}",
                str(context), log=log,
            )  # fmt: skip
            if built.returncode != 0:
                tail = log.read_text(errors="replace").strip().splitlines()[-5:]
                raise StandinError(f"building {tag} failed (log {log}): " + " / ".join(tail))
    return images
