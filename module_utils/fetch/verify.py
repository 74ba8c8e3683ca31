"""What a file must be before it is installed (or trusted in place): the pinned size, sha256 and a usable GGUF
of the pinned architecture. Standard library only."""

from __future__ import annotations

from ansible.module_utils.fetch.errors import VerificationError
from ansible.module_utils.fetch.spec import CatalogEntry
from ansible.module_utils.gguf_metadata import GgufError, read_gguf_metadata


def check_size_and_sha256(entry: CatalogEntry, actual_size: int, actual_sha256: str) -> None:
    if actual_size != entry.size:
        raise VerificationError(
            f"size mismatch for {entry.where}: expected {entry.size} bytes, got {actual_size}",
            what="size",
            expected=entry.size,
            actual=actual_size,
        )
    if actual_sha256 != entry.sha256:
        raise VerificationError(
            f"sha256 mismatch for {entry.where}: expected {entry.sha256}, got {actual_sha256}. The download "
            "was discarded; if it repeats, the pin is wrong (re-pin with `make pin`).",
            what="sha256",
            expected=entry.sha256,
            actual=actual_sha256,
        )


def check_gguf(entry: CatalogEntry, path: str, *, installed_as: str | None = None) -> None:
    """The GGUF header is readable, of the entry's architecture, and its tensor data fits in the file;
    ``installed_as`` names the installed file in messages (None: the download, named by its pin)."""
    try:
        meta = read_gguf_metadata(path, read_tensors=True)
    except GgufError as exc:
        raise VerificationError(
            f"{entry.where} matches its pinned sha256 but is not a usable GGUF ({exc.problem}); the pin "
            "points at the wrong file: re-pin with `make pin`.",
            what="gguf",
            expected="GGUF v2/v3",
            actual=exc.problem,
        ) from None
    expected = entry.architecture
    if expected and meta.architecture != expected:
        where = f"{installed_as} (installed)" if installed_as else entry.where
        raise VerificationError(
            f"architecture mismatch for {where}: model_catalog says {expected!r}, the file's "
            f"general.architecture is {meta.architecture!r}. Fix the entry's architecture or its pin.",
            what="architecture",
            expected=expected,
            actual=meta.architecture,
        )
    end = meta.tensor_data_end()
    if end is not None and end > meta.file_size:
        raise VerificationError(
            f"{entry.where}: tensor data needs {end} bytes but the file has {meta.file_size}",
            what="gguf",
            expected=end,
            actual=meta.file_size,
        )
