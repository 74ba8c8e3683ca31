"""Does llama-server run on the GPU? A verdict from its load log and nvidia-smi (standard library only: it runs on
rigs, in the rig suite and on the GPU machine).

When CUDA fails to initialise, llama-server warns and serves on the CPU: ``/health``, a canary that drafts and the
rig suite all pass. ``check`` reads what the server printed while it loaded (the journal or container log of its
current run, nothing older) and, when given, the GPU memory its process holds, and names the cause when the server is
not on the GPU. The lines it reads are llama.cpp's at the pinned commit (0c1e57098, b11312):

- ``ggml/src/ggml-cuda/ggml-cuda.cu`` (``ggml_cuda_init``): ``ggml_cuda_init: failed to initialize CUDA: %s`` (the
  CUDA runtime's error: ``no CUDA-capable device is detected`` when the container has no device) or
  ``ggml_cuda_init: found %d CUDA devices (Total VRAM: %zu MiB):``;
- ``common/arg.cpp`` (``-ngl``/``-ngld``): ``warning: no usable GPU found, --gpu-layers option will be ignored``
  (``--gpu-layers-draft``) when no GPU backend has a device (a CPU build, or CUDA without a device);
- ``src/llama-model.cpp`` (``load_tensors``), once per model, the target first, then the drafter:
  ``load_tensors: loading model tensors, this can take a while... (load_mode = %s)``,
  ``load_tensors: offloaded %d/%d layers to GPU`` (printed only when a GPU device exists) and
  ``load_tensors: %12s model buffer size = %8.2f MiB`` per buffer (``CUDA0``, ``CPU_Mapped``, ``CPU``...);
- ``common/speculative.cpp``: ``loading draft model '%s'`` before the drafter's load.

llama.cpp logs the ``found``, ``loading model tensors``, ``offloaded`` and buffer lines at its info level, which
llama-server prints only from ``--verbosity 4`` (``common/log.cpp`` maps the library's info to trace, 4; the default
threshold is 3); the error and the ``warning:`` lines are printed at any verbosity.

Memory: ``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`` (``PID, MiB`` per line)
must list the server's process, holding at least half of what the preflight estimates the models put on the GPU
(weights, KV cache, scratch: the estimate without its headroom). A process with no CUDA context is not listed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# The causes, in the order the verdict names them (the first problem found is the cause).
NO_DEVICE = "no-cuda-device"
CUDA_INIT = "cuda-init-failed"
NO_LOAD = "no-load-in-log"
TARGET_LAYERS = "target-layers"
DRAFTER_LAYERS = "drafter-layers"
NO_CUDA_BUFFERS = "no-cuda-buffers"
GPU_MEMORY = "gpu-memory"

CAUSE_TEXT = {
    NO_DEVICE: "no CUDA device in the container",
    CUDA_INIT: "CUDA failed to initialise",
    NO_LOAD: "the log shows no model load",
    TARGET_LAYERS: "too few target layers offloaded",
    DRAFTER_LAYERS: "too few drafter layers offloaded",
    NO_CUDA_BUFFERS: "no CUDA buffers",
    GPU_MEMORY: "the process holds too little GPU memory",
}

# The process must hold at least this share of the preflight's estimate of what the models put on the GPU.
MEMORY_FRACTION = 0.5

CUDA_INIT_FAILED_RE = re.compile(r"ggml_cuda_init: failed to initialize CUDA: (?P<error>.*?)\s*$")
UINT_RE = re.compile(r"[0-9]+")  # ASCII digits: str.isdigit() takes '²' (int() refuses it), \d takes '٣'
CUDA_FOUND_RE = re.compile(r"ggml_cuda_init: found (?P<count>[0-9]+) CUDA devices")
NO_USABLE_GPU_RE = re.compile(r"warning: no usable GPU found, (?P<option>--gpu-layers(?:-draft)?) option")
NO_DEVICE_ERROR = "no CUDA-capable device is detected"
LOAD_START = "load_tensors: loading model tensors"
DRAFT_START = "loading draft model '"
OFFLOADED_RE = re.compile(r"load_tensors: offloaded (?P<done>[0-9]+)/(?P<total>[0-9]+) layers to GPU")
MODEL_BUFFER_RE = re.compile(r"load_tensors:\s+(?P<device>\S+) model buffer size =\s*(?P<mib>[0-9.]+) MiB")
CUDA_DEVICE_RE = re.compile(r"CUDA[0-9]+")  # used with fullmatch

DEVICE_HINT = (
    "check on the rig that /dev/nvidia0, /dev/nvidiactl and /dev/nvidia-uvm exist, that the CDI spec lists them "
    "(nvidia-ctk cdi list; rerun the nvidia_container_toolkit role), and that the image itself finds the GPU: "
    "docker run --rm --device nvidia.com/gpu=all IMAGE --list-devices must list CUDA0"
)


class GpuOffloadError(ValueError):
    """An input the check cannot read (a layer setting that is neither a number, all nor auto)."""


@dataclass(frozen=True)
class Problem:
    cause: str
    detail: str

    def as_dict(self) -> dict[str, str]:
        return {"cause": self.cause, "text": CAUSE_TEXT[self.cause], "detail": self.detail}


@dataclass
class ModelLoad:
    """One model's load in the log: its offload line (layers done, total) and its model buffers (MiB by device)."""

    offloaded: tuple[int, int] | None = None
    buffers: dict[str, float] = field(default_factory=dict)
    after_draft_marker: bool = False
    lines: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return self.offloaded is None and not self.buffers

    @property
    def cuda_mib(self) -> float:
        return round(sum(mib for device, mib in self.buffers.items() if CUDA_DEVICE_RE.fullmatch(device)), 2)

    @property
    def on_cuda(self) -> bool:
        return any(CUDA_DEVICE_RE.fullmatch(device) for device in self.buffers)

    def as_dict(self) -> dict[str, Any]:
        return {
            "offloaded": f"{self.offloaded[0]}/{self.offloaded[1]}" if self.offloaded else None,
            "buffers_mib": dict(self.buffers),
            "cuda_mib": self.cuda_mib,
        }


