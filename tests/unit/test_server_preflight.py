"""module_utils/preflight/server.py and library/llama_server_preflight.py against real GGUF files: the tiny
gemma4 pair (and a mismatched drafter), the real Gemma 3 270M, and header-only GGUFs shaped like Gemma 4
E2B/E4B and their drafters.

The KV numbers were checked against llama-server b11312 (commit 0c1e57098, the kit's image) on the CPU:
for the 270M at -c 2048 -np 1 it logs ``llama_kv_cache: size = 6.00 MiB (2048 cells, 3 layers ...)`` and
``size = 15.00 MiB (1024 cells, 15 layers ...)``: 21 MiB, the value derived by hand below.

The header-only shapes are tests/fixtures/gemma4_headers.py's; every test here reads the same real GGUF files
and shapes, built once per module.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.gguf_metadata import read_gguf_metadata
from ansible.module_utils.preflight.server import (
    MIB,
    PreflightError,
    check_context,
    check_fit,
    check_pairing,
    estimate_memory,
    largest_fitting_ctx,
    preflight,
)

from rigkit.sandbox.tiny_gemma4 import TARGET_SHAPE, write_pair
from tests import support
from tests.fixtures.gemma4_headers import E2B, E4B, assistant_header, gemma4_header

REPO = Path(__file__).resolve().parents[2]
# the headroom the hand-worked figures below add (the role's auto figures are test_preflight_memory_settings.py's)
HEADROOM_MIB = 512


@pytest.fixture(scope="module")
def gemma4_rigs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Header-only E2B/E4B targets (Q4_0) and their MTP drafters (hidden 256, 4 layers, Q4_0)."""
    out = tmp_path_factory.mktemp("gemma4-headers")
    return {
        "e2b": gemma4_header(out / "gemma-4-E2B-it-q4_0.gguf", **E2B),
        "e4b": gemma4_header(out / "gemma-4-E4B-it-q4_0.gguf", **E4B),
        "e2b-drafter": assistant_header(out / "gemma-4-E2B-it-assistant.gguf", out=1536, n_head_kv=1),
        "e4b-drafter": assistant_header(out / "gemma-4-E4B-it-assistant.gguf", out=2560, n_head_kv=2),
    }


def meta(path: Path) -> Any:
    return read_gguf_metadata(path)


# ------------------------------------------------------------------------------------------ pairing
def test_tiny_pair_passes_draft_mtp(tiny_gemma4_pair: tuple[Path, Path]) -> None:
    target, drafter = tiny_gemma4_pair
    result = preflight(target, drafter, {"spec_type": "draft-mtp", "ctx_size": 1024, "flash_attn": "off"}, 4096)
    assert result.ok, result.problems
    assert result.warnings == []
    facts = result.facts
    assert (facts["target_architecture"], facts["drafter_architecture"]) == ("gemma4", "gemma4-assistant")
    assert facts["target_embedding_length"] == facts["drafter_embedding_length_out"] == TARGET_SHAPE.n_embd
    assert facts["target_vocab_size"] == facts["drafter_vocab_size"] == 259
    assert (facts["target_block_count"], facts["drafter_block_count"]) == (4, 2)
    assert result.estimate is not None and result.estimate.kv_cache_drafter == 0  # reads the target's cache


def test_mismatched_drafter_is_refused_with_both_widths(tmp_path: Path) -> None:
    target, drafter = write_pair(
        tmp_path / "tiny-gemma4.gguf", tmp_path / "wrong-assistant.gguf", embedding_length_out=48
    )
    result = preflight(target, drafter, {"spec_type": "draft-mtp", "ctx_size": 1024}, 4096)
    [problem] = result.problems
    assert "48-wide target" in problem and "64 wide" in problem
    assert "wrong-assistant.gguf" in problem and "tiny-gemma4.gguf" in problem
    assert "set models_drafter" in problem


def test_mismatch_message_names_the_gemma4_sizes(gemma4_rigs: dict[str, Path]) -> None:
    problems, _ = check_pairing(meta(gemma4_rigs["e2b"]), meta(gemma4_rigs["e4b-drafter"]), "draft-mtp")
    assert any(
        "was built for a 2560-wide target (E4B) but target gemma-4-E2B-it-q4_0.gguf is 1536 wide (E2B): set "
        "models_drafter to a drafter that pairs with gemma-4-E2B-it-q4_0.gguf" in p
        for p in problems
    ), problems
    # the E4B drafter also has 2 KV heads where E2B has 1
    assert any("KV heads" in p and "has 2" in p and "has 1" in p for p in problems), problems
    assert check_pairing(meta(gemma4_rigs["e2b"]), meta(gemma4_rigs["e2b-drafter"]), "draft-mtp") == ([], [])
    assert check_pairing(meta(gemma4_rigs["e4b"]), meta(gemma4_rigs["e4b-drafter"]), "draft-mtp") == ([], [])


