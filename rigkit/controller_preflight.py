"""The controller preflight, before any rig is contacted: once the controller's cache holds a rig's GGUFs, the
pairing, context and memory checks of module_utils/server_preflight.py run on their headers, with rig_gpu's VRAM as
the budget; before that, the context and memory fit of a GPU rig run on the catalog's `shape:` facts (the same
memory model; pairing needs the real headers). Each problem names the inventory file to edit.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.module_utils.server_preflight import (
    PreflightError,
    check_container_memory,
    check_context,
    check_fit,
    estimate_memory,
    preflight,
)

from rigkit.catalog_shape import CATALOG_FILE, catalog_meta, has_shape
from rigkit.gguf_header_cache import cached_reader
from rigkit.inventory_files import Sources


def cached_model_path(cache_dir: str, entry: Mapping[str, Any]) -> str | None:
    """Where the models play caches a pinned entry on the controller (<cache>/models/<repo>/resolve/<rev>/<file>)."""
    if not all(entry.get(key) for key in ("repo", "revision", "filename")):
        return None
    return os.path.join(
        cache_dir, "models", str(entry["repo"]), "resolve", str(entry["revision"]), str(entry["filename"])
    )


def _int_or(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def controller_preflight(
    host: str, values: Mapping[str, Any], *, sources: Sources, catalog: Any, cache_dir: str
) -> list[str]:
    """Pairing, context and memory fit from the cached GGUF headers and rig_gpu; context and memory fit from the
    catalog's shapes while they are not cached (GPU rigs: a CPU rig's RAM is only known on the rig); [] when
    neither is known.

    The budget is rig_gpu.vram_mib on a rig that serves from its GPU (llama_server_memory_budget_mib when the
    inventory sets a number); a CPU rig's RAM is only known on the rig, so there only pairing and context are
    checked here (the on-rig preflight checks the fit).
    """
    if not isinstance(catalog, Mapping):
        return []
    target = catalog.get(values.get("models_target"))
    drafter_name = values.get("models_drafter") or None
    drafter = catalog.get(drafter_name) if drafter_name else None
    if not isinstance(target, Mapping) or (drafter_name and not isinstance(drafter, Mapping)):
        return []
    gpu_access = values.get("llama_server_gpu_access", "cdi")
    on_gpu = gpu_access != "none"
    rig_gpu = values.get("rig_gpu") if isinstance(values.get("rig_gpu"), Mapping) else {}
    gpu_budget = _int_or(values.get("llama_server_memory_budget_mib"), 0) or _int_or(rig_gpu.get("vram_mib"), 0)
    budget = gpu_budget if on_gpu and gpu_budget > 0 else 1 << 30  # RAM is not known here: no fit check
    spec_type = values.get("llama_server_spec_type", "draft-mtp")
    settings = {
        "spec_type": spec_type,
        "ctx_size": _int_or(values.get("llama_server_ctx_size"), 8192),
        "parallel": values.get("llama_server_parallel", 1),
        "cache_type_k": values.get("llama_server_cache_type_k", "f16"),
        "cache_type_v": values.get("llama_server_cache_type_v", "f16"),
        "swa_full": boolean(values.get("llama_server_swa_full", False), strict=False),
        "kv_unified": boolean(values.get("llama_server_kv_unified", False), strict=False),
        "gpu_layers": values.get("llama_server_gpu_layers", "all") if on_gpu else 0,
        "gpu_layers_draft": values.get("llama_server_gpu_layers_draft", "all") if on_gpu else 0,
        "flash_attn": values.get("llama_server_flash_attn", "on"),
        "ubatch_size": values.get("llama_server_ubatch_size") or None,
        "memory_kind": f"VRAM of {rig_gpu.get('name') or 'the GPU'} (rig_gpu.vram_mib) on {host}" if on_gpu else "RAM",
        "headroom_mib": _int_or(values.get("llama_server_memory_headroom_mib"), 1536 if on_gpu else 256),
    }
    where = (
        sources.file_of("llama_server_ctx_size")
        if "llama_server_ctx_size" in values
        else sources.file_of("models_target")
    )
    uses_drafter = bool(drafter_name) and spec_type != "none"
    target_path = cached_model_path(cache_dir, target)
    drafter_path = cached_model_path(cache_dir, drafter) if isinstance(drafter, Mapping) else None
    cached = bool(target_path and os.path.isfile(target_path)) and (
        not drafter_name or bool(drafter_path and os.path.isfile(drafter_path))
    )
    if not cached:
        if on_gpu and gpu_budget > 0:
            return _shape_fit(values, settings, gpu_budget, where, target, drafter if uses_drafter else None)
        return []
    try:
        result = preflight(
            target_path, drafter_path if spec_type != "none" else None, settings, budget, cached_reader(cache_dir)
        )
    except PreflightError as exc:
        return [f"{sources.file_of('models_target')}: cannot run the controller preflight: {exc}"]
    problems = [f"{where}: {problem} (controller preflight on the cached GGUF headers)" for problem in result.problems]
    memory = values.get("llama_server_container_memory_mib")
    if result.estimate is not None and memory is not None and re.fullmatch(r"[0-9]+", str(memory).strip()):
        problems += [
            f"{sources.file_of('llama_server_container_memory_mib', memory)}: {problem} (controller preflight on the "
            "cached GGUF headers)"
            for problem in check_container_memory(result.estimate, int(str(memory).strip()))
        ]
    return problems


def _shape_fit(
    values: Mapping[str, Any],
    settings: Mapping[str, Any],
    budget_mib: int,
    where: str,
    target: Mapping[str, Any],
    drafter: Mapping[str, Any] | None,
) -> list[str]:
    """Context and memory fit on the catalog's shape facts (both entries must carry them, else nothing to say)."""
    if not has_shape(target) or (drafter is not None and not has_shape(drafter)):
        return []
    target_meta = catalog_meta(str(values.get("models_target")), target)
    drafter_meta = catalog_meta(str(values.get("models_drafter")), drafter) if drafter is not None else None
    ctx = int(settings["ctx_size"])
    problems = check_context(target_meta, ctx) if ctx > 0 else []
    estimate_args = {
        key: value for key, value in settings.items() if key not in ("spec_type", "memory_kind") and value is not None
    }
    try:
        estimate = estimate_memory(target_meta, drafter_meta, **estimate_args)
    except (PreflightError, ValueError) as exc:
        return [f"{where}: cannot estimate memory from the catalog's shape facts: {exc}"]
    problems += check_fit(estimate, budget_mib, what=str(settings["memory_kind"]))
    return [
        f"{where}: {problem} (controller preflight on the catalog's shape facts in {CATALOG_FILE}; the GGUFs are "
        "not cached yet)"
        for problem in problems
    ]
