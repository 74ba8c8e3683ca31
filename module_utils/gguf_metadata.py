"""Read a GGUF file's header: version, tensor count, metadata key/values and tensor descriptors.

Pure standard library (it runs on rigs, where numpy and the ``gguf`` package are absent). Only the header
is read: tensor data is never touched, and large arrays (``tokenizer.ggml.tokens`` and friends) are
skipped cheaply, keeping only their element type and length.

    meta = read_gguf_metadata("/srv/models/gemma.gguf")
    meta.architecture                   # "gemma4"
    meta.arch_key("embedding_length")   # value of "gemma4.embedding_length"
    meta.vocab_size                     # length of tokenizer.ggml.tokens

Why one file of ~560 lines: it is shipped to rigs inside every module that reads a GGUF (AnsiballZ carries
module_utils files whole), and the data model, the cursor over a hostile file and its budget are one reader
that is only ever read and changed together.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, BinaryIO

__all__ = [
    "GGUF_MAGIC",
    "SUPPORTED_VERSIONS",
    "GgufArray",
    "GgufBudget",
    "GgufError",
    "GgufMetadata",
    "GgufTensorInfo",
    "GgufValueType",
    "read_gguf_metadata",
]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# Arrays longer than this are not materialised; their GgufArray keeps the type and length.
DEFAULT_MAX_ARRAY_ITEMS = 4096
# Sanity bounds that turn a corrupt header into an error instead of a multi-gigabyte allocation.
_MAX_STRING_BYTES = 64 * 1024 * 1024
_MAX_TENSOR_DIMS = 8
_MAX_COUNT = 2**32
_READ_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class GgufBudget:
    """What one header may cost before the reader gives up (a hostile or corrupt file, not a model).

    Sized for real Gemma 4 files with a wide margin: a Gemma 4 E4B header has ~2,000 tensors, ~60 keys and a
    262,144-token vocabulary (tokens + scores + token types: ~790k array items, ~6 MB), read in well under a
    second. Every limit is checked before the work it bounds where the header says the size up front.
    """

    max_keys: int = 16_384  # metadata key/value pairs (real files: under 100)
    max_tensors: int = 65_536  # tensor descriptors (Gemma 4: ~2,000; the biggest MoE GGUFs: under 20,000)
    max_items: int = 16_000_000  # keys + array items + tensors, skipped or kept (Gemma 4: under 1 M)
    max_kept_items: int = 2_000_000  # array items materialised as Python objects (memory)
    max_header_bytes: int = 256 * 1024 * 1024  # bytes parsed before the tensor data (Gemma 4: ~6 MB)
    max_seconds: float = 30.0  # wall time for the whole header


DEFAULT_BUDGET = GgufBudget()
_CHECK_EVERY = 65_536  # items between two time/byte checks inside one array


class GgufValueType(IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_SCALAR_FORMATS: dict[GgufValueType, str] = {
    GgufValueType.UINT8: "B",
    GgufValueType.INT8: "b",
    GgufValueType.UINT16: "H",
    GgufValueType.INT16: "h",
    GgufValueType.UINT32: "I",
    GgufValueType.INT32: "i",
    GgufValueType.FLOAT32: "f",
    GgufValueType.BOOL: "?",
    GgufValueType.UINT64: "Q",
    GgufValueType.INT64: "q",
    GgufValueType.FLOAT64: "d",
}

# ggml tensor types: id -> (name, elements per block, bytes per block). From ggml.h / gguf-py constants.
_GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}


class GgufError(Exception):
    """A file is not a readable GGUF (or lacks a key asked for). The message names the file."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = os.fspath(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


@dataclass(frozen=True)
class GgufArray:
    """An array value too long to materialise: its element type and length only."""

    item_type: GgufValueType
    length: int

    def __len__(self) -> int:
        return self.length


