"""The server preflight's memory model: weights per device, the KV cache, attention scratch, the estimate.

The rules, and the llama.cpp code they follow, are described at the top of module_utils/preflight/server.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ansible.module_utils.gguf_metadata import GgufMetadata
from ansible.module_utils.preflight.shape import (
    CACHE_TYPES,
    DEFAULT_UBATCH,
    FLASH_ATTN_CHOICES,
    INPUT_TENSOR_PREFIXES,
    MIB,
    MTP_DRAFTER_ARCH,
    SERVER_AUTO_PARALLEL,
    UNQUANTIZED_CACHE_TYPES,
    ModelShape,
    PreflightError,
    _mib,
    _pad,
    _row_bytes,
)


# ---------------------------------------------------------------------------------------------- weights
def _tensor_sizes(meta: GgufMetadata) -> dict[str, int]:
    """Bytes of each tensor: from its ggml type, else from the gap to the next tensor's offset."""
    tensors = meta.tensors or []
    sizes: dict[str, int] = {}
    ends: dict[str, int] = {}
    if any(info.nbytes is None for info in tensors):
        ordered = sorted(tensors, key=lambda info: info.offset)
        data_end = meta.file_size - (meta.data_offset or 0)
        ends = {
            info.name: (nxt.offset if nxt else data_end)
            for info, nxt in zip(ordered, [*ordered[1:], None], strict=True)
        }
    for info in tensors:
        nbytes = info.nbytes
        sizes[info.name] = nbytes if nbytes is not None else max(ends[info.name] - info.offset, 0)
    return sizes


def _tensor_layer(name: str, n_layer: int) -> int | None:
    """The llama.cpp "layer" a tensor lives with: a block index, n_layer for the output layer, None for input."""
    if name.startswith(INPUT_TENSOR_PREFIXES):
        return None
    if name.startswith("blk."):
        index = name.split(".", 2)[1]
        if re.fullmatch(r"[0-9]+", index):  # ASCII: str.isdigit() takes '²', which int() refuses
            return min(int(index), n_layer)
    return n_layer


def parse_gpu_layers(value: Any, n_layer: int) -> int:
    """-ngl as a number of offloaded layers in 0..n_layer+1 ("all"/"auto"/negative: all of them)."""
    if value is None:
        return n_layer + 1
    if isinstance(value, bool):
        raise PreflightError(f"gpu layers must be a number, 'all' or 'auto', not {value!r}")
    text = str(value).strip().lower()
    if text in ("all", "auto", "max"):
        return n_layer + 1
    try:
        number = int(text)
    except ValueError:
        raise PreflightError(f"gpu layers must be a number, 'all' or 'auto', not {value!r}") from None
    return n_layer + 1 if number < 0 else min(number, n_layer + 1)


def _gpu_start(n_layer: int, gpu_layers: int) -> int:
    return max(n_layer + 1 - gpu_layers, 0)


def weights_bytes(meta: GgufMetadata, shape: ModelShape, *, gpu_layers: int | None) -> int:
    """Bytes of weights on the budgeted device: offloaded tensors, or (gpu_layers None: host) all of them."""
    sizes = _tensor_sizes(meta)
    if gpu_layers is None:
        return sum(sizes.values())
    start = _gpu_start(shape.n_layer, gpu_layers)
    total = 0
    for name, nbytes in sizes.items():
        layer = _tensor_layer(name, shape.n_layer)
        if layer is not None and layer >= start:
            total += nbytes
    tied = "output.weight" not in sizes and "token_embd.weight" in sizes
    if tied and shape.n_layer >= start:  # the output layer's copy of the tied embeddings
        total += sizes["token_embd.weight"]
    return total


# ---------------------------------------------------------------------------------------------- KV cache
@dataclass(frozen=True)
class KvLayout:
    """Cells of one model's KV cache (all streams together), per llama.cpp's sizing rules."""

    n_ctx: int
    n_stream: int
    cells_full: int
    cells_swa: int
    n_ubatch: int