def test_head_size_mismatch_is_refused(tmp_path: Path, gemma4_rigs: dict[str, Path]) -> None:
    drafter = assistant_header(tmp_path / "odd-heads.gguf", out=1536, n_head_kv=1, hd_swa=128)
    problems, _ = check_pairing(meta(gemma4_rigs["e2b"]), meta(drafter), "draft-mtp")
    assert any("key head size on its sliding-window layers" in p and "has 128" in p for p in problems), problems


def test_gemma4_assistant_with_draft_simple_is_refused(tiny_gemma4_pair: tuple[Path, Path]) -> None:
    target, drafter = tiny_gemma4_pair
    result = preflight(target, drafter, {"spec_type": "draft-simple", "ctx_size": 1024}, 4096)
    [problem] = result.problems
    assert "a gemma4-assistant drafter only drafts with spec_type draft-mtp; set llama_server_spec_type: draft-mtp" in (
        problem
    )


def test_gemma3_drafting_for_itself_with_draft_simple_passes(gemma3_270m_gguf: Path) -> None:
    settings = {"spec_type": "draft-simple", "ctx_size": 2048, "gpu_layers": 0, "memory_kind": "RAM"}
    result = preflight(gemma3_270m_gguf, gemma3_270m_gguf, settings, 4096)
    assert result.ok, result.problems
    assert result.facts["target_vocab_size"] == result.facts["drafter_vocab_size"] == 262144
    # a classic drafter keeps a KV cache of its own, the same size as the target's here
    assert result.estimate is not None and result.estimate.kv_cache_drafter == result.estimate.kv_cache_target


def test_gemma3_drafting_for_the_tiny_gemma4_is_refused(
    tiny_gemma4_pair: tuple[Path, Path], gemma3_270m_gguf: Path
) -> None:
    target, _ = tiny_gemma4_pair
    result = preflight(target, gemma3_270m_gguf, {"spec_type": "draft-simple", "ctx_size": 1024}, 4096)
    [problem] = result.problems
    assert "262,144-token vocabulary" in problem and "has 259" in problem and "set models_drafter" in problem


def test_draft_mtp_with_a_classic_drafter_is_refused(
    tiny_gemma4_pair: tuple[Path, Path], gemma3_270m_gguf: Path
) -> None:
    target, _ = tiny_gemma4_pair
    problems, _ = check_pairing(meta(target), meta(gemma3_270m_gguf), "draft-mtp")
    assert len(problems) == 1
    assert "drafter gemma-3-270m-it-Q4_K_M.gguf is a gemma3 model" in problems[0]
    assert "set models_drafter" in problems[0]
    problems, _ = check_pairing(meta(gemma3_270m_gguf), meta(tiny_gemma4_pair[1]), "draft-mtp")
    assert any("needs a Gemma 4 target" in p and "set models_target" in p for p in problems)


def test_spec_type_without_drafter_and_drafter_without_spec_type(tiny_gemma4_pair: tuple[Path, Path]) -> None:
    target, drafter = tiny_gemma4_pair
    for spec in ("draft-mtp", "draft-simple"):
        [problem] = preflight(target, None, {"spec_type": spec, "ctx_size": 1024}, 4096).problems
        assert f"llama_server_spec_type is {spec} but no drafter is configured" in problem
        assert "models_drafter" in problem
    result = preflight(target, drafter, {"spec_type": "none", "ctx_size": 1024}, 4096)
    assert result.ok
    [warning] = result.warnings
    assert "llama_server_spec_type is none" in warning and "models_drafter" in warning


# ------------------------------------------------------------------------------------------ KV cache
def kv(path: Path, **settings: Any) -> int:
    args = {"ctx_size": 2048, "gpu_layers": 0, "flash_attn": "on", "headroom_mib": HEADROOM_MIB, **settings}
    return estimate_memory(meta(path), **args).kv_cache_target


