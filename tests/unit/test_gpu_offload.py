"""module_utils/gpu_offload.py: the verdict the rollout, the rig suite and tests/gpu give on "is the server on the
GPU?". Accepted: the real lines of the recorded H200 CUDA runs (reports/gpu/). Refused: the
lines llama.cpp prints at the pinned tree (0c1e57098) when CUDA finds no device or fails, a real CPU server's whole log
(tests/fixtures/gpu_offload/), and the recorded run with too few layers, no CUDA buffers or too little GPU memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible.module_utils.gpu_offload import (
    CUDA_INIT,
    DRAFTER_LAYERS,
    GPU_MEMORY,
    NO_CUDA_BUFFERS,
    NO_DEVICE,
    NO_LOAD,
    TARGET_LAYERS,
    GpuOffloadError,
    check,
    model_loads,
    parse_compute_apps,
    split_loads,
    wanted_layers,
)

REPO = Path(__file__).resolve().parents[2]
H200 = json.loads((REPO / "reports/gpu/h200-20261129T1929Z.json").read_text())["data"]["smoke"]
# The recorded run's lines (smoke.py kept every CUDA, offload and buffer line of the server's log), exactly.
H200_LINES: list[str] = H200["log"]["notable_lines"]
H200_PID = H200["pid"]
# nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits as it was during that run
H200_APPS = "".join(f"{row['pid']}, {row['used_mib']}\n" for row in H200["nvidia_smi_processes"])
# the preflight's estimate of what the models put on the GPU: its total less the headroom (bytes -> MiB)
_ESTIMATE = H200["preflight"]["estimate"]
H200_EXPECTED_MIB = (_ESTIMATE["total"] - _ESTIMATE["headroom"]) / 1048576

DATA = REPO / "tests/fixtures/gpu_offload"

# What the CUDA build prints at the pinned tree when the container has no device (CUDA_VISIBLE_DEVICES= or no
# /dev/nvidia* in it): ggml-cuda.cu ggml_cuda_init's error with cudaGetErrorString(cudaErrorNoDevice), common/arg.cpp's
# -ngl/-ngld warnings (llama_supports_gpu_offload() is false: no CUDA device registered), and load_tensors without its
# offload lines (printed only when a GPU device exists), the weights in CPU_Mapped buffers.
CUDA_NO_DEVICE = """\
ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected
warning: no usable GPU found, --gpu-layers option will be ignored
warning: one possible reason is that llama.cpp was compiled without GPU support
warning: consult docs/build.md for compilation instructions
warning: no usable GPU found, --gpu-layers-draft option will be ignored
warning: one possible reason is that llama.cpp was compiled without GPU support
warning: consult docs/build.md for compilation instructions
load_tensors: loading model tensors, this can take a while... (load_mode = mmap)
load_tensors:   CPU_Mapped model buffer size =     0.64 MiB
common_speculative_init_result: loading draft model '/var/lib/rigkit/models/tiny-gemma4-assistant.gguf'
load_tensors: loading model tensors, this can take a while... (load_mode = mmap)
load_tensors:   CPU_Mapped model buffer size =     0.16 MiB
"""


def h200(replace: dict[str, str] | None = None, drop: str | None = None) -> list[str]:
    """The recorded lines, with whole lines replaced (first occurrence of each key) or dropped (every line holding
    ``drop``)."""
    lines = list(H200_LINES)
    for old, new in (replace or {}).items():
        at = next(i for i, line in enumerate(lines) if old in line)
        lines[at] = lines[at].replace(old, new)
    return [line for line in lines if drop is None or drop not in line]


# --- accepted -------------------------------------------------------------------------------------------------------
def test_the_recorded_h200_run_is_on_the_gpu():
    verdict = check(H200_LINES, compute_apps=H200_APPS, pid=H200_PID, expected_mib=H200_EXPECTED_MIB)
    assert verdict.on_gpu, verdict.message
    assert verdict.problems == () and verdict.cause is None
    assert verdict.target.offloaded == (5, 5) and verdict.drafter.offloaded == (3, 3)
    assert verdict.target.buffers == {"CPU_Mapped": 0.06, "CUDA0": 0.58}
    assert verdict.drafter.buffers == {"CPU_Mapped": 0.03, "CUDA0": 0.13}
    assert verdict.gpu_memory_mib == 686
    assert "target 5/5 layers" in verdict.message and "drafter 3/3 layers" in verdict.message
    assert "load_tensors: offloaded 5/5 layers to GPU" in "\n".join(verdict.evidence)


def test_the_recorded_run_passes_without_memory_figures():
    assert check(H200_LINES).on_gpu
    assert check("\n".join(H200_LINES) + "\n").on_gpu  # the same as one text


def test_a_partial_offload_that_was_asked_for_is_accepted():
    lines = h200({"offloaded 5/5 layers": "offloaded 3/5 layers"})
    assert check(lines, gpu_layers="3").on_gpu
    assert check(lines, gpu_layers=3).on_gpu
    refused = check(lines, gpu_layers="4")
    assert refused.cause == TARGET_LAYERS and "asks for 4" in refused.message


def test_a_drafter_kept_on_the_cpu_on_purpose_is_accepted():
    lines = h200({"offloaded 3/3 layers": "offloaded 0/3 layers"}, drop="CUDA0 model buffer size =     0.13")
    assert check(lines, gpu_layers_draft="0").on_gpu
    assert check(lines, gpu_layers_draft="all").cause == DRAFTER_LAYERS


def test_without_a_drafter_the_last_load_is_the_target():
    target_only = H200_LINES[: next(i for i, line in enumerate(H200_LINES) if "0.00.384.992" in line)]
    assert check(target_only, drafter=False).on_gpu
    refused = check(target_only, drafter=True)
    assert refused.cause == NO_LOAD and "drafter" in refused.message


# --- refused: no device, CUDA init ------------------------------------------------------------------------------------
def test_a_cuda_build_without_a_device_is_refused_as_no_device():
    verdict = check(CUDA_NO_DEVICE, compute_apps="", pid=4242, expected_mib=1364)
    assert not verdict.on_gpu
    assert verdict.cause == NO_DEVICE
    assert "no CUDA-capable device is detected" in verdict.message and "/dev/nvidia-uvm" in verdict.message
    # the consequences are named too, after the cause
    assert verdict.causes == [NO_DEVICE, TARGET_LAYERS, DRAFTER_LAYERS, NO_CUDA_BUFFERS, NO_CUDA_BUFFERS, GPU_MEMORY]
    assert verdict.target.buffers == {"CPU_Mapped": 0.64} and verdict.drafter.buffers == {"CPU_Mapped": 0.16}


def test_cuda_that_fails_to_initialise_is_refused_with_its_error():
    log = CUDA_NO_DEVICE.replace("no CUDA-capable device is detected", "unknown error")
    verdict = check(log)
    assert verdict.cause == CUDA_INIT
    assert "'ggml_cuda_init: failed to initialize CUDA: unknown error'" in verdict.message
    assert "nvidia-uvm" in verdict.message  # what to do next
    driver = check(log.replace("unknown error", "CUDA driver version is insufficient for CUDA runtime version"))
    assert driver.cause == CUDA_INIT and "insufficient" in driver.message


def test_the_real_log_of_a_cpu_server_is_refused():
    """A real run (2026-12-02) of the sandbox image's CPU build (GGML_CUDA=OFF, the pinned tree) with the tiny Gemma 4
    pair as tests/gpu/offload.py starts it (-ngl all -ngld all, draft-mtp, --verbosity 4): it served and drafted, on the
    CPU. Its whole log, as LocalLlamaServer kept it."""
    log = (DATA / "cpu-build-tiny-gemma4-mtp.log").read_text()
    assert "draft acceptance" in log or "#acc tokens" in log  # it did serve and draft
    verdict = check(log, compute_apps="", pid=12345, expected_mib=H200_EXPECTED_MIB)
    assert not verdict.on_gpu and verdict.cause == NO_DEVICE
    assert "warning: no usable GPU found, --gpu-layers option will be ignored" in verdict.message
    assert "llamacpp_image_cuda" in verdict.message
    assert verdict.target.buffers == {"CPU_Mapped": 0.58} and verdict.drafter.buffers == {"CPU_Mapped": 0.13}
    assert verdict.causes == [NO_DEVICE, TARGET_LAYERS, DRAFTER_LAYERS, NO_CUDA_BUFFERS, NO_CUDA_BUFFERS, GPU_MEMORY]


# The GPU run of 2026-12-04 (reports/gpu/h200-20261204T1830Z-image.json): the llama-server of an earlier CUDA 13.0.2
# build of docker/Dockerfile (sm 86) on the H200, started by tests/gpu/offload.py as the rigs start it,
# as is and with CUDA_VISIBLE_DEVICES= . Both whole logs, with the pid and nvidia-smi's compute apps of each run.
IMAGE_RUN = json.loads((REPO / "reports/gpu/h200-20261204T1830Z-image.json").read_text())["data"]


def test_the_whole_log_of_the_images_server_on_the_h200_is_accepted():
    run = IMAGE_RUN["offload-gpu"]
    log = (DATA / "h200-image-sm86-tiny-gemma4-mtp.log").read_text()
    verdict = check(log, compute_apps=run["compute_apps"], pid=run["pid"], expected_mib=H200_EXPECTED_MIB)
    assert verdict.on_gpu, verdict.message
    assert verdict.target.offloaded == (5, 5) and verdict.drafter.offloaded == (3, 3)
    assert verdict.gpu_memory_mib == 686
    assert "CUDA : ARCHS = 860" in log  # the image's sm 86 build, its kernels JIT-compiled for sm 90


def test_the_whole_log_of_the_same_server_with_the_gpu_hidden_is_refused():
    """CUDA_VISIBLE_DEVICES= : a CUDA build that finds no device serves on the CPU; the check names the cause."""
    run = IMAGE_RUN["offload-cpu"]
    log = (DATA / "h200-image-sm86-cuda-hidden.log").read_text()
    assert "failed to initialize CUDA: no CUDA-capable device is detected" in log
    verdict = check(log, compute_apps=run["compute_apps"], pid=run["pid"], expected_mib=H200_EXPECTED_MIB)
    assert not verdict.on_gpu and verdict.cause == NO_DEVICE
    assert verdict.causes == [NO_DEVICE, TARGET_LAYERS, DRAFTER_LAYERS, NO_CUDA_BUFFERS, NO_CUDA_BUFFERS, GPU_MEMORY]


# --- refused: layers, buffers, memory ---------------------------------------------------------------------------------
def test_too_few_target_layers_are_refused():
    verdict = check(h200({"offloaded 5/5 layers": "offloaded 2/5 layers"}))
    assert verdict.causes == [TARGET_LAYERS]
    assert "the target offloaded 2/5 layers to GPU" in verdict.message and "llama_server_gpu_layers" in verdict.message


def test_too_few_drafter_layers_are_refused_separately():
    verdict = check(h200({"offloaded 3/3 layers": "offloaded 1/3 layers"}))
    assert verdict.causes == [DRAFTER_LAYERS]
    assert "the drafter offloaded 1/3 layers" in verdict.message
    assert "llama_server_gpu_layers_draft" in verdict.message


def test_the_drafter_is_the_load_after_the_draft_marker():
    """With the 'loading draft model' line (a whole log has it), the loads around it are target and drafter, whatever
    comes after (a later load of something else)."""
    at = next(i for i, line in enumerate(H200_LINES) if "0.00.384.992" in line)
    marker = "0.00.384.900 I common_speculative_init_result: loading draft model '/m/tiny-gemma4-assistant.gguf'"
    later = ["load_tensors: offloaded 1/9 layers to GPU", "load_tensors:   CUDA0 model buffer size =     1.00 MiB"]
    lines = [*H200_LINES[:at], marker, *H200_LINES[at:], *later]
    target, drafter = split_loads(model_loads(lines), drafter=True)
    assert (target.offloaded, drafter.offloaded) == ((5, 5), (3, 3))
    assert check(lines).on_gpu


def test_weights_without_cuda_buffers_are_refused():
    verdict = check(h200(drop="CUDA0 model buffer size =     0.58"))
    assert verdict.causes == [NO_CUDA_BUFFERS]
    assert "the target's weights have no CUDA0 model buffer (its model buffers: CPU_Mapped 0.06 MiB)" in verdict.message


def test_a_process_far_below_the_estimate_is_refused():
    verdict = check(H200_LINES, compute_apps=f"{H200_PID}, 686\n", pid=H200_PID, expected_mib=2048)
    assert verdict.causes == [GPU_MEMORY]
    assert f"(pid {H200_PID}) holds 686 MiB" in verdict.message and "2048 MiB" in verdict.message
    assert check(H200_LINES, compute_apps=f"{H200_PID}, 1025\n", pid=H200_PID, expected_mib=2048).on_gpu


def test_a_process_nvidia_smi_does_not_list_is_refused():
    other = "777, 9000\n"
    verdict = check(H200_LINES, compute_apps=other, pid=H200_PID, expected_mib=H200_EXPECTED_MIB)
    assert verdict.causes == [GPU_MEMORY] and "pid 777: 9000 MiB" in verdict.message
    assert check(H200_LINES, compute_apps="", pid=H200_PID).cause == GPU_MEMORY
    # no PID to attribute: any process on the GPU counts
    assert check(H200_LINES, compute_apps=other).on_gpu


def test_a_log_without_any_load_is_refused():
    verdict = check("main: HTTP server is listening, hostname: 127.0.0.1, port: 8080\n")
    assert verdict.cause == NO_LOAD and "current run" in verdict.message


# --- helpers ----------------------------------------------------------------------------------------------------------
def test_compute_apps_are_summed_per_pid_and_tolerate_na():
    assert parse_compute_apps("5110, 686\n5110, 14\n12, [N/A]\n\nNo running processes found\n") == {5110: 700, 12: None}
    # listed without a figure: present, so not refused for memory
    assert check(H200_LINES, compute_apps=f"{H200_PID}, [N/A]\n", pid=H200_PID, expected_mib=9999).on_gpu


@pytest.mark.parametrize(
    ("setting", "total", "wanted"),
    [("all", 5, 5), ("auto", 5, 5), (None, 5, 5), ("-1", 5, 5), (-2, 5, 5), ("3", 5, 3), (99, 5, 5), ("0", 5, 0)],
)
def test_wanted_layers(setting, total, wanted):
    assert wanted_layers(setting, total) == wanted


def test_an_unreadable_layer_setting_says_what_is_expected():
    with pytest.raises(GpuOffloadError, match="expected a number, all or auto"):
        check(H200_LINES, gpu_layers="most")


# --- the role: the load lines are logged where the check runs, nothing changes on a CPU rig --------------------------
def test_gpu_rigs_run_the_server_at_the_verbosity_that_logs_the_load_lines():
    """llama.cpp's load lines are info messages, which llama-server prints from --verbosity 4: the rigs the role
    checks (llama_server_require_gpu, default: a GPU through llama_server_gpu_access) get it, the sandbox's unit stays
    as it was."""
    from tests.support import run

    result = run(
        ["ansible-playbook", "tests/unit/playbooks/server_args.yml", "--limit", "desktop3050,laptop1650ti,sandbox"],
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
    )
    assert result.returncode == 0, result.output[-3000:]
    report = json.loads(result.output[result.output.index("{") :])
    hosts = report["plays"][0]["tasks"][-1]["hosts"]
    args = {host: " ".join(hosts[host]["llama_server_effective"]["args"]) for host in hosts}
    assert "--verbosity 4" in args["desktop3050"] and "--verbosity 4" in args["laptop1650ti"]
    assert "--verbosity" not in args["sandbox"]