@dataclass(frozen=True)
class GgufTensorInfo:
    """A tensor descriptor from the header. ``shape`` is in ggml order (ne0 first)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # relative to GgufMetadata.data_offset

    @property
    def type_name(self) -> str:
        known = _GGML_TYPES.get(self.ggml_type)
        return known[0] if known else f"type{self.ggml_type}"

    @property
    def n_elements(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    @property
    def nbytes(self) -> int | None:
        """Bytes of tensor data, or None for a ggml type this reader does not know."""
        known = _GGML_TYPES.get(self.ggml_type)
        if known is None:
            return None
        _, block, block_bytes = known
        return self.n_elements // block * block_bytes


_MISSING: Any = object()


@dataclass
class GgufMetadata:
    path: str
    version: int
    tensor_count: int
    kv: dict[str, Any]
    kv_types: dict[str, GgufValueType]
    byte_order: str = "<"
    file_size: int = 0
    tensors: list[GgufTensorInfo] | None = None
    data_offset: int | None = None  # absolute offset of tensor data; None when tensors were not read
    array_item_types: dict[str, GgufValueType] = field(default_factory=dict)

    @property
    def architecture(self) -> str | None:
        value = self.kv.get("general.architecture")
        return value if isinstance(value, str) else None

    @property
    def alignment(self) -> int:
        value = self.kv.get("general.alignment", DEFAULT_ALIGNMENT)
        return value if isinstance(value, int) and value > 0 else DEFAULT_ALIGNMENT

    def get(self, key: str, default: Any = None) -> Any:
        return self.kv.get(key, default)

    def arch_key(self, name: str, default: Any = _MISSING) -> Any:
        """The value of ``<architecture>.<name>``, e.g. ``arch_key("embedding_length")``.

        Without a default, a missing key (or a file without general.architecture) raises GgufError.
        """
        arch = self.architecture
        if arch is None:
            if default is _MISSING:
                raise GgufError(self.path, "metadata key 'general.architecture' is missing")
            return default
        key = f"{arch}.{name}"
        if key in self.kv:
            return self.kv[key]
        if default is _MISSING:
            raise GgufError(self.path, f"metadata key {key!r} is missing")
        return default

    def array_length(self, key: str) -> int | None:
        value = self.kv.get(key)
        if isinstance(value, (GgufArray, list)):
            return len(value)
        return None

    @property
    def vocab_size(self) -> int | None:
        """Token count: the length of tokenizer.ggml.tokens, else ``<arch>.vocab_size``."""
        length = self.array_length("tokenizer.ggml.tokens")
        if length is not None:
            return length
        value = self.arch_key("vocab_size", None)
        return value if isinstance(value, int) else None

    def tensor(self, name: str) -> GgufTensorInfo | None:
        for info in self.tensors or ():
            if info.name == name:
                return info
        return None

    def tensor_data_end(self) -> int | None:
        """Absolute offset just past the last tensor's data, when every tensor type is known."""
        if self.tensors is None or self.data_offset is None:
            return None
        end = self.data_offset
        for info in self.tensors:
            nbytes = info.nbytes
            if nbytes is None:
                return None
            end = max(end, self.data_offset + info.offset + nbytes)
        return end