def test_kv_cache_of_the_real_270m_at_2048_by_hand(gemma3_270m_gguf: Path) -> None:
    m = meta(gemma3_270m_gguf)
    # What the header says (and what it lacks: no sliding_window_pattern, no *_swa head sizes)
    assert m.arch_key("block_count") == 18
    assert m.arch_key("attention.sliding_window") == 512
    assert m.arch_key("attention.head_count_kv") == 1
    assert (m.arch_key("attention.key_length"), m.arch_key("attention.value_length")) == (256, 256)
    assert m.get("gemma3.attention.sliding_window_pattern") is None
    assert m.get("gemma3.attention.key_length_swa") is None
    # llama.cpp's gemma3 rule: every 6th layer is full attention -> layers 5, 11, 17 full, the other 15 SWA
    full_layers, swa_layers = 3, 15
    # f16 K and V: 1 KV head x 256 x 2 bytes each -> 1024 bytes per layer and cell
    per_cell = 1 * 256 * 2 + 1 * 256 * 2
    # full layers hold all pad256(2048) = 2048 cells; SWA layers pad256(min(2048, 512 window + 512 ubatch)) = 1024
    expected = full_layers * 2048 * per_cell + swa_layers * 1024 * per_cell
    assert expected == 6 * MIB + 15 * MIB == 22_020_096  # llama-server logs 6.00 MiB + 15.00 MiB
    for flash in ("on", "off"):  # the V rows are all 256 wide, so transposed V costs nothing extra here
        assert kv(gemma3_270m_gguf, flash_attn=flash) == expected


def test_q8_0_cache_is_0_53_of_f16(gemma3_270m_gguf: Path) -> None:
    f16 = kv(gemma3_270m_gguf, ctx_size=8192)
    q8 = kv(gemma3_270m_gguf, ctx_size=8192, cache_type_k="q8_0", cache_type_v="q8_0")
    assert q8 / f16 == pytest.approx(34 / 64)  # 34 bytes per 32 elements against 64; llama-server: 20.72 vs 39 MiB
    q4 = kv(gemma3_270m_gguf, ctx_size=8192, cache_type_k="q4_0", cache_type_v="q4_0")
    assert q4 / f16 == pytest.approx(18 / 64)


def test_swa_layers_cap_at_the_window(gemma3_270m_gguf: Path) -> None:
    per_cell = 1024
    small, large = kv(gemma3_270m_gguf, ctx_size=4096), kv(gemma3_270m_gguf, ctx_size=32768)
    # only the 3 full-attention layers grow; the 15 SWA layers stay at 1024 cells
    assert large - small == 3 * (32768 - 4096) * per_cell
    assert large == 3 * 32768 * per_cell + 15 * 1024 * per_cell
    # 4 slots: unified -> one window per slot in one stream (4 x 512 + 512 = 2560 cells);
    # separate streams -> 4 x pad256(512 + 512)
    assert kv(gemma3_270m_gguf, ctx_size=8192, parallel=4, kv_unified=True) == (3 * 8192 + 15 * 2560) * per_cell
    assert kv(gemma3_270m_gguf, ctx_size=8192, parallel=4) == (3 * 8192 + 15 * 4 * 1024) * per_cell
    # llama-server's default -np auto is 4 unified slots
    assert kv(gemma3_270m_gguf, ctx_size=8192, parallel="auto") == (3 * 8192 + 15 * 2560) * per_cell
    # a context below the window is not capped further: pad256(1000) = 1024 cells everywhere
    assert kv(gemma3_270m_gguf, ctx_size=1000) == 18 * 1024 * per_cell


def test_swa_full_removes_the_cap(gemma3_270m_gguf: Path) -> None:
    assert kv(gemma3_270m_gguf, ctx_size=8192, swa_full=True) == 18 * 8192 * 1024  # llama-server: 24 + 120 MiB


def test_shared_kv_layers_reduce_kv(tmp_path: Path) -> None:
    shape = {"n_embd": 64, "n_layer": 6, "n_head": 2, "n_head_kv": 1, "n_ff": 128, "period": 2, "per_layer": 0,
             "hd_swa": 16, "hd_full": 32, "window": 64, "context": 4096, "vocab": 259}  # fmt: skip
    own = gemma4_header(tmp_path / "own.gguf", shared_kv=0, **shape)
    shared = gemma4_header(tmp_path / "shared.gguf", shared_kv=2, **shape)
    # layers [swa, full] x 3; ctx 4096: full layers 4096 cells, SWA pad256(min(4096, 64 + 512)) = 768 cells;
    # f16, flash attention: per cell 1 head x (32 + 32) x 2 bytes on full layers, x (16 + 16) x 2 on SWA
    full, swa = 4096 * 128, 768 * 64
    assert kv(own, ctx_size=4096) == 3 * full + 3 * swa
    assert kv(shared, ctx_size=4096) == 2 * full + 2 * swa  # the last two layers reuse layers 2 and 3
    # without flash attention V is transposed and as wide as the widest layer (32) on SWA layers too
    assert kv(shared, ctx_size=4096, flash_attn="off") == 2 * full + 2 * 768 * (16 + 32) * 2


