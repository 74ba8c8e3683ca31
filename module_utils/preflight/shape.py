"""Model shapes for the server preflight: what a GGUF header says about layers, heads, windows and KV.

One part of the preflight (module_utils/preflight/server.py is its entry point and describes the memory model);
standard library only: it runs on rigs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ansible.module_utils.gguf_metadata import GgufArray, GgufError, GgufMetadata

MIB = 1024 * 1024
PAD = 256  # llama.cpp pads the context and the SWA cache size to 256 cells
DEFAULT_UBATCH = 512
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