class _Cursor:
    """Sequential reader over a file with its own buffer, so skipping many small items stays cheap."""

    def __init__(self, handle: BinaryIO, path: str, file_size: int) -> None:
        self._handle = handle
        self._path = path
        self._file_size = file_size
        self._buf = b""
        self._pos = 0
        self._base = 0  # file offset of self._buf[0]

    @property
    def offset(self) -> int:
        return self._base + self._pos

    @property
    def remaining(self) -> int:
        return self._file_size - self.offset

    def _truncated(self, what: str, need: int) -> GgufError:
        return GgufError(
            self._path,
            f"truncated GGUF header: needed {need} bytes for {what} at offset {self.offset}, "
            f"but the file is only {self._file_size} bytes (incomplete download?)",
        )

    def _ensure(self, n: int, what: str) -> None:
        available = len(self._buf) - self._pos
        if available >= n:
            return
        if self.offset + n > self._file_size:
            raise self._truncated(what, n)
        rest = self._buf[self._pos :]
        more = self._handle.read(max(_READ_CHUNK, n - available))
        self._base += self._pos
        self._buf = rest + more
        self._pos = 0
        if len(self._buf) < n:
            raise self._truncated(what, n)

    def read(self, n: int, what: str) -> bytes:
        self._ensure(n, what)
        data = self._buf[self._pos : self._pos + n]
        self._pos += n
        return data

    def unpack(self, fmt: struct.Struct, what: str) -> tuple[Any, ...]:
        self._ensure(fmt.size, what)
        values = fmt.unpack_from(self._buf, self._pos)
        self._pos += fmt.size
        return values

    def skip(self, n: int, what: str) -> None:
        available = len(self._buf) - self._pos
        if n <= available:
            self._pos += n
            return
        target = self.offset + n
        if target > self._file_size:
            raise self._truncated(what, n)
        self._handle.seek(target)
        self._base = target
        self._buf = b""
        self._pos = 0

    def skip_strings(
        self, count: int, length_fmt: struct.Struct, what: str, check: Callable[[], None] | None = None
    ) -> None:
        """Skip ``count`` length-prefixed strings (the hot loop for 256k-token vocabularies)."""
        unpack_from = length_fmt.unpack_from
        width = length_fmt.size
        for index in range(count):
            if check is not None and index % _CHECK_EVERY == _CHECK_EVERY - 1:
                check()
            if len(self._buf) - self._pos < width:
                self._ensure(width, what)
            length = unpack_from(self._buf, self._pos)[0]
            if length > _MAX_STRING_BYTES:
                raise GgufError(
                    self._path, f"corrupt GGUF header: {what} claims {length} bytes at offset {self.offset}"
                )
            self._pos += width
            if len(self._buf) - self._pos >= length:
                self._pos += length
            else:
                self.skip(length, what)