def test_gemma4_e2b_kv_cache(gemma4_rigs: dict[str, Path]) -> None:
    """E2B: 35 layers, the first 15 with KV of their own (3 full: 4, 9, 14; 12 SWA); 1 KV head of 512 (full) and
    256 (SWA); at -c 8192 with 4 unified slots: 3 x 8192 x 1 x (512 + 512) x 2 + 12 x 2560 x 1 x (256 + 256) x 2."""
    expected = 3 * 8192 * 2048 + 12 * 2560 * 1024
    assert kv(gemma4_rigs["e2b"], ctx_size=8192, parallel="auto") == expected == 78 * MIB


# ------------------------------------------------------------------------------------------ weights
def test_weights_follow_llama_cpp_placement(gemma3_270m_gguf: Path) -> None:
    m = meta(gemma3_270m_gguf)
    sizes = {t.name: t.nbytes for t in m.tensors}
    everything = sum(sizes.values())
    assert everything == 246_587_904
    host = estimate_memory(m, headroom_mib=HEADROOM_MIB, ctx_size=2048, gpu_layers=0)
    assert (host.device, host.weights_target) == ("host", everything)
    # all layers: token_embd stays on the CPU as the input layer, but the tied output puts a copy on the GPU
    gpu = estimate_memory(m, headroom_mib=HEADROOM_MIB, ctx_size=2048, gpu_layers="all")
    assert (gpu.device, gpu.weights_target) == ("gpu", everything)
    # -ngl 18 of 18 blocks + output: layers 1..17 and the output layer (output_norm, tied token_embd) offloaded
    part = estimate_memory(m, headroom_mib=HEADROOM_MIB, ctx_size=2048, gpu_layers=18, flash_attn="on")
    offloaded = sum(v for k, v in sizes.items() if k.startswith("blk.") and int(k.split(".")[1]) >= 1)
    assert part.weights_target == offloaded + sizes["output_norm.weight"] + sizes["token_embd.weight"]
    assert part.kv_cache_target == gpu.recompute(flash_attn="on").kv_cache_target - 1024 * 1024  # layer 0: SWA
    # -ngl 1: only the output layer
    assert estimate_memory(m, headroom_mib=HEADROOM_MIB, ctx_size=2048, gpu_layers=1).weights_target == (
        sizes["output_norm.weight"] + sizes["token_embd.weight"]
    )


def test_per_layer_embeddings_stay_in_host_memory(gemma4_rigs: dict[str, Path]) -> None:
    m = meta(gemma4_rigs["e2b"])
    sizes = {t.name: t.nbytes for t in m.tensors}
    gpu = estimate_memory(m, headroom_mib=HEADROOM_MIB, ctx_size=8192, gpu_layers="all")
    # token_embd counted once (as the tied output); per_layer_token_embd (35 x 256 x 262144 at Q4_0) not at all
    assert gpu.weights_target == sum(sizes.values()) - sizes["per_layer_token_embd.weight"]
    assert sizes["per_layer_token_embd.weight"] == 35 * 256 * 262144 // 32 * 18


# ------------------------------------------------------------------------------------------ fit and context
def test_budget_too_small_is_refused_with_the_largest_fitting_ctx(gemma3_270m_gguf: Path) -> None:
    settings = {
        "ctx_size": 32768,
        "flash_attn": "off",
        "memory_kind": "VRAM of the GTX 1650 Ti",
        "headroom_mib": HEADROOM_MIB,
    }
    budget = 1000
    result = preflight(gemma3_270m_gguf, None, settings, budget)
    [problem] = result.problems
    assert problem.startswith("the configuration needs about 1,178 MiB but VRAM of the GTX 1650 Ti is 1,000 MiB: ")
    assert "target weights 235 MiB + target KV cache 111 MiB + attention scratch 320 MiB + headroom 512 MiB" in problem
    assert (
        "llama_server_cache_type_k: q8_0 would save" in problem and "llama_server_flash_attn: on would save" in problem
    )
    best = int(re.search(r"set llama_server_ctx_size to (\d+) or less", problem)[1])
    estimate = result.estimate
    assert estimate is not None
    assert estimate.recompute(ctx_size=best).total <= budget * MIB < estimate.recompute(ctx_size=best + 1).total
    assert best % 256 == 0 and best == largest_fitting_ctx(estimate, budget, limit=32768)
    assert preflight(gemma3_270m_gguf, None, {**settings, "ctx_size": best}, budget).ok