@dataclass(frozen=True)
class Verdict:
    on_gpu: bool
    message: str
    problems: tuple[Problem, ...]
    target: ModelLoad | None
    drafter: ModelLoad | None
    gpu_memory_mib: int | None
    expected_mib: float | None
    evidence: tuple[str, ...]

    @property
    def cause(self) -> str | None:
        return self.problems[0].cause if self.problems else None

    @property
    def causes(self) -> list[str]:
        return [problem.cause for problem in self.problems]

    def as_dict(self) -> dict[str, Any]:
        return {
            "on_gpu": self.on_gpu,
            "cause": self.cause,
            "message": self.message,
            "problems": [problem.as_dict() for problem in self.problems],
            "target": self.target.as_dict() if self.target else None,
            "drafter": self.drafter.as_dict() if self.drafter else None,
            "gpu_memory_mib": self.gpu_memory_mib,
            "expected_mib": self.expected_mib,
            "evidence": list(self.evidence),
        }


def _lines(log: str | Iterable[str]) -> list[str]:
    if isinstance(log, str):
        return log.splitlines()
    return [line for chunk in log for line in str(chunk).splitlines()]


def model_loads(lines: list[str]) -> list[ModelLoad]:
    """Every model load in the log, in order (empty ones dropped). A load starts at ``loading model tensors``, or at
    an offload or buffer line when the one before already had its own (logs filtered to the load lines)."""
    loads: list[ModelLoad] = []
    current: ModelLoad | None = None
    draft_pending = False
    for line in lines:
        if DRAFT_START in line:
            draft_pending = True
            current = None
            continue
        if LOAD_START in line:
            current = None
            continue
        offloaded = OFFLOADED_RE.search(line)
        buffer = MODEL_BUFFER_RE.search(line)
        if not offloaded and not buffer:
            continue
        if current is None or (offloaded and not current.empty):
            current = ModelLoad(after_draft_marker=draft_pending)
            draft_pending = False
            loads.append(current)
        current.lines.append(line.strip())
        if offloaded:
            current.offloaded = (int(offloaded["done"]), int(offloaded["total"]))
        else:
            device, mib = buffer["device"], float(buffer["mib"])
            current.buffers[device] = round(current.buffers.get(device, 0.0) + mib, 2)
    return [load for load in loads if not load.empty]


def split_loads(loads: list[ModelLoad], drafter: bool) -> tuple[ModelLoad | None, ModelLoad | None]:
    """(target, drafter): around the last ``loading draft model`` when the log has it, else the last two loads (the
    drafter loads second); without a drafter, the last load."""
    if not drafter:
        return (loads[-1] if loads else None), None
    marked = [index for index, load in enumerate(loads) if load.after_draft_marker]
    if marked:
        at = marked[-1]
        return (loads[at - 1] if at > 0 else None), loads[at]
    if len(loads) >= 2:
        return loads[-2], loads[-1]
    return (loads[0] if loads else None), None


def wanted_layers(setting: Any, total: int) -> int:
    """Layers ``-ngl``/``-ngld`` asks for, out of the ``total`` the model has: all, auto and negatives mean every one
    (auto should fit them all: the preflight checked that the configuration fits)."""
    text = "all" if setting is None else str(setting).strip().lower()
    if text in ("all", "auto", ""):
        return total
    try:
        number = int(text)
    except ValueError as exc:
        raise GpuOffloadError(f"a GPU layer setting is {setting!r}; expected a number, all or auto") from exc
    return total if number < 0 else min(number, total)