class _HeaderParser:
    def __init__(
        self, cursor: _Cursor, path: str, order: str, max_array_items: int, budget: GgufBudget = DEFAULT_BUDGET
    ) -> None:
        self._cur = cursor
        self._path = path
        self._order = order
        self._max_array_items = max_array_items
        self._budget = budget
        self._deadline = time.monotonic() + budget.max_seconds
        self._items = 0
        self._kept = 0
        self._u32 = struct.Struct(order + "I")
        self._u64 = struct.Struct(order + "Q")
        self._scalars = {vtype: struct.Struct(order + fmt) for vtype, fmt in _SCALAR_FORMATS.items()}

    def error(self, problem: str) -> GgufError:
        return GgufError(self._path, problem)

    def over_budget(self, problem: str) -> GgufError:
        return self.error(f"GGUF header over the reader's budget: {problem} (a corrupt or hostile file, not a model)")

    def check(self) -> None:
        """The time and byte limits (called per key, per tensor and every 65,536 array items)."""
        if self._cur.offset > self._budget.max_header_bytes:
            raise self.over_budget(f"more than {self._budget.max_header_bytes} bytes of header parsed")
        if time.monotonic() > self._deadline:
            raise self.over_budget(
                f"parsing took longer than {self._budget.max_seconds:g} s (at byte {self._cur.offset})"
            )

    def spend(self, items: int, kept: int, what: str) -> None:
        """Account for ``items`` more header items (``kept`` of them materialised) before reading them."""
        self._items += items
        self._kept += kept
        if self._items > self._budget.max_items:
            raise self.over_budget(f"{what} brings the header past {self._budget.max_items} items")
        if self._kept > self._budget.max_kept_items:
            raise self.over_budget(f"{what} brings the kept array items past {self._budget.max_kept_items}")

    def u32(self, what: str) -> int:
        return int(self._cur.unpack(self._u32, what)[0])

    def u64(self, what: str) -> int:
        return int(self._cur.unpack(self._u64, what)[0])

    def string(self, what: str) -> str:
        length = self.u64(f"{what} length")
        if length > _MAX_STRING_BYTES:
            raise self.error(f"corrupt GGUF header: {what} claims {length} bytes at offset {self._cur.offset}")
        if self._cur.offset + length > self._budget.max_header_bytes:
            raise self.over_budget(f"{what} ends past {self._budget.max_header_bytes} bytes of header")
        return self._cur.read(length, what).decode("utf-8", errors="replace")

    def value_type(self, what: str) -> GgufValueType:
        raw = self.u32(what)
        try:
            return GgufValueType(raw)
        except ValueError:
            raise self.error(f"corrupt GGUF header: unknown value type {raw} for {what}") from None

    def value(self, vtype: GgufValueType, key: str) -> tuple[Any, GgufValueType | None]:
        """Returns (value, array item type or None)."""
        if vtype == GgufValueType.STRING:
            return self.string(f"value of {key!r}"), None
        if vtype == GgufValueType.ARRAY:
            return self.array(key)
        fmt = self._scalars[vtype]
        return self._cur.unpack(fmt, f"value of {key!r}")[0], None

    def array(self, key: str) -> tuple[Any, GgufValueType]:
        item_type = self.value_type(f"array item type of {key!r}")
        count = self.u64(f"array length of {key!r}")
        if count > self._cur.remaining:  # every item is at least one byte
            raise self.error(f"corrupt GGUF header: array {key!r} claims {count} items, more than the file holds")
        if item_type == GgufValueType.ARRAY:
            raise self.error(f"unsupported GGUF header: nested array in {key!r}")
        keep = count <= self._max_array_items
        self.spend(count, count if keep else 0, f"array {key!r} of {count} items")
        if not keep:
            self._skip_items(item_type, count, key)
            return GgufArray(item_type, count), item_type
        if item_type == GgufValueType.STRING:
            return [self.string(f"item of {key!r}") for _ in range(count)], item_type
        fmt = _SCALAR_FORMATS[item_type]
        data = self._cur.read(struct.calcsize(fmt) * count, f"items of {key!r}")
        return list(struct.unpack(f"{self._order}{count}{fmt}", data)), item_type

    def _skip_items(self, item_type: GgufValueType, count: int, key: str) -> None:
        if item_type != GgufValueType.STRING:
            self._cur.skip(struct.calcsize(_SCALAR_FORMATS[item_type]) * count, f"items of {key!r}")
            return
        self._cur.skip_strings(count, self._u64, f"item of {key!r}", self.check)

    def tensor_info(self, index: int) -> GgufTensorInfo:
        what = f"tensor #{index}"
        name = self.string(f"{what} name")
        n_dims = self.u32(f"{what} dimension count")
        if n_dims > _MAX_TENSOR_DIMS:
            raise self.error(f"corrupt GGUF header: tensor {name!r} claims {n_dims} dimensions")
        shape = tuple(self.u64(f"{what} shape") for _ in range(n_dims))
        ggml_type = self.u32(f"{what} type")
        offset = self.u64(f"{what} offset")
        return GgufTensorInfo(name=name, shape=shape, ggml_type=ggml_type, offset=offset)


def _detect_byte_order(path: str, raw_version: bytes) -> tuple[str, int]:
    little = struct.unpack("<I", raw_version)[0]
    big = struct.unpack(">I", raw_version)[0]
    if little in SUPPORTED_VERSIONS:
        return "<", little
    if big in SUPPORTED_VERSIONS:
        return ">", big
    version = little if little < 0x10000 else big
    hint = " (GGUF v1 predates llama.cpp's current loader; re-convert the model)" if version == 1 else ""
    raise GgufError(
        path,
        f"unsupported GGUF version {version}: this reader handles versions "
        f"{', '.join(map(str, SUPPORTED_VERSIONS))}{hint}",
    )