def test_nothing_fits_says_so(gemma3_270m_gguf: Path) -> None:
    estimate = estimate_memory(meta(gemma3_270m_gguf), headroom_mib=HEADROOM_MIB, ctx_size=2048, flash_attn="on")
    [problem] = check_fit(estimate, 600, what="VRAM of a tiny GPU")
    assert "no llama_server_ctx_size fits" in problem and "models_target" in problem


def test_context_above_the_trained_length_is_refused(gemma3_270m_gguf: Path) -> None:
    [problem] = check_context(meta(gemma3_270m_gguf), 65536)
    assert problem == (
        "llama_server_ctx_size 65536 is above the 32768 tokens gemma-3-270m-it-Q4_K_M.gguf was trained for "
        "(gemma3.context_length): set llama_server_ctx_size to 32768 or less"
    )
    assert check_context(meta(gemma3_270m_gguf), 32768) == []
    result = preflight(gemma3_270m_gguf, None, {"ctx_size": 65536, "gpu_layers": 0}, 65536)
    assert any("set llama_server_ctx_size to 32768 or less" in p for p in result.problems)


def test_quantized_v_cache_needs_flash_attention(gemma3_270m_gguf: Path) -> None:
    settings = {"ctx_size": 2048, "cache_type_v": "q8_0", "flash_attn": "off"}
    [problem] = preflight(gemma3_270m_gguf, None, settings, 4096).problems
    assert "llama_server_flash_attn: on" in problem and "llama_server_cache_type_v" in problem
    assert preflight(gemma3_270m_gguf, None, {**settings, "flash_attn": "auto"}, 4096).ok


def test_settings_are_checked(gemma3_270m_gguf: Path, tmp_path: Path) -> None:
    with pytest.raises(PreflightError, match="unknown preflight settings: ctx"):
        preflight(gemma3_270m_gguf, None, {"ctx": 2048}, 4096)
    with pytest.raises(PreflightError, match="cache_type_k must be one of"):
        estimate_memory(meta(gemma3_270m_gguf), headroom_mib=HEADROOM_MIB, ctx_size=2048, cache_type_k="q2_k")
    [problem] = preflight(tmp_path / "absent.gguf", None, {"ctx_size": 2048}, 4096).problems
    assert "does not exist" in problem and "models_target" in problem
    (tmp_path / "page.gguf").write_text("<html>404</html>")
    [problem] = preflight(tmp_path / "page.gguf", None, {"ctx_size": 2048}, 4096).problems
    assert "not a GGUF file" in problem and "models_target" in problem


# ------------------------------------------------------------------------------------------ the real rigs
def test_e4b_at_32k_on_the_4gb_laptop_is_refused_and_e2b_at_8k_fits(gemma4_rigs: dict[str, Path]) -> None:
    """The seed's rigs, with header-only files shaped like Gemma 4 (see E2B/E4B above).

    Assumptions: every matrix Q4_0 (the exact QAT builds' per-tensor types are not published), norms F32; the
    drafters have 4 heads and a 2048-wide FFN (their configs give hidden 256, 4 layers, the target's vocabulary).
    Resulting weights: E2B ~1.3 GB on the GPU (2.6 GB file: the per-layer embeddings stay in host RAM),
    E4B ~2.6 GB on the GPU (4.3 GB file), drafters ~55 MB. E4B with its drafter runs with flash attention off
    (the CUDA kernel crashes otherwise, llama-server-facts.md), which makes the attention scratch grow with the
    context: at 32k the laptop's 4 GB cannot hold it. E2B with flash attention on fits both rigs at 8k (the seed
    article runs exactly that on the RTX 3050 and on the GTX 1650 Ti).
    """
    e2b = {
        "spec_type": "draft-mtp",
        "ctx_size": 8192,
        "flash_attn": "on",
        "parallel": "auto",
        "headroom_mib": HEADROOM_MIB,
    }
    desktop = preflight(
        gemma4_rigs["e2b"], gemma4_rigs["e2b-drafter"], {**e2b, "memory_kind": "VRAM of the RTX 3050"}, 8192
    )
    assert desktop.ok, desktop.problems
    laptop = preflight(gemma4_rigs["e2b"], gemma4_rigs["e2b-drafter"], e2b, 4096)
    assert laptop.ok, laptop.problems
    assert desktop.estimate is not None and desktop.estimate.total < 4096 * MIB

    e4b = {"spec_type": "draft-mtp", "ctx_size": 32768, "flash_attn": "off", "parallel": 1,
           "memory_kind": "VRAM of the GTX 1650 Ti", "headroom_mib": HEADROOM_MIB}  # fmt: skip
    refused = preflight(gemma4_rigs["e4b"], gemma4_rigs["e4b-drafter"], e4b, 4096)
    [problem] = refused.problems
    assert "but VRAM of the GTX 1650 Ti is 4,096 MiB" in problem
    for part in ("target weights", "drafter weights", "target KV cache", "attention scratch", "headroom 512 MiB"):
        assert part in problem
    best = int(re.search(r"set llama_server_ctx_size to (\d+) or less", problem)[1])
    assert 8192 <= best < 32768
    assert preflight(gemma4_rigs["e4b"], gemma4_rigs["e4b-drafter"], {**e4b, "ctx_size": best}, 4096).ok
    # the same E4B configuration fits the 8 GB desktop
    assert preflight(gemma4_rigs["e4b"], gemma4_rigs["e4b-drafter"], e4b, 8192).ok


