"""The server preflight's refusals: drafter pairing, context length, and what fits in the memory budget.

Each problem is one self-contained sentence naming the host variable to change.
"""

from __future__ import annotations

from ansible.module_utils.gguf_metadata import GgufError, GgufMetadata
from ansible.module_utils.preflight.memory import (
    MemoryEstimate,
    _check_choice,
)
from ansible.module_utils.preflight.shape import (
    CACHE_TYPES,
    KNOWN_WIDTHS,
    MIB,
    MTP_DRAFTER_ARCH,
    MTP_TARGET_ARCH,
    PAD,
    SPEC_TYPES,
    ModelShape,
    _mib,
    _name,
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
