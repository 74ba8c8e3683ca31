"""rigkit/cuda_standin.py without the network or an engine: the pins are what the recipe builds from, a wheel whose
sha256 differs is refused and removed, and the wheels' files land in NVIDIA's layout with their mode bits (the
images themselves: make proof-cuda-image-sm75)."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from rigkit import cuda_standin
from rigkit.cuda_standin import LAYOUT, StandinError, Wheel, fetch_wheels, pins, recipe_digest


def test_every_pin_is_a_version_and_a_sha256_and_the_runtime_has_cudart_and_cublas() -> None:
    version, wheels = pins()
    assert version.count(".") == 2
    names = {wheel.name for wheel in wheels}
    assert {"nvidia-cuda-nvcc", "nvidia-cuda-runtime", "nvidia-cublas", "nvidia-cuda-cccl", "nvidia-nvvm"} <= names
    assert all(len(wheel.sha256) == 64 and int(wheel.sha256, 16) >= 0 for wheel in wheels)
    assert {wheel.name for wheel in wheels if wheel.image == "both"} == {"nvidia-cuda-runtime", "nvidia-cublas"}


def _wheel(path: Path, files: dict[str, tuple[bytes, int]]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, (data, mode) in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            archive.writestr(info, data)
    return path


def test_a_wheel_whose_sha256_differs_is_refused_and_removed(tmp_path: Path) -> None:
    path = _wheel(tmp_path / "nvidia_cuda_nvcc-13.0.88-py3-none-any.whl", {"nvidia/cu13/bin/nvcc": (b"x", 0o755)})
    pinned = Wheel("nvidia-cuda-nvcc", "13.0.88", "devel", "0" * 64)
    with pytest.raises(StandinError, match=r"sha256 [0-9a-f]{64}, but docker/cuda-standin/wheels.json pins 0{64}"):
        fetch_wheels([pinned], tmp_path)
    assert not path.exists()
    good = _wheel(path, {"nvidia/cu13/bin/nvcc": (b"x", 0o755)})
    matching = Wheel("nvidia-cuda-nvcc", "13.0.88", "devel", hashlib.sha256(good.read_bytes()).hexdigest())
    assert fetch_wheels([matching], tmp_path) == {"nvidia-cuda-nvcc": good}


def test_the_files_land_in_nvidias_layout_with_their_modes(tmp_path: Path) -> None:
    wheel = _wheel(
        tmp_path / "w.whl",
        {
            "nvidia/cu13/bin/nvcc": (b"nvcc", 0o755),
            "nvidia/cu13/include/cuda.h": (b"h", 0o644),
            "nvidia/cu13/lib/libcudart.so.13": (b"so", 0o644),
            "nvidia/cu13/lib/libcudart_static.a": (b"a", 0o644),
            "nvidia/cu13/lib/libnvblas.so.13": (b"so", 0o644),
            "nvidia/cu13/.metadata/x": (b"m", 0o644),
            "nvidia_cuda_runtime-13.0.96.dist-info/METADATA": (b"m", 0o644),
        },
    )
    devel, runtime = tmp_path / "cuda", tmp_path / "runtime"
    cuda_standin._unpack(wheel, devel, only_libs=False)
    cuda_standin._unpack(wheel, runtime, only_libs=True)
    assert (devel / "bin/nvcc").stat().st_mode & 0o777 == 0o755
    assert (devel / LAYOUT["include"] / "cuda.h").is_file()
    assert (devel / LAYOUT["lib"] / "libcudart_static.a").is_file()
    assert sorted(p.relative_to(devel).as_posix() for p in devel.rglob("*") if p.is_file()) == [
        "bin/nvcc",
        "targets/x86_64-linux/include/cuda.h",
        "targets/x86_64-linux/lib/libcudart.so.13",
        "targets/x86_64-linux/lib/libcudart_static.a",
        "targets/x86_64-linux/lib/libnvblas.so.13",
    ]
    assert sorted(p.name for p in runtime.iterdir()) == ["libcudart.so.13"]


def test_the_tag_digest_follows_the_pins_and_the_base() -> None:
    _, wheels = pins()
    base = recipe_digest(wheels, "sha256:aaa")
    assert recipe_digest(wheels, "sha256:aaa") == base
    assert recipe_digest(wheels, "sha256:bbb") != base
    changed = [Wheel(w.name, w.version, w.image, "f" * 64) if i == 0 else w for i, w in enumerate(wheels)]
    assert recipe_digest(changed, "sha256:aaa") != base


def test_the_stand_ins_base_is_the_harness_release_even_beside_another() -> None:
    from rigkit.cli.cuda_standin import pick_base

    tags = ["rigkit/debian:trixie-9a54a2bd95ae", "rigkit/debian:bookworm-15984584e4be", "rigkit/debian:bookworm-salt-x"]
    assert pick_base(tags, "bookworm") == "rigkit/debian:bookworm-15984584e4be"
    with pytest.raises(LookupError, match="no rigkit/debian base image of bookworm"):
        pick_base(["rigkit/debian:trixie-9a54a2bd95ae"], "bookworm")
    with pytest.raises(LookupError, match="several base images"):
        pick_base(["rigkit/debian:bookworm-1", "rigkit/debian:bookworm-2"], "bookworm")
