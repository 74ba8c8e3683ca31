"""A catalog entry's `shape:` facts as an in-memory GGUF header, for the memory model before any GGUF is cached,
and those facts measured from a real header (``make pin`` records them).

Discovery sizes a new rig's context with it and the controller preflight checks a rig's context and memory fit
with it when the controller's cache does not hold the GGUFs yet (module_utils/preflight/server.py is the model).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.module_utils.gguf_metadata import GgufArray, GgufError, GgufMetadata, GgufTensorInfo, GgufValueType
from ansible.module_utils.preflight.memory import weights_bytes
from ansible.module_utils.preflight.shape import ModelShape

from rigkit.paths import CATALOG_FILE

WEIGHT_KEYS = ("weights_bytes", "gpu_weights_bytes")
# The header keys (under the architecture's prefix) the memory model and the context check read.
SHAPE_KEYS = (
    "context_length",
    "embedding_length",
    "embedding_length_out",
    "block_count",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.key_length_swa",
    "attention.value_length_swa",
    "attention.sliding_window",
    "attention.sliding_window_pattern",
    "attention.shared_kv_layers",
)


class MissingShape(ValueError):
    """The entry carries no usable shape facts; the message says what to add."""


def has_shape(entry: Any) -> bool:
    shape = entry.get("shape") if isinstance(entry, Mapping) else None
    return isinstance(shape, Mapping) and bool(entry.get("architecture")) and set(WEIGHT_KEYS) <= set(shape)


def catalog_meta(name: str, entry: Mapping[str, Any]) -> GgufMetadata:
    """An in-memory GGUF header for a catalog entry, from its `shape:` facts.

    The keys are the GGUF's own (``<arch>.block_count``...). The weights are two tensors of the entry's byte
    totals: ``output.weight`` holds what ``-ngl all`` puts on the GPU, ``token_embd.weight`` what stays in host
    memory (the input embeddings), so the estimate is exact for every layer on the GPU and for the CPU (all of
    them in RAM).
    """
    if not has_shape(entry):
        raise MissingShape(
            f"catalog entry {name} lacks shape facts (shape: with weights_bytes and gpu_weights_bytes, in "
            f"{CATALOG_FILE}): add its GGUF header facts there (see the other entries)"
        )
    arch = str(entry["architecture"])
    shape = entry["shape"]
    kv: dict[str, Any] = {"general.architecture": arch}
    for key, value in shape.items():
        if key not in WEIGHT_KEYS:
            kv[f"{arch}.{key}"] = value
    total, gpu = int(shape["weights_bytes"]), int(shape["gpu_weights_bytes"])
    tensors = [GgufTensorInfo("output.weight", (gpu,), 24, 0)]  # ggml type 24: I8, one byte per element
    if total > gpu:
        tensors.append(GgufTensorInfo("token_embd.weight", (total - gpu,), 24, gpu))
    return GgufMetadata(
        path=f"{name} (catalog shape)",
        version=3,
        tensor_count=len(tensors),
        kv=kv,
        kv_types={key: _value_type(value) for key, value in kv.items()},
        file_size=total,
        tensors=tensors,
        data_offset=0,
    )


def _value_type(value: Any) -> GgufValueType:
    if isinstance(value, str):
        return GgufValueType.STRING
    return GgufValueType.ARRAY if isinstance(value, list) else GgufValueType.UINT32


def shape_facts(meta: GgufMetadata) -> tuple[str, dict[str, Any]]:
    """(architecture, `shape:` facts) measured from a real GGUF header: the keys of SHAPE_KEYS it carries and the
    bytes of its weights, all of them and those ``-ngl all`` puts on the GPU. ``catalog_meta`` of these facts gives
    the memory model the same figures as the header itself for every layer on the GPU and for the CPU."""
    shape = ModelShape.from_meta(meta)  # refuses a header the memory model cannot read
    unknown = sorted({info.type_name for info in meta.tensors or [] if info.nbytes is None})
    if unknown:
        raise GgufError(meta.path, f"tensors of ggml types this reader does not size ({', '.join(unknown)})")
    facts: dict[str, Any] = {}
    for key in SHAPE_KEYS:
        value = meta.arch_key(key, None)
        if value is None:
            continue
        if isinstance(value, GgufArray):
            raise GgufError(meta.path, f"{meta.architecture}.{key} is too long an array ({len(value)} entries)")
        facts[key] = list(value) if isinstance(value, (list, tuple)) else value
    facts["weights_bytes"] = weights_bytes(meta, shape, gpu_layers=None)
    facts["gpu_weights_bytes"] = weights_bytes(meta, shape, gpu_layers=shape.n_layer + 1)
    return shape.architecture, facts