def kv_layout(
    shape: ModelShape, *, ctx_size: int, parallel: int, kv_unified: bool, swa_full: bool, ubatch_size: int
) -> KvLayout:
    n_ctx = _pad(max(ctx_size, 1))
    n_ubatch = min(ubatch_size, n_ctx)
    if kv_unified or parallel <= 1:
        n_stream, kv_size = 1, n_ctx
    else:
        n_stream, kv_size = parallel, _pad(max(n_ctx // parallel, 1))
    cells_full = kv_size * n_stream
    if swa_full or shape.sliding_window <= 0:
        cells_swa = cells_full
    else:
        per_stream = shape.sliding_window * (parallel if kv_unified else 1) + n_ubatch
        cells_swa = n_stream * _pad(min(kv_size, per_stream))
    return KvLayout(
        n_ctx=n_stream * kv_size, n_stream=n_stream, cells_full=cells_full, cells_swa=cells_swa, n_ubatch=n_ubatch
    )


def kv_cache_bytes(
    shape: ModelShape,
    layout: KvLayout,
    *,
    cache_type_k: str,
    cache_type_v: str,
    v_trans: bool,
    on_device: Callable[[int], bool] = lambda _il: True,
) -> int:
    """Bytes of the KV cache of the layers ``on_device`` accepts (offload_kqv: a layer's KV sits with it)."""
    v_max = shape.max_v_width
    total = 0
    for il in range(shape.n_layer):
        if not shape.has_kv[il] or not on_device(il):
            continue
        cells = layout.cells_swa if shape.is_swa[il] else layout.cells_full
        k_row = _row_bytes(cache_type_k, shape.n_head_kv[il] * shape.head_k[il])
        v_row = _row_bytes(cache_type_v, v_max if v_trans else shape.n_head_kv[il] * shape.head_v[il])
        total += cells * (k_row + v_row)
    return total


def attention_scratch_bytes(shape: ModelShape, cells_full: int, n_ubatch: int, *, flash_attn: bool) -> int:
    """The part of the compute buffer that grows with the context (one full-attention layer's scores + mask)."""
    if flash_attn:
        return n_ubatch * cells_full * 2
    return n_ubatch * cells_full * (4 * shape.max_n_head + 4)


# ---------------------------------------------------------------------------------------------- estimate
@dataclass
class MemoryEstimate:
    """Memory one server configuration needs on the budgeted device, in bytes, and how it was derived."""

    device: str  # "gpu" or "host"
    weights_target: int
    weights_drafter: int
    kv_cache_target: int
    kv_cache_drafter: int
    attention_scratch: int
    headroom: int
    ctx_size: int
    settings: dict[str, Any]
    layout_target: KvLayout
    notes: list[str] = field(default_factory=list)
    target_meta: GgufMetadata | None = field(default=None, repr=False, compare=False)
    drafter_meta: GgufMetadata | None = field(default=None, repr=False, compare=False)

    @property
    def kv_cache(self) -> int:
        return self.kv_cache_target + self.kv_cache_drafter

    @property
    def weights(self) -> int:
        return self.weights_target + self.weights_drafter

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.attention_scratch + self.headroom

    @property
    def total_mib(self) -> float:
        return self.total / MIB

    def parts(self) -> dict[str, int]:
        return {
            "target weights": self.weights_target,
            "drafter weights": self.weights_drafter,
            "target KV cache": self.kv_cache_target,
            "drafter KV cache": self.kv_cache_drafter,
            "attention scratch": self.attention_scratch,
            "headroom": self.headroom,
        }

    @property
    def breakdown(self) -> str:
        """'target weights 2,531 MiB + ... = 3,644 MiB' (parts that are zero left out)."""
        items = [f"{label} {_mib(value)} MiB" for label, value in self.parts().items() if value]
        return f"{' + '.join(items)} = {_mib(self.total)} MiB"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {key.replace(" ", "_").lower(): value for key, value in self.parts().items()}
        out.update(
            device=self.device,
            total=self.total,
            total_mib=round(self.total / MIB, 1),
            breakdown=self.breakdown,
            ctx_size=self.ctx_size,
            kv_cells_full=self.layout_target.cells_full,
            kv_cells_swa=self.layout_target.cells_swa,
            notes=list(self.notes),
        )
        return out

    def recompute(self, **changes: Any) -> MemoryEstimate:
        """The same estimate with some settings changed (ctx_size, cache types, gpu_layers...)."""
        if self.target_meta is None:
            raise PreflightError("this estimate does not carry its GGUF metadata; call estimate_memory again")
        return estimate_memory(self.target_meta, self.drafter_meta, **{**self.settings, **changes})


def _flash_attn_effective(flash_attn: str, cache_type_v: str) -> bool:
    """Whether llama.cpp ends up with flash attention: 'auto' counts as off (the larger footprint) unless the
    V cache is quantized, which makes llama.cpp turn it on."""
    if flash_attn == "on":
        return True
    if flash_attn == "auto":
        return cache_type_v not in UNQUANTIZED_CACHE_TYPES
    return False


def _check_choice(label: str, value: Any, choices: tuple[str, ...] | dict[str, Any]) -> str:
    text = str(value).strip().lower()
    if text not in choices:
        raise PreflightError(f"{label} must be one of {', '.join(choices)}, not {value!r}")
    return text


def _resolve_parallel(parallel: Any, kv_unified: bool) -> tuple[int, bool]:
    if parallel is None or str(parallel).strip().lower() == "auto" or parallel == -1:
        return SERVER_AUTO_PARALLEL, True
    try:
        number = int(parallel)
    except (TypeError, ValueError):
        raise PreflightError(f"parallel must be a positive number or 'auto', not {parallel!r}") from None
    if number <= 0:
        raise PreflightError(f"parallel must be a positive number or 'auto', not {parallel!r}")
    return number, kv_unified


def estimate_memory(
    target_meta: GgufMetadata,
    drafter_meta: GgufMetadata | None = None,
    *,
    ctx_size: int,
    parallel: int | str = 1,
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    swa_full: bool = False,
    kv_unified: bool = False,
    gpu_layers: int | str = "all",
    headroom_mib: int,
    flash_attn: str = "auto",
    ubatch_size: int = DEFAULT_UBATCH,
    gpu_layers_draft: int | str | None = None,
    cache_type_k_draft: str = "f16",
    cache_type_v_draft: str = "f16",
) -> MemoryEstimate:
    """Memory the server needs on the budgeted device (the GPU, or host RAM when gpu_layers is 0).

    ctx_size <= 0 means the model's own context length (llama-server's -c 0). parallel "auto" is the
    server's default: 4 slots sharing a unified KV cache. gpu_layers "auto" is counted as all layers.
    """
    settings = {
        "ctx_size": ctx_size,
        "parallel": parallel,
        "cache_type_k": cache_type_k,
        "cache_type_v": cache_type_v,
        "swa_full": swa_full,
        "kv_unified": kv_unified,
        "gpu_layers": gpu_layers,
        "headroom_mib": headroom_mib,
        "flash_attn": flash_attn,
        "ubatch_size": ubatch_size,
        "gpu_layers_draft": gpu_layers_draft,
        "cache_type_k_draft": cache_type_k_draft,
        "cache_type_v_draft": cache_type_v_draft,
    }
    types = {
        name: _check_choice(name, settings[name], CACHE_TYPES)
        for name in ("cache_type_k", "cache_type_v", "cache_type_k_draft", "cache_type_v_draft")
    }
    flash = _check_choice("flash_attn", flash_attn, FLASH_ATTN_CHOICES)
    n_parallel, unified = _resolve_parallel(parallel, bool(kv_unified))
    if int(ubatch_size) <= 0 or int(headroom_mib) < 0:
        raise PreflightError("ubatch_size must be positive and headroom_mib not negative")

    target = ModelShape.from_meta(target_meta)
    ctx = int(ctx_size) if int(ctx_size) > 0 else (target.context_length or 0)
    if ctx <= 0:
        raise PreflightError(f"{target.name}: ctx_size is 0 and the model has no context_length to default to")
    ngl = parse_gpu_layers(gpu_layers, target.n_layer)
    device = "gpu" if ngl > 0 else "host"
    notes: list[str] = []

    def placement(shape: ModelShape, layers: int) -> tuple[int | None, Callable[[int], bool]]:
        if device == "host":
            return None, lambda _il: True
        start = _gpu_start(shape.n_layer, layers)
        return layers, lambda il: il >= start

    layout_kwargs = {
        "ctx_size": ctx,
        "parallel": n_parallel,
        "kv_unified": unified,
        "swa_full": bool(swa_full),
        "ubatch_size": int(ubatch_size),
    }
    fa_target = _flash_attn_effective(flash, types["cache_type_v"])
    t_layers, t_on = placement(target, ngl)
    layout = kv_layout(target, **layout_kwargs)
    weights_target = weights_bytes(target_meta, target, gpu_layers=t_layers)
    kv_target = kv_cache_bytes(
        target,
        layout,
        cache_type_k=types["cache_type_k"],
        cache_type_v=types["cache_type_v"],
        v_trans=not fa_target,
        on_device=t_on,
    )
    scratch = attention_scratch_bytes(target, layout.cells_full, layout.n_ubatch, flash_attn=fa_target)
    if flash == "auto" and not fa_target:
        notes.append("flash_attn auto counted as off (transposed V, f32 attention scores): the larger footprint")
    if device == "host":
        notes.append("gpu_layers is 0: everything counts against host RAM, input embeddings included")

    weights_drafter = kv_drafter = 0
    if drafter_meta is not None:
        drafter = ModelShape.from_meta(drafter_meta)
        d_ngl = parse_gpu_layers(gpu_layers if gpu_layers_draft is None else gpu_layers_draft, drafter.n_layer)
        d_layers, d_on = placement(drafter, d_ngl)
        weights_drafter = weights_bytes(drafter_meta, drafter, gpu_layers=d_layers)
        fa_draft = _flash_attn_effective(flash, types["cache_type_v_draft"])
        if drafter.architecture == MTP_DRAFTER_ARCH:
            # no cache of its own; its context attends over the target's cells
            scratch += attention_scratch_bytes(drafter, layout.cells_full, layout.n_ubatch, flash_attn=fa_target)
        else:
            d_layout = kv_layout(drafter, **layout_kwargs)
            kv_drafter = kv_cache_bytes(
                drafter,
                d_layout,
                cache_type_k=types["cache_type_k_draft"],
                cache_type_v=types["cache_type_v_draft"],
                v_trans=not fa_draft,
                on_device=d_on,
            )
            if device == "host" or d_ngl > 0:
                scratch += attention_scratch_bytes(drafter, d_layout.cells_full, d_layout.n_ubatch, flash_attn=fa_draft)

    return MemoryEstimate(
        device=device,
        weights_target=weights_target,
        weights_drafter=weights_drafter,
        kv_cache_target=kv_target,
        kv_cache_drafter=kv_drafter,
        attention_scratch=scratch,
        headroom=int(headroom_mib) * MIB,
        ctx_size=ctx,
        settings=settings,
        layout_target=layout,
        notes=notes,
        target_meta=target_meta,
        drafter_meta=drafter_meta,
    )


# ---------------------------------------------------------------------------------------------- budget, headroom
# The llama_server role's budget and headroom, each auto or a number of MiB; these functions are the one rule (the
# role's filters, the controller preflight, the validation and make discover use them).
BUDGET_VARIABLE = "llama_server_memory_budget_mib"
HEADROOM_VARIABLE = "llama_server_memory_headroom_mib"
# auto headroom: what the estimate does not see (CUDA context, cuBLAS workspaces; the server's own fit ignores the
# drafter). 1536 MiB on a GPU puts the estimate for E2B + drafter at 8k context (~2,900 MiB) at what the seed
# article measured on the RTX 3050 (2,875 MiB); measure your rig and lower it per host if you need the room.
AUTO_HEADROOM_MIB = {"gpu": 1536, "cpu": 256}
MEMORY_SETTINGS: dict[str, tuple[int, str]] = {
    BUDGET_VARIABLE: (
        1,
        "auto (the GPU's VRAM, rig_gpu.vram_mib, on a GPU rig; the RAM on a CPU rig) or a number of MiB >= 1",
    ),
    HEADROOM_VARIABLE: (
        0,
        f"auto ({AUTO_HEADROOM_MIB['gpu']} MiB on a GPU rig, {AUTO_HEADROOM_MIB['cpu']} MiB on a CPU rig) "
        "or a number of MiB >= 0",
    ),
}


class MemorySettingError(ValueError):
    """A budget or headroom that is neither auto nor a number of MiB in range."""

    def __init__(self, variable: str, value: Any, accepted: str) -> None:
        super().__init__(f"{variable} is {value!r}; expected {accepted}")
        self.variable = variable
        self.value = value
        self.accepted = accepted


def auto_or_mib(variable: str, value: Any) -> int | None:
    """None for auto, else ``value`` as MiB within the variable's range (MEMORY_SETTINGS); MemorySettingError
    otherwise. Extra vars arrive as text, so a string of ASCII digits counts as its number."""
    low, accepted = MEMORY_SETTINGS[variable]
    if isinstance(value, str) and value.strip().lower() == "auto":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and re.fullmatch(r"[0-9]+", value.strip()):
        number = int(value.strip())
    else:
        raise MemorySettingError(variable, value, accepted)
    if number < low:
        raise MemorySettingError(variable, value, accepted)
    return number


def _known_mib(figure: Any) -> int | None:
    """A fact's MiB (rig_gpu.vram_mib, ansible_facts memtotal_mb) when it is a positive number, else None."""
    if isinstance(figure, bool):
        return None
    if isinstance(figure, str) and re.fullmatch(r"[0-9]+", figure.strip()):
        figure = int(figure.strip())
    return figure if isinstance(figure, int) and figure > 0 else None


def memory_headroom_mib(value: Any, *, on_gpu: bool) -> int:
    """llama_server_memory_headroom_mib in MiB: auto is AUTO_HEADROOM_MIB's figure for a GPU or a CPU rig."""
    number = auto_or_mib(HEADROOM_VARIABLE, value)
    if number is None:
        return AUTO_HEADROOM_MIB["gpu" if on_gpu else "cpu"]
    return number


def memory_budget_mib(value: Any, *, on_gpu: bool, vram_mib: Any = None, ram_mib: Any = None) -> int | None:
    """llama_server_memory_budget_mib in MiB: auto is the GPU's VRAM on a GPU rig, the RAM on a CPU rig (None when
    that figure is not known)."""
    number = auto_or_mib(BUDGET_VARIABLE, value)
    if number is None:
        return _known_mib(vram_mib if on_gpu else ram_mib)
    return number
