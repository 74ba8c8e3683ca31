"""Decide, from the GGUF headers alone, whether a llama-server configuration can start on a rig.

The entry point of the preflight, split by job: module_utils/preflight/shape.py (what the header says),
memory.py (the memory model below), checks.py (pairing, context, fit); this file adds the
container limit and ties them together.

Pure logic on top of module_utils/gguf_metadata.py (standard library only: it runs on rigs). Nothing here
starts, stops or changes anything; library/llama_server_preflight.py wraps it as an Ansible module.

    result = preflight("/srv/models/target.gguf", "/srv/models/drafter.gguf",
                       {"spec_type": "draft-mtp", "ctx_size": 8192, "flash_attn": "on"}, budget_mib=8192)
    result.problems    # [] when the server can start; else one self-contained sentence per problem
    result.warnings    # things worth saying that do not stop the start
    result.estimate    # MemoryEstimate: weights, KV cache, attention scratch, headroom (bytes), breakdown

Every problem names the host variable to change (models_target, models_drafter, llama_server_*).

The memory model follows llama.cpp at commit 0c1e57098 (b11312, the tree the kit's image builds):

* Weights (``llama-model.cpp`` ``load_tensors``): with ``-ngl n`` the last ``n`` of the ``block_count + 1``
  "layers" (the extra one is the output layer) live on the GPU: layer ``il`` is offloaded when
  ``il >= block_count + 1 - n``; ``all``/``auto``/``-1`` offload everything. The input embeddings
  (``token_embd``, Gemma's ``per_layer_token_embd``) always stay in host memory. A model without
  ``output.weight`` (tied embeddings, all Gemmas) gets a copy of ``token_embd`` on the output layer's
  device. Non-block tensors other than the input embeddings are counted with the output layer (llama.cpp
  puts a few tiny ones - ``rope_freqs``, ``per_layer_model_proj`` - with layer 0; a few MiB at most).
  Tensor sizes come from the header's tensor infos (ggml block sizes; offsets for unknown types).
  With ``-ngl 0`` the budget is host RAM and everything counts, the input embeddings included.
* KV cache (``llama-context.cpp``, ``llama-kv-cache-iswa.cpp``, ``llama-kv-cache.cpp``):
  ``n_ctx = pad256(ctx_size)``; unified KV (``--kv-unified``, or ``-np`` left at auto = 4 unified slots)
  keeps one stream of ``n_ctx`` cells, otherwise ``parallel`` streams of ``pad256(n_ctx / parallel)``
  cells. Full-attention layers hold all cells; sliding-window (SWA) layers hold, per stream,
  ``pad256(min(cells, window * (parallel if unified else 1) + n_ubatch))`` - the window per slot plus one
  micro-batch - unless ``--swa-full``. Per layer and cell: ``n_head_kv * head_dim_k`` elements of the K type
  plus ``n_head_kv * head_dim_v`` of the V type (``_swa`` head sizes on SWA layers); without flash attention
  V is stored transposed and every layer's V row is as wide as the widest layer's. Layers with no KV of
  their own hold none: the last ``<arch>.attention.shared_kv_layers`` layers of Gemma 4 (and Gemma 3n)
  reuse earlier layers' cache, and a ``gemma4-assistant`` drafter reads the target's cache. A classic
  (draft-simple) drafter gets a KV cache of its own with the same context, slots and window rules, in the
  draft cache types (``-ctkd/-ctvd``, f16 by default). The SWA pattern is ``<arch>.attention.
  sliding_window_pattern`` (a bool per layer, true = SWA, or a period n: layer il is SWA when
  ``il % n < n - 1``); without the key llama.cpp's per-architecture default applies (gemma2 2, gemma3 6:
  every 6th layer full, gemma3n 5); an unknown architecture is assumed all full attention (an upper bound).
* Attention scratch (measured on the CPU build, see tests): the compute buffer grows with the full-attention
  cells: ``n_ubatch * cells * 2`` bytes (the f16 mask) with flash attention, ``n_ubatch * cells *
  (4 * n_head + 4)`` (the f32 KQ scores and mask) without. ``flash_attn: auto`` counts as off unless the V
  cache is quantized (llama.cpp then turns flash attention on). The drafter's context reserves its own.
* Headroom: a fixed ``headroom_mib`` for the CUDA context and the rest of the compute buffers; ``auto`` is
  memory.py's AUTO_HEADROOM_MIB (llama-server's own memory fit ignores the drafter, ``Gemma4Assistant requires
  ctx_other to be set``, so the kit leaves room itself).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ansible.module_utils.gguf_metadata import GgufError, GgufMetadata, read_gguf_metadata
from ansible.module_utils.preflight.checks import (
    check_context,
    check_fit,
    check_pairing,
    largest_fitting_ctx,
)
from ansible.module_utils.preflight.memory import (
    MemoryEstimate,
    MemorySettingError,
    estimate_memory,
    memory_headroom_mib,
)
from ansible.module_utils.preflight.shape import (
    CACHE_TYPES,
    DEFAULT_UBATCH,
    FLASH_ATTN_CHOICES,
    MIB,
    MTP_DRAFTER_ARCH,
    SPEC_TYPES,
    UNQUANTIZED_CACHE_TYPES,
    ModelShape,
    PreflightError,
    _mib,
    _name,
)

__all__ = [
    "CACHE_TYPES",
    "DEFAULT_UBATCH",
    "FLASH_ATTN_CHOICES",
    "MIB",
    "SETTINGS_DEFAULTS",
    "SPEC_TYPES",
    "MemoryEstimate",
    "ModelShape",
    "PreflightError",
    "PreflightResult",
    "check_container_memory",
    "check_context",
    "check_fit",
    "check_pairing",
    "container_memory_limit_mib",
    "estimate_memory",
    "host_memory_estimate",
    "largest_fitting_ctx",
    "preflight",
]

SETTINGS_DEFAULTS: dict[str, Any] = {
    "spec_type": "none",
    "ctx_size": 4096,
    "parallel": 1,
    "kv_unified": False,
    "swa_full": False,
    "cache_type_k": "f16",
    "cache_type_v": "f16",
    "cache_type_k_draft": "f16",
    "cache_type_v_draft": "f16",
    "flash_attn": "auto",
    "gpu_layers": "all",
    "gpu_layers_draft": None,  # None: same as gpu_layers
    "ubatch_size": DEFAULT_UBATCH,
    "headroom_mib": "auto",  # memory_headroom_mib: the GPU or the CPU figure, by gpu_layers
    "memory_kind": None,  # "VRAM of the RTX 3050", "RAM"; None: derived from gpu_layers
}


# ---------------------------------------------------------------------------------------------- container
CONTAINER_MEMORY_STEP_MIB = 256


def host_memory_estimate(estimate: MemoryEstimate) -> MemoryEstimate:
    """The most the server can hold in host RAM: the same configuration with nothing offloaded.

    Exact for a CPU rig (the estimate already counts host RAM); an upper bound on a GPU rig, where offloaded
    weights and KV cache live in VRAM instead (the headroom then stands for the CUDA runtime's host side).
    """
    if estimate.device == "host":
        return estimate
    return estimate.recompute(gpu_layers=0, gpu_layers_draft=0)


def container_memory_limit_mib(estimate: MemoryEstimate, *, margin_mib: int, floor_mib: int) -> int:
    """The container's --memory: the host-memory estimate plus ``margin_mib``, rounded up to 256 MiB, at least
    ``floor_mib``."""
    if margin_mib < 0 or floor_mib < 0:
        raise PreflightError("the container memory margin and floor must be MiB >= 0")
    need = host_memory_estimate(estimate).total + margin_mib * MIB
    step = CONTAINER_MEMORY_STEP_MIB * MIB
    return max(int(floor_mib), -(-need // step) * CONTAINER_MEMORY_STEP_MIB)


def check_container_memory(estimate: MemoryEstimate, limit_mib: int) -> list[str]:
    """Refuse a container memory limit the server would hit (the kernel kills the container: OOM)."""
    host = host_memory_estimate(estimate)
    if limit_mib * MIB >= host.total:
        return []
    return [
        f"llama_server_container_memory_mib is {limit_mib:,} MiB but the server may hold about {_mib(host.total)} MiB "
        f"of host memory ({host.breakdown}): the kernel would kill the container. Raise it, or set it to auto "
        "(the estimate plus llama_server_container_memory_margin_mib)."
    ]


@dataclass
class PreflightResult:
    problems: list[str]
    warnings: list[str]
    estimate: MemoryEstimate | None
    facts: dict[str, Any]

    @property
    def ok(self) -> bool:
        return not self.problems


def _facts(role: str, meta: GgufMetadata) -> dict[str, Any]:
    facts: dict[str, Any] = {
        f"{role}_path": meta.path,
        f"{role}_architecture": meta.architecture,
        f"{role}_embedding_length": meta.arch_key("embedding_length", None),
        f"{role}_vocab_size": meta.vocab_size,
        f"{role}_block_count": meta.arch_key("block_count", None),
        f"{role}_context_length": meta.arch_key("context_length", None),
        f"{role}_file_size": meta.file_size,
    }
    if meta.architecture == MTP_DRAFTER_ARCH:
        facts[f"{role}_embedding_length_out"] = meta.arch_key("embedding_length_out", None)
    try:
        shape = ModelShape.from_meta(meta)
    except GgufError:
        return facts
    facts.update(
        {
            f"{role}_sliding_window": shape.sliding_window,
            f"{role}_swa_layers": shape.swa_layers,
            f"{role}_kv_layers": shape.kv_layers,
            f"{role}_swa_pattern_source": shape.swa_pattern_source,
        }
    )
    return facts


def _read_headers(path: str | os.PathLike[str]) -> GgufMetadata:
    return read_gguf_metadata(path, read_tensors=True)


def _read(
    path: str | os.PathLike[str], role: str, variable: str, reader: Callable[[str], GgufMetadata] = _read_headers
) -> tuple[GgufMetadata | None, str | None]:
    try:
        return reader(os.fspath(path)), None
    except FileNotFoundError:
        return None, (
            f"the {role} file {os.fspath(path)} does not exist: run the models role first (it downloads "
            f"{variable}), or fix {variable}"
        )
    except (GgufError, OSError) as exc:
        return (
            None,
            f"cannot read the {role} file: {exc}; fetch it again (the models role verifies it) or fix {variable}",
        )


def preflight(
    target_path: str | os.PathLike[str],
    drafter_path: str | os.PathLike[str] | None,
    settings: dict[str, Any],
    budget_mib: float,
    reader: Callable[[str], GgufMetadata] = _read_headers,
) -> PreflightResult:
    """Read both headers (through ``reader``: the controller keeps them cached) and run every check: pairing,
    context length, memory fit.

    ``settings`` keys are those of SETTINGS_DEFAULTS (spec_type, ctx_size, parallel, cache types, flash_attn,
    gpu_layers, ...); unknown keys are a PreflightError (a typo would otherwise be silently ignored).
    """
    unknown = sorted(set(settings) - set(SETTINGS_DEFAULTS))
    if unknown:
        raise PreflightError(
            f"unknown preflight settings: {', '.join(unknown)} (known: {', '.join(SETTINGS_DEFAULTS)})"
        )
    if budget_mib <= 0:
        raise PreflightError(f"memory budget must be a positive number of MiB, not {budget_mib!r}")
    s = {**SETTINGS_DEFAULTS, **{k: v for k, v in settings.items() if v is not None}}

    problems: list[str] = []
    warnings: list[str] = []
    facts: dict[str, Any] = {"spec_type": s["spec_type"], "budget_mib": budget_mib}

    target, error = _read(target_path, "target", "models_target", reader)
    if error:
        problems.append(error)
    drafter = None
    if drafter_path:
        drafter, error = _read(drafter_path, "drafter", "models_drafter", reader)
        if error:
            problems.append(error)
    if target is None or (drafter_path and drafter is None):
        return PreflightResult(problems, warnings, None, facts)

    facts.update(_facts("target", target))
    if drafter is not None:
        facts.update(_facts("drafter", drafter))

    pairing, pairing_warnings = check_pairing(target, drafter, s["spec_type"])
    problems += pairing
    warnings += pairing_warnings

    ctx = int(s["ctx_size"])
    if ctx > 0:
        problems += check_context(target, ctx)
    if drafter is not None and drafter.architecture != MTP_DRAFTER_ARCH:
        d_limit = drafter.arch_key("context_length", None)
        effective = ctx if ctx > 0 else (target.arch_key("context_length", 0) or 0)
        if isinstance(d_limit, int) and 0 < d_limit < effective:
            warnings.append(
                f"drafter {_name(drafter)} was trained for {d_limit:,} tokens, less than llama_server_ctx_size "
                f"{effective:,}: its drafts get worse past that point"
            )

    if str(s["cache_type_v"]).lower() not in UNQUANTIZED_CACHE_TYPES and str(s["flash_attn"]).lower() == "off":
        problems.append(
            f"llama_server_cache_type_v {s['cache_type_v']} is quantized, which llama.cpp only allows with flash "
            "attention: set llama_server_flash_attn: on (or auto), or llama_server_cache_type_v: f16"
        )

    estimate_args = {k: s[k] for k in SETTINGS_DEFAULTS if k not in ("spec_type", "memory_kind")}
    try:
        estimate_args["headroom_mib"] = memory_headroom_mib(s["headroom_mib"], on_gpu=str(s["gpu_layers"]) != "0")
        estimate = estimate_memory(target, drafter, **estimate_args)
    except MemorySettingError as exc:
        raise PreflightError(str(exc)) from exc
    except GgufError as exc:
        problems.append(f"cannot estimate memory: {exc}")
        return PreflightResult(problems, warnings, None, facts)
    what = s["memory_kind"] or ("host RAM" if estimate.device == "host" else "GPU memory")
    problems += check_fit(estimate, budget_mib, what=what)
    facts["memory_device"] = estimate.device
    return PreflightResult(problems, warnings, estimate, facts)
