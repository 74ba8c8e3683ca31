"""The controller preflight, before any rig is contacted: once the controller's cache holds a rig's GGUFs, the
pairing, context and memory checks of module_utils/preflight/server.py run on their headers, with rig_gpu's VRAM as
the budget; before that, the context and memory fit of a GPU rig run on the catalog's `shape:` facts (the same
memory model; pairing needs the real headers), and an entry without them is refused: its fit would stay unknown
until the rig was contacted. Each problem names the inventory file to edit.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from ansible.module_utils.llama_server.settings import preflight_settings
from ansible.module_utils.preflight.memory import (
    BUDGET_VARIABLE,
    HEADROOM_VARIABLE,
    memory_budget_mib,
    memory_headroom_mib,
)
from ansible.module_utils.preflight.server import (
    PreflightError,
    check_container_memory,
    check_context,
    check_fit,
    estimate_memory,
    preflight,
)

from rigkit.inventory_files import Sources
from rigkit.paths import CATALOG_FILE, cached_model_path
from rigkit.validation.catalog_shape import catalog_meta, has_shape
from rigkit.validation.gguf_headers import cached_reader
from rigkit.validation.rules import role_defaults


def _int_or(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _auto_or_mib(resolve: Callable[[Any], int | None], value: Any) -> int | None:
    """A budget or headroom resolved; a malformed one as auto (the validation refuses it, naming its file)."""
    try:
        return resolve(value)
    except ValueError:
        return resolve("auto")


def controller_preflight(
    host: str, given: Mapping[str, Any], *, sources: Sources, catalog: Any, cache_dir: str
) -> list[str]:
    """Pairing, context and memory fit from the cached GGUF headers and rig_gpu; context and memory fit from the
    catalog's shapes while they are not cached (GPU rigs: a CPU rig's RAM is only known on the rig); [] when
    neither is known.

    The budget is rig_gpu.vram_mib on a rig that serves from its GPU (llama_server_memory_budget_mib when the
    inventory sets a number); a CPU rig's RAM is only known on the rig, so there only pairing and context are
    checked here (the on-rig preflight checks the fit). What ``given`` leaves out is the llama_server role's default.
    """
    defaults = role_defaults("llama_server")
    values = {**defaults, **given}
    if not isinstance(catalog, Mapping):
        return []
    target = catalog.get(values.get("models_target"))
    drafter_name = values.get("models_drafter") or None
    drafter = catalog.get(drafter_name) if drafter_name else None
    if not isinstance(target, Mapping) or (drafter_name and not isinstance(drafter, Mapping)):
        return []
    on_gpu = values["llama_server_gpu_access"] != "none"
    rig_gpu = values.get("rig_gpu") if isinstance(values.get("rig_gpu"), Mapping) else {}
    # A CPU rig's RAM is not known here: no fit check there
    gpu_budget = (
        _auto_or_mib(
            lambda value: memory_budget_mib(value, on_gpu=True, vram_mib=rig_gpu.get("vram_mib")),
            values[BUDGET_VARIABLE],
        )
        if on_gpu
        else None
    )
    budget = gpu_budget or 1 << 30
    spec_type = values["llama_server_spec_type"]
    settings = {
        **preflight_settings(values, on_gpu),
        "ctx_size": _int_or(values["llama_server_ctx_size"], defaults["llama_server_ctx_size"]),
        "memory_kind": f"VRAM of {rig_gpu.get('name') or 'the GPU'} (rig_gpu.vram_mib) on {host}" if on_gpu else "RAM",
        "headroom_mib": _auto_or_mib(
            lambda value: memory_headroom_mib(value, on_gpu=on_gpu), values[HEADROOM_VARIABLE]
        ),
    }
    where = (
        sources.file_of("llama_server_ctx_size", given["llama_server_ctx_size"])
        if "llama_server_ctx_size" in given
        else sources.file_of("models_target", given.get("models_target"))
    )
    uses_drafter = bool(drafter_name) and spec_type != "none"
    target_path = cached_model_path(cache_dir, target)
    drafter_path = cached_model_path(cache_dir, drafter) if isinstance(drafter, Mapping) else None
    cached = bool(target_path and os.path.isfile(target_path)) and (
        not drafter_name or bool(drafter_path and os.path.isfile(drafter_path))
    )
    if not cached:
        if gpu_budget:
            return _shape_fit(host, values, settings, gpu_budget, where, target, drafter if uses_drafter else None)
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
    host: str,
    values: Mapping[str, Any],
    settings: Mapping[str, Any],
    budget_mib: int,
    where: str,
    target: Mapping[str, Any],
    drafter: Mapping[str, Any] | None,
) -> list[str]:
    """Context and memory fit on the catalog's shape facts; an entry without them is refused (the fit would be
    unknown until the GGUF reached the rig), saying how to record them."""
    names = {"models_target": target, **({"models_drafter": drafter} if drafter is not None else {})}
    shapeless = [str(values.get(variable)) for variable, entry in names.items() if not has_shape(entry)]
    if shapeless:
        return [
            f"{where}: memory fit unknown for {', '.join(shapeless)} on {host}: no shape: facts in {CATALOG_FILE} "
            "and no copy of the GGUF in the controller's cache to read them from; make pin host="
            f"{host} reads the GGUF's header from the Hub and records them (or add them by hand, as the other "
            "entries carry them)"
        ]
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
