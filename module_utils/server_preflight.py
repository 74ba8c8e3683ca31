"""Decide, from the GGUF headers alone, whether a llama-server configuration can start on a rig.

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
* Headroom: a fixed ``headroom_mib`` for the CUDA context and the rest of the compute buffers. The default
  512 MiB is a conservative guess, not a measurement: llama-server's own memory fit ignores the drafter
  (``Gemma4Assistant requires ctx_other to be set``), so the kit leaves room itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ansible.module_utils.gguf_metadata import GgufArray, GgufError, GgufMetadata, read_gguf_metadata

__all__ = [
    "CACHE_TYPES",
    "DEFAULT_HEADROOM_MIB",
    "DEFAULT_UBATCH",
    "FLASH_ATTN_CHOICES",
    "SETTINGS_DEFAULTS",
    "SPEC_TYPES",
    "MemoryEstimate",
    "ModelShape",
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

MIB = 1024 * 1024
PAD = 256  # llama.cpp pads the context and the SWA cache size to 256 cells
DEFAULT_UBATCH = 512
DEFAULT_HEADROOM_MIB = 512
SERVER_AUTO_PARALLEL = 4  # llama-server: -np auto = 4 slots with a unified KV cache (tools/server/server.cpp)

SPEC_TYPES = ("none", "draft-simple", "draft-mtp")
FLASH_ATTN_CHOICES = ("on", "off", "auto")
MTP_TARGET_ARCH = "gemma4"
MTP_DRAFTER_ARCH = "gemma4-assistant"

# KV cache types llama-server accepts (-ctk/-ctv): elements per block, bytes per block (ggml type traits).
CACHE_TYPES: dict[str, tuple[int, int]] = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "q8_0": (32, 34),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "iq4_nl": (32, 18),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
}
UNQUANTIZED_CACHE_TYPES = ("f32", "f16", "bf16")

# Architectures whose GGUF may lack sliding_window_pattern: llama.cpp's load_swa_pattern(ml, n) default.
DEFAULT_SWA_PERIOD = {"gemma2": 2, "gemma3": 6, "gemma-embedding": 6, "gemma3n": 5}
# gemma3n hard-codes its first 20 layers as the ones with KV (llama.cpp src/models/gemma3n.cpp).
DEFAULT_KV_LAYERS = {"gemma3n": 20}
# Hidden sizes of the Gemma 4 models the kit serves, for friendlier pairing messages.
KNOWN_WIDTHS = {1536: "E2B", 2560: "E4B"}
# Tensors llama.cpp always keeps in host memory ("there is very little benefit to offloading the input layer").
INPUT_TENSOR_PREFIXES = ("token_embd.", "per_layer_token_embd.", "position_embd.", "token_types.")

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
    "headroom_mib": DEFAULT_HEADROOM_MIB,
    "memory_kind": None,  # "VRAM of the RTX 3050", "RAM"; None: derived from gpu_layers
}


class PreflightError(ValueError):
    """A setting the preflight cannot interpret (a caller bug, not a refusal)."""


def _pad(value: int, to: int = PAD) -> int:
    return (value + to - 1) // to * to


def _mib(value: float) -> str:
    mib = value / MIB
    return f"{mib:,.1f}" if mib < 10 else f"{mib:,.0f}"


def _row_bytes(cache_type: str, elements: int) -> int:
    block, block_bytes = CACHE_TYPES[cache_type]
    return (elements + block - 1) // block * block_bytes


def _name(meta: GgufMetadata) -> str:
    return os.path.basename(meta.path) or meta.path


def _int_key(meta: GgufMetadata, name: str, default: int | None = None) -> int | None:
    value = meta.arch_key(name, None)
    if isinstance(value, bool) or not isinstance(value, int):
        return default
    return value


def _per_layer(meta: GgufMetadata, name: str, n_layer: int, default: list[int] | None) -> list[int] | None:
    """A scalar-or-per-layer-array key as one value per layer (llama.cpp's get_key_or_arr)."""
    value = meta.arch_key(name, None)
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return [value] * n_layer
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        if len(value) < n_layer:
            raise GgufError(meta.path, f"{meta.architecture}.{name} has {len(value)} entries for {n_layer} layers")
        return [int(v) for v in value[:n_layer]]
    if isinstance(value, GgufArray):
        raise GgufError(meta.path, f"{meta.architecture}.{name} is too long an array ({len(value)} entries)")
    return default


# ---------------------------------------------------------------------------------------------- shapes
@dataclass(frozen=True)
class ModelShape:
    """What the memory estimate needs to know about one model, read from its GGUF header."""

    path: str
    architecture: str
    n_layer: int
    n_embd: int | None
    context_length: int | None
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    head_k: tuple[int, ...]  # per layer (the _swa size on SWA layers)
    head_v: tuple[int, ...]
    is_swa: tuple[bool, ...]
    has_kv: tuple[bool, ...]
    sliding_window: int
    swa_pattern_source: str

    @property
    def name(self) -> str:
        return os.path.basename(self.path) or self.path

    @property
    def swa_layers(self) -> int:
        return sum(self.is_swa)

    @property
    def kv_layers(self) -> int:
        return sum(self.has_kv)

    @property
    def max_n_head(self) -> int:
        return max(self.n_head, default=0)

    @property
    def max_v_width(self) -> int:
        """The widest V row over all layers: the row width of every layer's V cache without flash attention."""
        return max((kv * hv for kv, hv in zip(self.n_head_kv, self.head_v, strict=True)), default=0)

    @classmethod
    def from_meta(cls, meta: GgufMetadata) -> ModelShape:
        arch = meta.architecture
        if arch is None:
            raise GgufError(meta.path, "metadata key 'general.architecture' is missing")
        n_layer = _int_key(meta, "block_count")
        if not n_layer or n_layer <= 0:
            raise GgufError(meta.path, f"metadata key '{arch}.block_count' is missing or not a positive integer")
        n_embd = _int_key(meta, "embedding_length")
        n_head = _per_layer(meta, "attention.head_count", n_layer, None) or [0] * n_layer
        n_head_kv = _per_layer(meta, "attention.head_count_kv", n_layer, None) or list(n_head)
        head0 = max(n_head) if n_head else 0
        default_head = n_embd // head0 if n_embd and head0 else 0
        hk_full = _int_key(meta, "attention.key_length", default_head) or 0
        hv_full = _int_key(meta, "attention.value_length", default_head) or 0
        hk_swa = _int_key(meta, "attention.key_length_swa", hk_full) or 0
        hv_swa = _int_key(meta, "attention.value_length_swa", hv_full) or 0

        window = _int_key(meta, "attention.sliding_window", 4096 if arch == "gemma2" else 0) or 0
        is_swa, source = _swa_pattern(meta, arch, n_layer, window)

        if arch == MTP_DRAFTER_ARCH:
            has_kv = [False] * n_layer  # reads the target's KV cache
        else:
            shared = _int_key(meta, "attention.shared_kv_layers")
            own = max(n_layer - shared, 0) if shared is not None else DEFAULT_KV_LAYERS.get(arch, n_layer)
            has_kv = [il < own for il in range(n_layer)]

        return cls(
            path=meta.path,
            architecture=arch,
            n_layer=n_layer,
            n_embd=n_embd,
            context_length=_int_key(meta, "context_length"),
            n_head=tuple(n_head),
            n_head_kv=tuple(n_head_kv),
            head_k=tuple(hk_swa if swa else hk_full for swa in is_swa),
            head_v=tuple(hv_swa if swa else hv_full for swa in is_swa),
            is_swa=tuple(is_swa),
            has_kv=tuple(has_kv),
            sliding_window=window,
            swa_pattern_source=source,
        )


def _swa_pattern(meta: GgufMetadata, arch: str, n_layer: int, window: int) -> tuple[list[bool], str]:
    if window <= 0:
        return [False] * n_layer, "no sliding window"
    key = f"{arch}.attention.sliding_window_pattern"
    value = meta.get(key)
    if isinstance(value, list) and value and all(isinstance(v, bool) for v in value):
        return [bool(v) for v in value[:n_layer]] + [False] * max(n_layer - len(value), 0), f"{key} (per layer)"
    if isinstance(value, int) and not isinstance(value, bool):
        period, source = value, f"{key} = {value}"
    elif arch in DEFAULT_SWA_PERIOD:
        period, source = DEFAULT_SWA_PERIOD[arch], f"llama.cpp's {arch} default (every {DEFAULT_SWA_PERIOD[arch]})"
    else:
        return [False] * n_layer, "unknown: assumed full attention everywhere (upper bound)"
    # llama_hparams::set_swa_pattern(n, dense_first=false): SWA unless il % n == n - 1; n == 0: all SWA
    return [period == 0 or il % period < period - 1 for il in range(n_layer)], source


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
        if index.isdigit():
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
    headroom_mib: int = DEFAULT_HEADROOM_MIB,
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


# ---------------------------------------------------------------------------------------------- checks
def _width_label(width: int | None) -> str:
    if width is None:
        return "of unknown width"
    known = KNOWN_WIDTHS.get(width)
    return f"{width} wide ({known})" if known else f"{width} wide"


def _mtp_problems(target: GgufMetadata, drafter: GgufMetadata) -> list[str]:
    t_name, d_name = _name(target), _name(drafter)
    problems: list[str] = []
    if target.architecture != MTP_TARGET_ARCH:
        problems.append(
            f"llama_server_spec_type draft-mtp needs a Gemma 4 target ({MTP_TARGET_ARCH}), but target {t_name} is "
            f"a {target.architecture} model: set models_target to a Gemma 4 model, or use llama_server_spec_type: "
            "draft-simple with a classic draft model of the target's family"
        )
    if drafter.architecture != MTP_DRAFTER_ARCH:
        problems.append(
            f"llama_server_spec_type draft-mtp needs a Gemma 4 MTP drafter ({MTP_DRAFTER_ARCH}), but drafter "
            f"{d_name} is a {drafter.architecture} model: set models_drafter to the gemma4-assistant drafter "
            f"published for {t_name}, or use llama_server_spec_type: draft-simple for a classic draft model"
        )
    if problems:
        return problems

    out = drafter.arch_key("embedding_length_out", None)
    width = target.arch_key("embedding_length", None)
    if not isinstance(out, int) or isinstance(out, bool):
        problems.append(
            f"drafter {d_name} lacks {MTP_DRAFTER_ARCH}.embedding_length_out (the target width it was built for), "
            f"so it cannot pair with any target: set models_drafter to a drafter converted by a current llama.cpp"
        )
    elif out != width:
        known = KNOWN_WIDTHS.get(out)
        built_for = f"a {out}-wide target ({known})" if known else f"a {out}-wide target"
        problems.append(
            f"drafter {d_name} was built for {built_for} but target {t_name} is {_width_label(width)}: "
            f"set models_drafter to a drafter that pairs with {t_name}"
        )

    t_vocab, d_vocab = target.vocab_size, drafter.vocab_size
    if t_vocab is not None and d_vocab is not None and t_vocab != d_vocab:
        problems.append(
            f"drafter {d_name} has a {d_vocab:,}-token vocabulary but target {t_name} has {t_vocab:,}: an MTP "
            f"drafter embeds tokens with the target's vocabulary; set models_drafter to a drafter that pairs "
            f"with {t_name}"
        )

    try:
        t_shape, d_shape = ModelShape.from_meta(target), ModelShape.from_meta(drafter)
    except GgufError as exc:
        return [*problems, f"cannot read the attention shape: {exc}"]
    n = t_shape.n_layer
    if n < 2 or t_shape.is_swa[n - 1] or not t_shape.is_swa[n - 2]:
        problems.append(
            f"target {t_name} must end with a sliding-window layer followed by a full-attention layer (the "
            "layers whose KV cache an MTP drafter reads); its sliding_window_pattern does not: set models_target "
            "to a Gemma 4 model converted by a current llama.cpp"
        )
        return problems
    # llama.cpp shares the drafter's SWA layers with the target's layer n-2 and its full layers with n-1.
    mismatches: dict[tuple[str, int, int], list[str]] = {}
    for kind, swa, t_layer in (("sliding-window", True, n - 2), ("full-attention", False, n - 1)):
        d_layers = [il for il in range(d_shape.n_layer) if d_shape.is_swa[il] == swa]
        if not d_layers:
            continue
        d0 = d_layers[0]
        pairs = (
            ("KV heads (attention.head_count_kv)", d_shape.n_head_kv[d0], t_shape.n_head_kv[t_layer]),
            ("key head size", d_shape.head_k[d0], t_shape.head_k[t_layer]),
            ("value head size", d_shape.head_v[d0], t_shape.head_v[t_layer]),
        )
        for what, got, want in pairs:
            if got != want:
                mismatches.setdefault((what, got, want), []).append(kind)
    for (what, got, want), kinds in mismatches.items():
        problems.append(
            f"drafter {d_name} has {got} {what} on its {' and '.join(kinds)} layers but target {t_name} has "
            f"{want}: the drafter attends over the target's KV cache, so they must match; set models_drafter to "
            f"a drafter that pairs with {t_name}"
        )
    return problems


def _simple_problems(target: GgufMetadata, drafter: GgufMetadata) -> list[str]:
    t_name, d_name = _name(target), _name(drafter)
    if drafter.architecture == MTP_DRAFTER_ARCH:
        return [
            f"drafter {d_name} is a {MTP_DRAFTER_ARCH} (MTP) drafter: a gemma4-assistant drafter only drafts with "
            "spec_type draft-mtp; set llama_server_spec_type: draft-mtp"
        ]
    problems: list[str] = []
    t_vocab, d_vocab = target.vocab_size, drafter.vocab_size
    if t_vocab is None or d_vocab is None:
        problems.append(
            f"cannot tell whether drafter {d_name} shares target {t_name}'s vocabulary (no tokenizer.ggml.tokens): "
            "set models_drafter to a GGUF with its tokenizer"
        )
    elif t_vocab != d_vocab:
        problems.append(
            f"drafter {d_name} has a {d_vocab:,}-token vocabulary but target {t_name} has {t_vocab:,}: a draft "
            "model must share the target's tokenizer; set models_drafter to a smaller model of the target's family"
        )
    t_tok, d_tok = target.get("tokenizer.ggml.model"), drafter.get("tokenizer.ggml.model")
    if t_tok != d_tok:
        problems.append(
            f"drafter {d_name} uses tokenizer {d_tok!r} but target {t_name} uses {t_tok!r}: a draft model must "
            "share the target's tokenizer; set models_drafter to a smaller model of the target's family"
        )
    return problems


def check_pairing(
    target_meta: GgufMetadata, drafter_meta: GgufMetadata | None, spec_type: str
) -> tuple[list[str], list[str]]:
    """(problems, warnings) for drafting ``spec_type`` with this target and drafter."""
    spec = _check_choice("spec_type", spec_type, SPEC_TYPES)
    t_name = _name(target_meta)
    if spec == "none":
        if drafter_meta is None:
            return [], []
        return [], [
            f"models_drafter is set ({_name(drafter_meta)}) but llama_server_spec_type is none, so it never drafts: "
            "set llama_server_spec_type (draft-mtp for a gemma4-assistant drafter, draft-simple for a classic "
            "draft model) or unset models_drafter"
        ]
    if drafter_meta is None:
        kind = "a gemma4-assistant drafter" if spec == "draft-mtp" else "a draft model sharing its vocabulary"
        return [
            f"llama_server_spec_type is {spec} but no drafter is configured: set models_drafter to {kind} "
            f"for {t_name}, or set llama_server_spec_type: none"
        ], []
    if spec == "draft-mtp":
        return _mtp_problems(target_meta, drafter_meta), []
    return _simple_problems(target_meta, drafter_meta), []


def check_context(target_meta: GgufMetadata, ctx_size: int) -> list[str]:
    """ctx_size above the context the model was trained for is refused (llama.cpp would only warn)."""
    limit = target_meta.arch_key("context_length", None)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
        return []
    if ctx_size > limit:
        return [
            f"llama_server_ctx_size {ctx_size} is above the {limit} tokens {_name(target_meta)} was trained "
            f"for ({target_meta.architecture}.context_length): set llama_server_ctx_size to {limit} or less"
        ]
    return []


def largest_fitting_ctx(estimate: MemoryEstimate, budget_mib: float, *, limit: int | None = None) -> int | None:
    """The largest ctx_size (a multiple of 256, llama.cpp's padding) whose estimate fits the budget; None if none."""
    budget = budget_mib * MIB
    if estimate.recompute(ctx_size=PAD).total > budget:
        return None
    context_length = ModelShape.from_meta(estimate.target_meta).context_length if estimate.target_meta else None
    top = max(limit or context_length or estimate.ctx_size, PAD) // PAD
    if estimate.recompute(ctx_size=top * PAD).total <= budget:
        return top * PAD
    low, high = 1, top  # fits at low*256, not at high*256
    while high - low > 1:
        mid = (low + high) // 2
        if estimate.recompute(ctx_size=mid * PAD).total <= budget:
            low = mid
        else:
            high = mid
    return low * PAD


def _largest_fitting_gpu_layers(estimate: MemoryEstimate, budget_mib: float) -> int | None:
    n_layer = ModelShape.from_meta(estimate.target_meta).n_layer if estimate.target_meta else 0
    for layers in range(n_layer, 0, -1):
        if estimate.recompute(gpu_layers=layers).total <= budget_mib * MIB:
            return layers
    return None


def _bytes_per_element(cache_type: str) -> float:
    block, block_bytes = CACHE_TYPES[cache_type]
    return block_bytes / block


def _cache_type_fixes(estimate: MemoryEstimate, budget_mib: float) -> list[str]:
    """The first smaller KV cache type (q8_0, then q4_0) that saves memory, with what it saves."""
    s = estimate.settings
    widest = max(_bytes_per_element(str(s[key]).lower()) for key in ("cache_type_k", "cache_type_v"))
    k_only = str(s["flash_attn"]).lower() == "off"  # a quantized V cache needs flash attention
    for smaller in ("q8_0", "q4_0"):
        if _bytes_per_element(smaller) >= widest:
            continue
        changes = {"cache_type_k": smaller} if k_only else {"cache_type_k": smaller, "cache_type_v": smaller}
        cheaper = estimate.recompute(**changes)
        saved = estimate.total - cheaper.total
        if saved < MIB:
            continue
        fits = " and would fit" if cheaper.total <= budget_mib * MIB else ""
        if k_only:
            return [
                f"llama_server_cache_type_k: {smaller} would save {_mib(saved)} MiB{fits} (quantizing the V cache "
                "too needs llama_server_flash_attn: on)"
            ]
        return [f"llama_server_cache_type_k/_v: {smaller} would save {_mib(saved)} MiB{fits}"]
    return []


def check_fit(estimate: MemoryEstimate, budget_mib: float, *, what: str | None = None) -> list[str]:
    """Refuse, with the numbers and what to change, when the estimate exceeds the budget (MiB)."""
    if estimate.total <= budget_mib * MIB:
        return []
    where = what or ("host RAM" if estimate.device == "host" else "GPU memory")
    fixes: list[str] = []
    s = estimate.settings
    if estimate.target_meta is not None:
        best = largest_fitting_ctx(estimate, budget_mib, limit=estimate.ctx_size)
        if best is not None and best < estimate.ctx_size:
            fixes.append(f"set llama_server_ctx_size to {best} or less (the largest context that fits)")
        elif best is None:
            fixes.append("no llama_server_ctx_size fits: even the smallest context is over budget")
        fixes += _cache_type_fixes(estimate, budget_mib)
        if str(s["flash_attn"]).lower() != "on":
            with_fa = estimate.recompute(flash_attn="on")
            saved = estimate.total - with_fa.total
            if saved >= MIB:
                fits = " and would fit" if with_fa.total <= budget_mib * MIB else ""
                fixes.append(
                    f"llama_server_flash_attn: on would save {_mib(saved)} MiB of attention scratch{fits} (if the "
                    "model runs with flash attention on this GPU)"
                )
        if estimate.device == "gpu":
            layers = _largest_fitting_gpu_layers(estimate, budget_mib)
            if layers is not None:
                fixes.append(
                    f"llama_server_gpu_layers: {layers} would fit (the other layers run on the CPU, much slower)"
                )
    fixes.append("or choose a smaller models_target (fewer parameters or a smaller quantization)")
    return [
        f"the configuration needs about {_mib(estimate.total)} MiB but {where} is {budget_mib:,.0f} MiB: "
        f"{estimate.breakdown} (llama_server_ctx_size {estimate.ctx_size}, KV cache "
        f"{s['cache_type_k']}/{s['cache_type_v']}). To fit: " + "; ".join(fixes)
    ]


# ---------------------------------------------------------------------------------------------- top level
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


def _read(path: str | os.PathLike[str], role: str, variable: str) -> tuple[GgufMetadata | None, str | None]:
    try:
        return read_gguf_metadata(path, read_tensors=True), None
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
) -> PreflightResult:
    """Read both headers and run every check: pairing, context length, memory fit.

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

    target, error = _read(target_path, "target", "models_target")
    if error:
        problems.append(error)
    drafter = None
    if drafter_path:
        drafter, error = _read(drafter_path, "drafter", "models_drafter")
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
        estimate = estimate_memory(target, drafter, **estimate_args)
    except GgufError as exc:
        problems.append(f"cannot estimate memory: {exc}")
        return PreflightResult(problems, warnings, None, facts)
    what = s["memory_kind"] or ("host RAM" if estimate.device == "host" else "GPU memory")
    problems += check_fit(estimate, budget_mib, what=what)
    facts["memory_device"] = estimate.device
    return PreflightResult(problems, warnings, estimate, facts)
