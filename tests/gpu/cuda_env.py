"""Find what a GGML_CUDA=ON build needs on this machine, wherever it lives (standard library only).

    python3 tests/gpu/cuda_env.py --work DIR          # JSON: what was found where, cmake_args, ld_library_path

nvcc's own toolkit (``nvcc --dryrun`` names its include and library dirs) is used as it is when it has cuBLAS.
A toolkit assembled from NVIDIA's pip wheels may lack cuBLAS while a Python package (PyTorch) brought it as a
wheel (``site-packages/nvidia/cu13/{include,lib}``); then the cuBLAS headers are linked one by one into
DIR/cublas-include (not the wheel's whole include dir: its CUDA runtime headers could differ from nvcc's) and
the libraries are handed to FindCUDAToolkit as cache variables (CUDA_cublas_LIBRARY, ...). The same is done for
the CUDA runtime and the driver library (libcuda) when the toolkit has neither the library nor its stub
(RIGKIT_LIBCUDA_DIRS, a colon-separated list, is searched first for libcuda).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path
from typing import Any

WHEEL_DIRS = ("nvidia/cu13", "nvidia/cublas", "nvidia/cu12", "nvidia/cuda_runtime")
SYSTEM_DIRS = ("/usr/local/cuda", "/usr/local/nvidia", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/opt")


def nvcc_layout(nvcc: str) -> dict[str, Any]:
    """nvcc's version, toolkit root, include and library dirs (from its --dryrun variables)."""
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout
    dry = subprocess.run(
        [nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull], capture_output=True, text=True, check=False
    ).stderr
    variables = dict(re.findall(r"^#\$ (\w+)=(.*)$", dry, re.MULTILINE))
    includes = [os.path.normpath(p) for p in re.findall(r'-I"?([^" ]+)', variables.get("INCLUDES", ""))]
    libraries = [os.path.normpath(p) for p in re.findall(r'-L"?([^" ]+)', variables.get("LIBRARIES", ""))]
    match = re.search(r"release (\d+\.\d+)", version)
    return {
        "nvcc": nvcc,
        "version": match.group(1) if match else None,
        "root": os.path.normpath(variables.get("TOP", str(Path(nvcc).parent.parent))),
        "include_dirs": includes,
        "library_dirs": libraries,
    }


def _libs(directory: str, name: str) -> list[str]:
    """libNAME.so, else the highest libNAME.so.N in directory."""
    plain = os.path.join(directory, f"lib{name}.so")
    if os.path.exists(plain):
        return [plain]
    return sorted(glob.glob(os.path.join(directory, f"lib{name}.so.[0-9]*")), key=len)[:1]


def find_library(name: str, dirs: list[str], *, walk: bool = True) -> str | None:
    for directory in dirs:
        found = _libs(directory, name)
        if found:
            return found[0]
    if walk:
        for base in SYSTEM_DIRS:
            for root, subdirs, _files in os.walk(base):
                if root.count(os.sep) - base.count(os.sep) >= 6:
                    subdirs.clear()
                found = _libs(root, name)
                if found:
                    return found[0]
    return None


def wheel_dirs() -> list[str]:
    paths = [*sys.path, *site.getsitepackages(), site.getusersitepackages()]
    out = []
    for path in dict.fromkeys(p for p in paths if p and os.path.isdir(p)):
        out += [os.path.join(path, sub) for sub in WHEEL_DIRS if os.path.isdir(os.path.join(path, sub))]
    return out


def detect(work: Path) -> dict[str, Any]:
    nvcc = shutil.which("nvcc")
    on_path = nvcc is not None
    if nvcc is None and os.path.exists("/usr/local/cuda/bin/nvcc"):
        nvcc = "/usr/local/cuda/bin/nvcc"
    if nvcc is None:
        return {"ok": False, "error": "no nvcc on PATH or in /usr/local/cuda/bin", "cmake_args": []}
    layout = nvcc_layout(nvcc)
    toolkit_lib_dirs = layout["library_dirs"] + [os.path.join(layout["root"], d) for d in ("lib64", "lib")]
    wheels = wheel_dirs()
    wheel_libs = [os.path.join(w, "lib") for w in wheels]
    report: dict[str, Any] = {"ok": True, "toolkit": layout, "wheel_dirs": wheels, "cmake_args": []}
    if not on_path:
        report["cmake_args"].append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
    ld_path: list[str] = []

    toolkit_header = any(os.path.exists(os.path.join(d, "cublas_v2.h")) for d in layout["include_dirs"])
    toolkit_cublas = find_library("cublas", toolkit_lib_dirs, walk=False)
    if toolkit_header and toolkit_cublas:
        report["cublas"] = {"from": "toolkit", "library": toolkit_cublas}
    else:
        header_dir = next(
            (os.path.join(w, "include") for w in wheels if os.path.exists(os.path.join(w, "include", "cublas_v2.h"))),
            None,
        )
        cublas = find_library("cublas", wheel_libs)
        cublas_lt = find_library("cublasLt", [os.path.dirname(cublas)] if cublas else wheel_libs)
        if not (header_dir and cublas and cublas_lt):
            report.update(
                ok=False, error=f"no cuBLAS: headers {header_dir}, libcublas {cublas}, libcublasLt {cublas_lt}"
            )
            return report
        private = work / "cublas-include"
        shutil.rmtree(private, ignore_errors=True)
        private.mkdir(parents=True)
        for header in sorted(glob.glob(os.path.join(header_dir, "cublas*.h"))):
            (private / os.path.basename(header)).symlink_to(header)
        report["cublas"] = {"from": "wheel", "headers": header_dir, "library": cublas, "lt_library": cublas_lt}
        report["cmake_args"] += [
            f"-DCUDA_cublas_LIBRARY={cublas}",
            f"-DCUDA_cublasLt_LIBRARY={cublas_lt}",
            f"-DCMAKE_CUDA_FLAGS=-isystem {private}",
            f"-DCMAKE_CXX_FLAGS=-isystem {private}",
        ]
        ld_path.append(os.path.dirname(cublas))

    cudart = find_library("cudart", toolkit_lib_dirs, walk=False)
    if cudart is None:
        cudart = find_library("cudart", wheel_libs)
        if cudart is None:
            report.update(ok=False, error="no libcudart in the toolkit or a wheel")
            return report
        report["cmake_args"].append(f"-DCUDA_CUDART={cudart}")
    report["cudart"] = cudart
    ld_path.append(os.path.dirname(cudart))

    stub = find_library("cuda", [os.path.join(d, "stubs") for d in toolkit_lib_dirs] + toolkit_lib_dirs, walk=False)
    extra = [d for d in os.environ.get("RIGKIT_LIBCUDA_DIRS", "").split(":") if d]
    driver = find_library(
        "cuda", [*extra, "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/x86_64-linux-gnu"]
    )
    if stub:
        report["cuda_driver"] = {"from": "toolkit stub", "library": stub, "runtime": driver}
    elif driver:
        report["cuda_driver"] = {"from": "driver", "library": driver}
        report["cmake_args"].append(f"-DCUDA_cuda_driver_LIBRARY={driver}")
    else:
        report.update(ok=False, error="no libcuda (driver) and no stub in the toolkit")
        return report
    if driver:
        ld_path.append(os.path.dirname(driver))
    report["ld_library_path"] = list(dict.fromkeys(ld_path))
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="where to put the private cuBLAS include dir")
    args = parser.parse_args()
    report = detect(args.work)
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