def wants_gpu(setting: Any) -> bool:
    """Whether a layer setting puts anything on the GPU (0 keeps the model on the CPU on purpose)."""
    return wanted_layers(setting, 1) > 0


def parse_compute_apps(text: str) -> dict[int, int | None]:
    """``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits``: MiB by PID (summed over
    GPUs; None where nvidia-smi reports no figure, e.g. ``[N/A]``)."""
    held: dict[int, int | None] = {}
    for line in text.splitlines():
        fields = [part.strip() for part in line.split(",")]
        if len(fields) < 2 or not UINT_RE.fullmatch(fields[0]):
            continue
        pid = int(fields[0])
        mib = int(fields[1]) if UINT_RE.fullmatch(fields[1]) else None
        before = held.get(pid, 0)
        held[pid] = None if mib is None or before is None else before + mib
    return held


def _init_problem(lines: list[str]) -> tuple[Problem | None, list[str]]:
    """What CUDA's initialisation said: no device, another error, or no GPU backend at all."""
    failed = [line for line in lines if CUDA_INIT_FAILED_RE.search(line)]
    found = [line for line in lines if CUDA_FOUND_RE.search(line)]
    unusable = [line for line in lines if NO_USABLE_GPU_RE.search(line)]
    evidence = [line.strip() for line in failed + found + unusable]
    if failed:
        quoted = failed[-1].strip()
        error = CUDA_INIT_FAILED_RE.search(failed[-1])["error"]
        if NO_DEVICE_ERROR in error:
            return Problem(NO_DEVICE, f"llama-server found no CUDA device ({quoted!r}); {DEVICE_HINT}"), evidence
        return (
            Problem(
                CUDA_INIT,
                f"CUDA could not initialise in the container ({quoted!r}). 'unknown error' usually means "
                "/dev/nvidia-uvm is missing ('systemctl restart rigkit-nvidia-devices' on the rig creates it); "
                "'driver version is insufficient' means the image's CUDA is newer than the rig's driver (compare "
                f"nvidia-smi's CUDA version with the image's); otherwise {DEVICE_HINT}",
            ),
            evidence,
        )
    if found and all(CUDA_FOUND_RE.search(line)["count"] == "0" for line in found):
        return Problem(NO_DEVICE, f"CUDA reports no device ({found[-1].strip()!r}); {DEVICE_HINT}"), evidence
    if unusable and not found:
        return (
            Problem(
                NO_DEVICE,
                f"llama-server has no GPU to use ({unusable[0].strip()!r}) and no CUDA line in its log: the image "
                "was built without CUDA (llamacpp_image_cuda must be true on a GPU rig: rebuild it with the "
                f"llamacpp_image role), or its CUDA found no device; {DEVICE_HINT}",
            ),
            evidence,
        )
    return None, evidence


def _model_problems(role: str, load: ModelLoad, setting: Any, cause: str) -> list[Problem]:
    variable = "llama_server_gpu_layers" if role == "target" else "llama_server_gpu_layers_draft"
    if not wants_gpu(setting):
        return []
    problems = []
    if load.offloaded is None:
        problems.append(
            Problem(
                cause,
                f"the {role}'s load has no 'offloaded N/M layers to GPU' line ({variable} is {setting}): llama-server "
                "had no GPU device to offload to when it loaded the model",
            )
        )
    else:
        done, total = load.offloaded
        wanted = wanted_layers(setting, total)
        if done < wanted:
            problems.append(
                Problem(
                    cause,
                    f"the {role} offloaded {done}/{total} layers to GPU, {variable} ({setting}) asks for {wanted}: "
                    "the GPU had too little free memory when it loaded (another process on the GPU? nvidia-smi "
                    f"lists them), or set {variable} to {done} to accept a partial offload",
                )
            )
    if not load.on_cuda:
        where = ", ".join(f"{device} {mib} MiB" for device, mib in load.buffers.items()) or "none logged"
        problems.append(
            Problem(
                NO_CUDA_BUFFERS,
                f"the {role}'s weights have no CUDA0 model buffer (its model buffers: {where}): they are in host "
                "memory",
            )
        )
    return problems