# ------------------------------------------------------------------------------------------ the Ansible module
def run_module(args: dict[str, Any], *extra: str) -> dict[str, Any]:
    """`ansible localhost -m llama_server_preflight` ad hoc with the system Python (stdlib only on rigs)."""
    return support.run_module("llama_server_preflight", args, *extra, system_python=True)[0]


def test_ansible_module_passes_and_refuses(tiny_gemma4_pair: tuple[Path, Path], tmp_path: Path) -> None:
    target, drafter = tiny_gemma4_pair
    args = {"target": str(target), "drafter": str(drafter), "spec_type": "draft-mtp", "ctx_size": 1024,
            "flash_attn": "off", "gpu_layers": 0, "memory_budget_mib": 2048, "memory_kind": "RAM",
            "headroom_mib": HEADROOM_MIB}  # fmt: skip
    # what the role passes when a host leaves the optional settings unset (the headroom always arrives resolved)
    passed = run_module({**args, "ubatch_size": None, "gpu_layers_draft": None}, "--check")
    assert not passed.get("failed"), passed.get("msg")
    assert passed["changed"] is False
    assert passed["facts"]["drafter_embedding_length_out"] == passed["facts"]["target_embedding_length"] == 64
    assert passed["estimate"]["device"] == "host" and passed["estimate"]["drafter_kv_cache"] == 0

    _, wrong = write_pair(tmp_path / "t.gguf", tmp_path / "wrong.gguf", embedding_length_out=48)
    refused = run_module({**args, "drafter": str(wrong), "ctx_size": 4096, "memory_budget_mib": 100})
    assert refused["failed"] and refused["changed"] is False
    assert refused["msg"].startswith("llama-server would not start with this configuration (3 problems):\n- ")
    assert len(refused["problems"]) == 3
    assert "48-wide target" in refused["msg"] and "set llama_server_ctx_size to 1024 or less" in refused["msg"]
    assert "but RAM is 100 MiB" in refused["msg"]


def test_attention_scratch_matches_llama_server_compute_buffers(gemma3_270m_gguf: Path) -> None:
    """llama-server b11312 on the CPU, 270M, -np 1: compute buffer 91.76 / 331.76 MiB at -c 8192 / 32768 with
    -fa off and 26.77 / 50.77 MiB with -fa on. The growth is the modelled scratch; the constant rest (11.76 and
    18.77 MiB) is what the headroom covers."""
    m = meta(gemma3_270m_gguf)

    def scratch(ctx: int, flash: str) -> float:
        return (
            estimate_memory(
                m, headroom_mib=HEADROOM_MIB, ctx_size=ctx, gpu_layers=0, flash_attn=flash
            ).attention_scratch
            / MIB
        )

    assert scratch(32768, "off") - scratch(8192, "off") == pytest.approx(331.76 - 91.76, abs=0.01)
    assert scratch(32768, "on") - scratch(8192, "on") == pytest.approx(50.77 - 26.77, abs=0.01)
    assert (scratch(8192, "off"), scratch(8192, "on")) == (80, 8)  # 512 x 8192 x (4 x 4 heads + 4) and x 2 bytes