def read_gguf_metadata(
    path: str | os.PathLike[str],
    *,
    read_tensors: bool = True,
    max_array_items: int = DEFAULT_MAX_ARRAY_ITEMS,
    budget: GgufBudget = DEFAULT_BUDGET,
) -> GgufMetadata:
    """Parse the header of the GGUF at ``path`` (never its tensor data).

    ``read_tensors`` also reads the tensor descriptors (names, shapes, types, offsets), which sit between
    the metadata and the data. Arrays longer than ``max_array_items`` become GgufArray placeholders.
    ``budget`` bounds what the header may cost (keys, tensors, items, bytes, seconds: see GgufBudget).
    Raises GgufError (bad magic, unsupported version, truncated or corrupt header, over budget, a duplicate
    key) and OSError.
    """
    path_str = os.fspath(path)
    with open(path_str, "rb") as handle:
        file_size = os.fstat(handle.fileno()).st_size
        cursor = _Cursor(handle, path_str, file_size)
        if file_size < 4:
            raise GgufError(path_str, f"not a GGUF file: only {file_size} bytes long")
        magic = cursor.read(4, "magic")
        if magic != GGUF_MAGIC:
            raise GgufError(
                path_str,
                f"not a GGUF file: magic is {magic!r}, expected {GGUF_MAGIC!r} "
                "(an HTML error page, a Git LFS pointer or a different format saved under this name?)",
            )
        order, version = _detect_byte_order(path_str, cursor.read(4, "version"))
        parser = _HeaderParser(cursor, path_str, order, max_array_items, budget)
        tensor_count = parser.u64("tensor count")
        kv_count = parser.u64("metadata key/value count")
        if kv_count > _MAX_COUNT or tensor_count > _MAX_COUNT:
            raise GgufError(path_str, f"corrupt GGUF header: claims {tensor_count} tensors and {kv_count} keys")
        if kv_count > budget.max_keys:
            raise parser.over_budget(f"it claims {kv_count} metadata keys, more than {budget.max_keys}")
        if read_tensors and tensor_count > budget.max_tensors:
            raise parser.over_budget(f"it claims {tensor_count} tensors, more than {budget.max_tensors}")
        parser.spend(kv_count + (tensor_count if read_tensors else 0), 0, "the key and tensor counts")
        # every key/value takes at least 13 bytes and every tensor descriptor at least 24
        if kv_count * 13 + tensor_count * 24 > cursor.remaining:
            raise GgufError(
                path_str,
                f"truncated GGUF header: it claims {kv_count} keys and {tensor_count} tensors but only "
                f"{cursor.remaining} bytes follow (incomplete download?)",
            )
        kv: dict[str, Any] = {}
        kv_types: dict[str, GgufValueType] = {}
        item_types: dict[str, GgufValueType] = {}
        for index in range(kv_count):
            parser.check()
            key = parser.string(f"metadata key #{index}")
            if key in kv_types:
                raise GgufError(
                    path_str, f"corrupt GGUF header: metadata key {key!r} appears twice (#{index} repeats it)"
                )
            vtype = parser.value_type(f"type of {key!r}")
            value, item_type = parser.value(vtype, key)
            kv[key] = value
            kv_types[key] = vtype
            if item_type is not None:
                item_types[key] = item_type
        meta = GgufMetadata(
            path=path_str,
            version=version,
            tensor_count=tensor_count,
            kv=kv,
            kv_types=kv_types,
            byte_order=order,
            file_size=file_size,
            array_item_types=item_types,
        )
        if read_tensors:
            meta.tensors = []
            for index in range(tensor_count):
                if index % 1024 == 0:
                    parser.check()
                meta.tensors.append(parser.tensor_info(index))
            parser.check()
            align = meta.alignment
            meta.data_offset = (cursor.offset + align - 1) // align * align
    return meta
