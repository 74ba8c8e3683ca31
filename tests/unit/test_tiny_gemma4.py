"""The tiny gemma4 pair's weights implement the cycle: read back from the written GGUF files with the gguf
package and pushed through the residual stream of llama.cpp's gemma4 / gemma4-assistant graphs (pinned commit,
src/models/gemma4.cpp and gemma4-assistant.cpp), the target's greedy token and the drafter's guess are both
``next_token(last)``. tests/integration/test_tiny_gemma4_mtp.py proves the same in the real llama-server."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from rigkit.sandbox.tiny_gemma4 import (
    CYCLE,
    CYCLE_TEXT,
    DRAFTER_SHAPE,
    N_VOCAB,
    TARGET_SHAPE,
    expected_continuation,
    next_token,
)

EPS = 1e-6  # attention.layer_norm_rms_epsilon of both files
SOFTCAP = 30.0


def tensors(path: Path) -> dict[str, np.ndarray]:
    """Name -> numpy array (numpy order: the reverse of ggml's {ne0, ne1})."""
    return {
        t.name: np.array(t.data, dtype=np.float64).reshape(tuple(reversed(t.shape))) for t in GGUFReader(path).tensors
    }


def rms_norm(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x) + EPS) * weight


def gelu(x: np.ndarray) -> np.ndarray:  # ggml's tanh approximation
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def block(w: dict[str, np.ndarray], layer: int, inp: np.ndarray) -> np.ndarray:
    """One gemma4 block for one token. Attention adds rms_norm(attn) * post_attention_norm: checked to be 0."""
    p = f"blk.{layer}."
    assert not w[p + "post_attention_norm.weight"].any(), "attention must add nothing to the residual stream"
    attn_out = inp
    x = rms_norm(attn_out, w[p + "ffn_norm.weight"])
    ffn = w[p + "ffn_down.weight"] @ (gelu(w[p + "ffn_gate.weight"] @ x) * (w[p + "ffn_up.weight"] @ x))
    cur = rms_norm(ffn, w[p + "post_ffw_norm.weight"]) + attn_out
    return cur * w[p + "layer_output_scale.weight"][0]


def target_step(w: dict[str, np.ndarray], token: int) -> tuple[np.ndarray, np.ndarray]:
    """(logits after softcapping, h_nextn) of the target's last position when that token is ``token``."""
    h = w["token_embd.weight"][token] * math.sqrt(TARGET_SHAPE.n_embd)
    for layer in range(TARGET_SHAPE.block_count):
        h = block(w, layer, h)
    h_nextn = rms_norm(h, w["output_norm.weight"])
    logits = w["token_embd.weight"] @ h_nextn
    return SOFTCAP * np.tanh(logits / SOFTCAP), h_nextn


def drafter_step(d: dict[str, np.ndarray], target_embd: np.ndarray, token: int, h: np.ndarray) -> np.ndarray:
    """The assistant's logits for the token after ``token``, given a hidden state ``h`` of the target's width."""
    x = target_embd[token] * math.sqrt(TARGET_SHAPE.n_embd)
    cur = d["nextn.pre_projection.weight"] @ np.concatenate([x, h])
    for layer in range(DRAFTER_SHAPE.block_count):
        cur = block(d, layer, cur)
    return d["token_embd.weight"] @ rms_norm(cur, d["output_norm.weight"])


@pytest.fixture(scope="module")
def weights(tiny_gemma4_pair: tuple[Path, Path]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    target, drafter = tiny_gemma4_pair
    return tensors(target), tensors(drafter)


def test_cycle_is_printable_byte_tokens() -> None:
    assert [chr(token - 3) for token in CYCLE] == list(CYCLE_TEXT)
    assert all(token > 2 for token in CYCLE)  # never <unk>, <s> or </s>: the target cannot stop by itself
    assert expected_continuation(CYCLE[-1], 3) == list(CYCLE[:3])
    assert next_token(2) == next_token(ord(")") + 3) == CYCLE[0]


def test_target_greedy_token_is_next_token_for_every_token(weights) -> None:
    target, _ = weights
    for token in range(N_VOCAB):
        logits, _ = target_step(target, token)
        ranked = np.argsort(logits)[::-1]
        assert ranked[0] == next_token(token), token
        assert logits[ranked[0]] - logits[ranked[1]] > 15.0, token  # greedy or sampled alike


def test_drafter_guess_is_next_token_whatever_the_hidden_state(weights) -> None:
    target, drafter = weights
    rng = np.random.default_rng(0)
    for token in range(N_VOCAB):
        _, h_target = target_step(target, token)
        for h in (h_target, rng.standard_normal(TARGET_SHAPE.n_embd) * 10.0, np.zeros(TARGET_SHAPE.n_embd)):
            logits = drafter_step(drafter, target["token_embd.weight"], token, h)
            ranked = np.argsort(logits)[::-1]
            assert ranked[0] == next_token(token), token
            assert logits[ranked[0]] - logits[ranked[1]] > 15.0, token


def test_drafts_chained_from_the_drafters_own_guesses_match_the_target(weights) -> None:
    """draft-mtp feeds each draft back with the drafter's own h: three drafts after a prompt ending in ')'."""
    target, drafter = weights
    last = ord(")") + 3
    emitted = [int(np.argmax(target_step(target, last)[0]))]
    drafts, token = [], emitted[0]
    for _ in range(3):
        token = int(np.argmax(drafter_step(drafter, target["token_embd.weight"], token, np.ones(64))))
        drafts.append(token)
    for _ in range(3):
        emitted.append(int(np.argmax(target_step(target, emitted[-1])[0])))
    assert drafts == emitted[1:] == expected_continuation(emitted[0], 3)
    assert bytes(t - 3 for t in emitted).decode() == "abcd"


def test_silenced_blocks_still_carry_random_weights(weights) -> None:
    """Only the post-norms are zero: attention and the other FFNs compute for real on real-sized weights."""
    target, drafter = weights
    for w, shape in ((target, TARGET_SHAPE), (drafter, DRAFTER_SHAPE)):
        for layer in range(shape.block_count):
            assert np.std(w[f"blk.{layer}.attn_q.weight"]) > 0.01
            assert np.std(w[f"blk.{layer}.attn_output.weight"]) > 0.01
    assert np.std(target["blk.1.ffn_up.weight"]) > 0.01
    assert np.std(target["blk.0.attn_k.weight"]) > 0.01
