"""A catalog entry's `shape:` facts as an in-memory GGUF header, for the memory model before any GGUF is cached.

Discovery sizes a new rig's context with it and the controller preflight checks a rig's context and memory fit
with it when the controller's cache does not hold the GGUFs yet (module_utils/preflight/server.py is the model).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.module_utils.gguf_metadata import GgufMetadata, GgufTensorInfo, GgufValueType

from rigkit.paths import CATALOG_FILE

WEIGHT_KEYS = ("weights_bytes", "gpu_weights_bytes")


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
        kv_types={
            key: GgufValueType.STRING if isinstance(value, str) else GgufValueType.UINT32 for key, value in kv.items()
        },
        file_size=total,
        tensors=tensors,
        data_offset=0,
    )
