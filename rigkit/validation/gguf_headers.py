"""GGUF headers read once per file on the controller, kept as JSON in the controller's cache.

The controller preflight (rigkit/validation/preflight.py) reads the headers of every rig's target and drafter
in every run, for every rig: a Gemma vocabulary of 262k strings costs a few hundred milliseconds of Python per
file, paid again by each rig that serves the same model. The files it reads are the models play's verified,
content-addressed copies, so their header only changes with the file: the parse is kept under
``<cache>/headers/``, keyed by the file's identity (device, inode, size, mtime) and by the parser's own source
(a fixed parser never reuses an old result). Only plain JSON is stored and read back, never code.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ansible.module_utils import gguf_metadata
from ansible.module_utils.gguf_metadata import GgufArray, GgufMetadata, GgufTensorInfo, GgufValueType

FORMAT = 1


@functools.lru_cache(maxsize=1)
def _parser_digest() -> str:
    return hashlib.sha256(Path(gguf_metadata.__file__).read_bytes()).hexdigest()[:16]


def _key(path: str) -> str:
    st = os.stat(path)
    where = f"{os.path.realpath(path)}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}"
    identity = f"{FORMAT}|{_parser_digest()}|{where}"
    return hashlib.sha256(identity.encode()).hexdigest()


def _encode(value: Any) -> Any:
    if isinstance(value, GgufArray):
        return {"gguf_array": [int(value.item_type), value.length]}
    if isinstance(value, (list, tuple)):
        return [_encode(item) for item in value]
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and "gguf_array" in value:
        item_type, length = value["gguf_array"]
        return GgufArray(GgufValueType(item_type), length)
    if isinstance(value, dict) and "bytes" in value:
        return bytes.fromhex(value["bytes"])
    if isinstance(value, list):
        return [_decode(item) for item in value]
    return value


def to_json(meta: GgufMetadata) -> dict[str, Any]:
    return {
        "path": meta.path,
        "version": meta.version,
        "tensor_count": meta.tensor_count,
        "kv": {key: _encode(value) for key, value in meta.kv.items()},
        "kv_types": {key: int(kind) for key, kind in meta.kv_types.items()},
        "byte_order": meta.byte_order,
        "file_size": meta.file_size,
        "tensors": None
        if meta.tensors is None
        else [[t.name, list(t.shape), t.ggml_type, t.offset] for t in meta.tensors],
        "data_offset": meta.data_offset,
        "array_item_types": {key: int(kind) for key, kind in meta.array_item_types.items()},
    }


def from_json(data: dict[str, Any]) -> GgufMetadata:
    return GgufMetadata(
        path=data["path"],
        version=data["version"],
        tensor_count=data["tensor_count"],
        kv={key: _decode(value) for key, value in data["kv"].items()},
        kv_types={key: GgufValueType(kind) for key, kind in data["kv_types"].items()},
        byte_order=data["byte_order"],
        file_size=data["file_size"],
        tensors=None
        if data["tensors"] is None
        else [GgufTensorInfo(name, tuple(shape), kind, offset) for name, shape, kind, offset in data["tensors"]],
        data_offset=data["data_offset"],
        array_item_types={key: GgufValueType(kind) for key, kind in data["array_item_types"].items()},
    )


def cached_reader(cache_dir: str) -> Callable[[str | os.PathLike[str]], GgufMetadata]:
    """read_gguf_metadata(path, read_tensors=True), through ``<cache_dir>/headers/`` (a failed parse is never kept;
    an unwritable cache only costs the parse)."""
    directory = os.path.join(cache_dir, "headers")

    def read(path: str | os.PathLike[str]) -> GgufMetadata:
        path = os.fspath(path)
        entry = os.path.join(directory, _key(path) + ".json")
        try:
            with open(entry, encoding="utf-8") as handle:
                return from_json(json.load(handle))
        except (OSError, ValueError, KeyError, TypeError):
            pass
        meta = gguf_metadata.read_gguf_metadata(path, read_tensors=True)
        try:
            os.makedirs(directory, mode=0o755, exist_ok=True)
            scratch = f"{entry}.{os.getpid()}.tmp"
            with open(scratch, "w", encoding="utf-8") as handle:
                json.dump(to_json(meta), handle)
            os.replace(scratch, entry)
        except OSError:
            pass
        return meta

    return read
