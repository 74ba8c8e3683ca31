"""Verify the cuda role in a systemd rig container: Debian 12's real nvidia-cuda-toolkit 11.8, held, nvcc works."""

from __future__ import annotations


def test_toolkit_installed_at_the_pin_and_held(host):
    package = host.package("nvidia-cuda-toolkit")
    assert package.is_installed
    assert package.version.startswith("11.8.89~11.8.0-")
    assert host.check_output("dpkg-query -W -f='${db:Status-Want}' nvidia-cuda-toolkit") == "hold"


def test_nvcc_reports_the_pinned_release(host):
    out = host.check_output("nvcc --version")
    assert "release 11.8," in out


def test_nvcc_compiles_without_a_gpu(host):
    # Compiling needs no GPU: a real kernel builds to PTX for the rigs' architectures, with the host
    # compiler nvcc 11.8 supports (nvidia-cuda-toolkit-gcc's cuda-g++ = g++-11; bookworm's gcc 12 is too new).
    host.check_output(
        "printf '__global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\\n' > /tmp/k.cu"
        " && nvcc -ccbin cuda-g++ --ptx -arch=sm_75 -o /tmp/k.ptx /tmp/k.cu"
    )
    assert ".target sm_75" in host.file("/tmp/k.ptx").content_string