def _memory_problem(
    compute_apps: str, pid: int | None, expected_mib: float | None
) -> tuple[Problem | None, int | None]:
    held = parse_compute_apps(compute_apps)
    mine = {p: mib for p, mib in held.items() if pid is None or p == pid}
    who = f"the server's process (pid {pid})" if pid is not None else "any process"
    if not mine:
        listed = ", ".join(f"pid {p}: {mib} MiB" for p, mib in held.items()) or "no process at all"
        return (
            Problem(
                GPU_MEMORY,
                f"nvidia-smi --query-compute-apps lists no GPU memory for {who} ({listed}): the server has no CUDA "
                "context on the GPU",
            ),
            None,
        )
    if any(mib is None for mib in mine.values()):
        return None, None  # nvidia-smi lists the process but gives no figure (e.g. [N/A]): presence is all it shows
    used = sum(mib for mib in mine.values() if mib is not None)
    if expected_mib is not None and used < MEMORY_FRACTION * expected_mib:
        return (
            Problem(
                GPU_MEMORY,
                f"{who} holds {used} MiB on the GPU, less than {MEMORY_FRACTION:.0%} of the {expected_mib:.0f} MiB "
                "the preflight estimates for the models' weights, KV cache and scratch: most of the model is not on "
                "the GPU",
            ),
            used,
        )
    return None, used


def check(
    log: str | Iterable[str],
    *,
    drafter: bool = True,
    gpu_layers: Any = "all",
    gpu_layers_draft: Any = "all",
    compute_apps: str | None = None,
    pid: int | None = None,
    expected_mib: float | None = None,
) -> Verdict:
    """The verdict on one server run.

    ``log``: the server's lines of its current run. ``drafter``: whether a drafter loads after the target.
    ``gpu_layers``/``gpu_layers_draft``: what ``-ngl``/``-ngld`` ask for (0 keeps that model on the CPU on purpose).
    ``compute_apps``: nvidia-smi's compute-apps CSV (None: memory not checked); ``pid``: the server's PID as
    nvidia-smi sees it (the host's; None: any process counts); ``expected_mib``: the preflight's estimate of what the
    models put on the GPU, without headroom (None: only the process's presence is checked).
    """
    lines = _lines(log)
    init, evidence = _init_problem(lines)
    problems: list[Problem] = [init] if init else []
    target, draft = split_loads(model_loads(lines), drafter)
    if target is None:
        problems.append(
            Problem(
                NO_LOAD,
                "the log has no 'load_tensors:' lines of the target's load: llama-server prints them from "
                "--verbosity 4 (the llama_server role sets it where it checks the GPU; llama_server_extra_args must "
                "not lower it), and only the log of the server's current run from its start has them",
            )
        )
    else:
        problems += _model_problems("target", target, gpu_layers, TARGET_LAYERS)
        evidence += target.lines
    if drafter and draft is None and target is not None:
        problems.append(
            Problem(
                NO_LOAD,
                "the log shows one model load but a drafter should load after the target: the log is not the whole "
                "load of the server's current run",
            )
        )
    elif draft is not None:
        problems += _model_problems("drafter", draft, gpu_layers_draft, DRAFTER_LAYERS)
        evidence += draft.lines
    any_gpu = wants_gpu(gpu_layers) or (drafter and wants_gpu(gpu_layers_draft))
    used = None
    if compute_apps is not None and any_gpu:
        memory, used = _memory_problem(compute_apps, pid, expected_mib)
        if memory:
            problems.append(memory)
    # the cause named first is the earliest in the chain: the device, CUDA, the log, layers, buffers, memory
    order = [NO_DEVICE, CUDA_INIT, NO_LOAD, TARGET_LAYERS, DRAFTER_LAYERS, NO_CUDA_BUFFERS, GPU_MEMORY]
    problems.sort(key=lambda problem: order.index(problem.cause))
    if problems:
        head = problems[0]
        message = f"llama-server is not running on the GPU: {CAUSE_TEXT[head.cause]}: {head.detail}."
        rest = [f"{CAUSE_TEXT[p.cause]}: {p.detail}" for p in problems[1:]]
        if rest:
            message += " Also: " + " ".join(f"({n}) {text}." for n, text in enumerate(rest, 1))
    else:
        parts = []
        for role, load in (("target", target), ("drafter", draft)):
            if load is not None:
                offloaded = f"{load.offloaded[0]}/{load.offloaded[1]} layers" if load.offloaded else "no offload"
                parts.append(f"{role} {offloaded}, {load.cuda_mib} MiB of CUDA model buffers")
        if used is not None:
            estimate = f" (estimate {expected_mib:.0f} MiB)" if expected_mib is not None else ""
            parts.append(f"the process holds {used} MiB of GPU memory{estimate}")
        message = "llama-server runs on the GPU: " + "; ".join(parts)
    return Verdict(
        on_gpu=not problems,
        message=message,
        problems=tuple(problems),
        target=target,
        drafter=draft,
        gpu_memory_mib=used,
        expected_mib=expected_mib,
        evidence=tuple(evidence),
    )
