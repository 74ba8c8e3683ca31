"""module_utils/gguf_metadata.py against real GGUF files: the tiny gemma4 pair, synthetic edge cases and the
real Gemma 3 270M; cross-checked with the gguf package's GGUFReader."""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ansible.module_utils.gguf_metadata import (
    GgufArray,
    GgufError,
    GgufValueType,
    read_gguf_metadata,
)
from gguf import GGUFEndian, GGUFReader, GGUFWriter

from rigkit.sandbox import tiny_gemma4
from rigkit.sandbox.tiny_gemma4 import DRAFTER_SHAPE, N_VOCAB, TARGET_SHAPE, write_arch_gguf, write_pair

REPO = Path(__file__).resolve().parents[2]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------------ tiny pair
def expected_target_tensors() -> dict[str, tuple[int, ...]]:
    """Tensor name -> ggml shape, as tiny-gemma4-pair.md lists them for the target."""
    s = TARGET_SHAPE
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (s.n_embd, N_VOCAB),
        "output_norm.weight": (s.n_embd,),
        "rope_freqs.weight": (s.head_dim_full // 2,),
    }
    for layer in range(s.block_count):
        hd = s.head_dim(layer)
        p = f"blk.{layer}."
        shapes |= {
            p + "attn_norm.weight": (s.n_embd,),
            p + "attn_q.weight": (s.n_embd, s.n_head * hd),
            p + "attn_k.weight": (s.n_embd, s.n_head_kv * hd),
            p + "attn_v.weight": (s.n_embd, s.n_head_kv * hd),
            p + "attn_k_norm.weight": (hd,),
            p + "attn_q_norm.weight": (hd,),
            p + "attn_output.weight": (s.n_head * hd, s.n_embd),
            p + "post_attention_norm.weight": (s.n_embd,),
            p + "layer_output_scale.weight": (1,),
            p + "ffn_norm.weight": (s.n_embd,),
            p + "ffn_gate.weight": (s.n_embd, s.n_ff),
            p + "ffn_up.weight": (s.n_embd, s.n_ff),
            p + "ffn_down.weight": (s.n_ff, s.n_embd),
            p + "post_ffw_norm.weight": (s.n_embd,),
        }
    return shapes


def expected_drafter_tensors(n_embd_target: int = TARGET_SHAPE.n_embd) -> dict[str, tuple[int, ...]]:
    s = DRAFTER_SHAPE
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (s.n_embd, N_VOCAB),
        "output_norm.weight": (s.n_embd,),
        "rope_freqs.weight": (s.head_dim_full // 2,),
        "nextn.pre_projection.weight": (2 * n_embd_target, s.n_embd),
        "nextn.post_projection.weight": (s.n_embd, n_embd_target),
    }
    for layer in range(s.block_count):
        hd = s.head_dim(layer)
        p = f"blk.{layer}."
        shapes |= {
            p + "attn_norm.weight": (s.n_embd,),
            p + "attn_q.weight": (s.n_embd, s.n_head * hd),
            p + "attn_q_norm.weight": (hd,),
            p + "attn_output.weight": (s.n_head * hd, s.n_embd),
            p + "post_attention_norm.weight": (s.n_embd,),
            p + "layer_output_scale.weight": (1,),
            p + "ffn_norm.weight": (s.n_embd,),
            p + "ffn_gate.weight": (s.n_embd, s.n_ff),
            p + "ffn_up.weight": (s.n_embd, s.n_ff),
            p + "ffn_down.weight": (s.n_ff, s.n_embd),
            p + "post_ffw_norm.weight": (s.n_embd,),
        }
    return shapes


REQUIRED_HPARAMS = (
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.key_length_swa",
    "attention.value_length_swa",
    "attention.layer_norm_rms_epsilon",
    "attention.sliding_window",
    "attention.sliding_window_pattern",
    "rope.dimension_count",
    "rope.dimension_count_swa",
    "rope.freq_base",
    "rope.freq_base_swa",
)


def test_tiny_target_metadata(tiny_gemma4_pair: tuple[Path, Path]) -> None:
    target, _ = tiny_gemma4_pair
    meta = read_gguf_metadata(target)
    assert meta.version == 3
    assert meta.architecture == "gemma4"
    for key in REQUIRED_HPARAMS:
        meta.arch_key(key)  # raises when absent
    assert meta.arch_key("embedding_length") == 64
    assert meta.arch_key("feed_forward_length") == 128
    assert meta.arch_key("block_count") == 4
    assert meta.arch_key("attention.head_count") == 2
    assert meta.arch_key("attention.head_count_kv") == 1
    assert meta.arch_key("attention.key_length") == meta.arch_key("attention.value_length") == 32
    assert meta.arch_key("attention.key_length_swa") == meta.arch_key("attention.value_length_swa") == 16
    assert meta.arch_key("attention.sliding_window") == 64
    assert meta.arch_key("context_length") == 1024
    assert meta.arch_key("embedding_length_per_layer_input") == 0
    assert meta.arch_key("attention.shared_kv_layers") == 0
    assert meta.arch_key("final_logit_softcapping") == pytest.approx(30.0)
    pattern = meta.arch_key("attention.sliding_window_pattern")
    assert pattern == [True, False, True, False]
    assert meta.array_item_types["gemma4.attention.sliding_window_pattern"] == GgufValueType.BOOL
    assert pattern[-1] is False and pattern[-2] is True  # last layer full attention, second-to-last SWA
    assert meta.get("tokenizer.ggml.model") == "llama"
    assert meta.vocab_size == N_VOCAB == 259
    assert meta.tensor_count == len(expected_target_tensors())
    assert {t.name: t.shape for t in meta.tensors or []} == expected_target_tensors()
    assert meta.tensor_data_end() == meta.file_size
    assert target.stat().st_size < 1_000_000


def test_tiny_drafter_pairs_with_target(tiny_gemma4_pair: tuple[Path, Path]) -> None:
    target_path, drafter_path = tiny_gemma4_pair
    target, drafter = read_gguf_metadata(target_path), read_gguf_metadata(drafter_path)
    assert drafter.architecture == "gemma4-assistant"
    for key in REQUIRED_HPARAMS:
        drafter.arch_key(key)
    assert drafter.arch_key("embedding_length_out") == target.arch_key("embedding_length")
    assert drafter.arch_key("embedding_length_out") != drafter.arch_key("embedding_length")
    assert drafter.arch_key("nextn_predict_layers") == drafter.arch_key("block_count") == 2
    for key in (
        "attention.head_count_kv",
        "attention.key_length",
        "attention.value_length",
        "attention.key_length_swa",
        "attention.value_length_swa",
    ):
        assert drafter.arch_key(key) == target.arch_key(key), key
    assert drafter.vocab_size == target.vocab_size
    assert drafter.get("tokenizer.ggml.tokens") == target.get("tokenizer.ggml.tokens")
    assert {t.name: t.shape for t in drafter.tensors or []} == expected_drafter_tensors()
    names = {t.name for t in drafter.tensors or []}
    assert not any(n.endswith(("attn_k.weight", "attn_v.weight", "attn_k_norm.weight")) for n in names)
    assert target_path.stat().st_size + drafter_path.stat().st_size < 1_000_000


def test_mismatched_drafter_override(tmp_path: Path) -> None:
    target_path, drafter_path = write_pair(tmp_path / "t.gguf", tmp_path / "d.gguf", embedding_length_out=48)
    target, drafter = read_gguf_metadata(target_path), read_gguf_metadata(drafter_path)
    assert drafter.arch_key("embedding_length_out") == 48 != target.arch_key("embedding_length")
    assert drafter.tensor("nextn.pre_projection.weight").shape == (96, DRAFTER_SHAPE.n_embd)


def test_pair_is_byte_identical_across_runs(tmp_path: Path, tiny_gemma4_pair: tuple[Path, Path]) -> None:
    """Same bytes from another interpreter (different hash seed) as from this one."""
    code = "import sys; from rigkit.sandbox.tiny_gemma4 import write_pair; write_pair(sys.argv[1], sys.argv[2])"
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", code, tmp_path / "t.gguf", tmp_path / "d.gguf"], check=True, env=env)
    assert sha256(tmp_path / "t.gguf") == sha256(tiny_gemma4_pair[0])
    assert sha256(tmp_path / "d.gguf") == sha256(tiny_gemma4_pair[1])
    write_arch_gguf(tmp_path / "a1.gguf", "llama", padding_bytes=1000)
    write_arch_gguf(tmp_path / "a2.gguf", "llama", padding_bytes=1000)
    assert sha256(tmp_path / "a1.gguf") == sha256(tmp_path / "a2.gguf")


@pytest.mark.parametrize("which", [0, 1], ids=["target", "drafter"])
def test_reader_agrees_with_gguf_package(tiny_gemma4_pair: tuple[Path, Path], which: int) -> None:
    path = tiny_gemma4_pair[which]
    ours = read_gguf_metadata(path, max_array_items=1_000_000)
    theirs = GGUFReader(path)
    their_kv = {name: field for name, field in theirs.fields.items() if not name.startswith("GGUF.")}
    assert set(ours.kv) == set(their_kv)
    for name, field in their_kv.items():
        assert ours.kv_types[name].value == field.types[0].value, name
        value = field.contents()
        if isinstance(value, float):
            assert ours.kv[name] == pytest.approx(value), name
        else:
            assert ours.kv[name] == value, name
    assert [(t.name, t.shape, t.ggml_type) for t in ours.tensors or []] == [
        (t.name, tuple(int(d) for d in t.shape), int(t.tensor_type)) for t in theirs.tensors
    ]
    assert ours.data_offset == theirs.data_offset
    assert [ours.data_offset + t.offset for t in ours.tensors or []] == [t.data_offset for t in theirs.tensors]


# ------------------------------------------------------------------------------------------ value types
def test_every_value_type_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "types.gguf"
    writer = GGUFWriter(str(path), "testarch")
    writer.add_uint8("t.u8", 200)
    writer.add_int8("t.i8", -100)
    writer.add_uint16("t.u16", 65000)
    writer.add_int16("t.i16", -32000)
    writer.add_uint32("t.u32", 4_000_000_000)
    writer.add_int32("t.i32", -2_000_000_000)
    writer.add_float32("t.f32", 1.5)
    writer.add_bool("t.bool", True)
    writer.add_string("t.str", "héllo")
    writer.add_uint64("t.u64", 2**63 + 5)
    writer.add_int64("t.i64", -(2**62))
    writer.add_float64("t.f64", 3.141592653589793)
    writer.add_array("t.arr_i32", [1, -2, 3])
    writer.add_array("t.arr_str", ["a", "bc", ""])
    writer.add_array("t.arr_bool", [True, False])
    writer.add_array("t.big", list(range(5000)))
    writer.add_array("t.big_str", [f"tok{i}" for i in range(5000)])
    writer.add_tensor("x.weight", np.zeros((2, 3), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    meta = read_gguf_metadata(path)
    assert meta.architecture == "testarch"
    expected = {
        "t.u8": 200,
        "t.i8": -100,
        "t.u16": 65000,
        "t.i16": -32000,
        "t.u32": 4_000_000_000,
        "t.i32": -2_000_000_000,
        "t.f32": 1.5,
        "t.bool": True,
        "t.str": "héllo",
        "t.u64": 2**63 + 5,
        "t.i64": -(2**62),
        "t.f64": 3.141592653589793,
        "t.arr_i32": [1, -2, 3],
        "t.arr_str": ["a", "bc", ""],
        "t.arr_bool": [True, False],
    }
    for key, value in expected.items():
        assert meta.kv[key] == value, key
    assert meta.kv["t.big"] == GgufArray(GgufValueType.INT32, 5000)
    assert meta.kv["t.big_str"] == GgufArray(GgufValueType.STRING, 5000)
    assert meta.array_length("t.big_str") == 5000
    assert meta.kv_types["t.u64"] == GgufValueType.UINT64
    full = read_gguf_metadata(path, max_array_items=10_000)
    assert full.kv["t.big"] == list(range(5000)) and full.kv["t.big_str"][4999] == "tok4999"
    assert meta.tensor("x.weight").shape == (3, 2) and meta.tensor("x.weight").type_name == "F16"
    assert meta.tensor_data_end() == meta.data_offset + 12


def test_big_endian_file(tmp_path: Path) -> None:
    path = tmp_path / "be.gguf"
    writer = GGUFWriter(str(path), "bearch", endianess=GGUFEndian.BIG)
    writer.add_uint32("bearch.block_count", 7)
    writer.add_array("bearch.pattern", [True, False, True])
    writer.add_tensor("x.weight", np.ones((4,), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    meta = read_gguf_metadata(path)
    assert meta.byte_order == ">" and meta.version == 3
    assert meta.arch_key("block_count") == 7 and meta.arch_key("pattern") == [True, False, True]
    assert meta.tensor("x.weight").shape == (4,)


def test_arch_key_missing_names_file_and_key(tiny_gemma4_pair: tuple[Path, Path]) -> None:
    meta = read_gguf_metadata(tiny_gemma4_pair[0])
    with pytest.raises(GgufError, match=r"tiny-gemma4\.gguf: metadata key 'gemma4\.nope' is missing"):
        meta.arch_key("nope")
    assert meta.arch_key("nope", None) is None


def test_read_tensors_false_skips_tensor_infos(tiny_gemma4_pair: tuple[Path, Path]) -> None:
    meta = read_gguf_metadata(tiny_gemma4_pair[0], read_tensors=False)
    assert meta.tensors is None and meta.data_offset is None and meta.tensor_data_end() is None
    assert meta.tensor_count == len(expected_target_tensors())


# ------------------------------------------------------------------------------------------ errors
def test_bad_magic_is_named(tmp_path: Path) -> None:
    path = tmp_path / "page.gguf"
    path.write_bytes(b"<!DOCTYPE html><html>Access denied</html>")
    with pytest.raises(GgufError, match=r"page\.gguf: not a GGUF file: magic is b'<!DO', expected b'GGUF'") as err:
        read_gguf_metadata(path)
    assert err.value.path == str(path)


def test_lfs_pointer_is_not_gguf(tmp_path: Path) -> None:
    path = tmp_path / "pointer.gguf"
    path.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 12\n")
    with pytest.raises(GgufError, match="not a GGUF file"):
        read_gguf_metadata(path)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(GgufError, match="only 0 bytes"):
        read_gguf_metadata(path)


@pytest.mark.parametrize("version", [1, 4, 0xDEADBEEF])
def test_unsupported_version(tmp_path: Path, tiny_gemma4_pair: tuple[Path, Path], version: int) -> None:
    data = bytearray(tiny_gemma4_pair[0].read_bytes())
    data[4:8] = struct.pack("<I", version)
    path = tmp_path / "v.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(GgufError, match="unsupported GGUF version"):
        read_gguf_metadata(path)


def test_truncated_header_at_every_region(tmp_path: Path, tiny_gemma4_pair: tuple[Path, Path]) -> None:
    data = tiny_gemma4_pair[0].read_bytes()
    full = read_gguf_metadata(tiny_gemma4_pair[0])
    assert full.data_offset is not None
    # inside version, counts, keys, the token array, the tensor infos
    for cut in (6, 12, 30, 200, 2000, full.data_offset - 40):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(GgufError, match=r"cut\d+\.gguf: truncated GGUF header"):
            read_gguf_metadata(path)
    # the header survives a cut in the tensor data; tensor_data_end() then exceeds the file size
    path = tmp_path / "data-cut.gguf"
    path.write_bytes(data[: full.data_offset + 100])
    meta = read_gguf_metadata(path)
    assert meta.tensor_data_end() == len(data) > meta.file_size


def test_corrupt_lengths_do_not_allocate(tmp_path: Path, tiny_gemma4_pair: tuple[Path, Path]) -> None:
    data = bytearray(tiny_gemma4_pair[0].read_bytes())
    data[24:32] = struct.pack("<Q", 2**40)  # first key's length
    path = tmp_path / "corrupt.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(GgufError, match="corrupt GGUF header"):
        read_gguf_metadata(path)
    data = bytearray(tiny_gemma4_pair[0].read_bytes())
    data[16:24] = struct.pack("<Q", 2**50)  # key/value count
    path.write_bytes(bytes(data))
    with pytest.raises(GgufError, match="corrupt GGUF header"):
        read_gguf_metadata(path)


# ------------------------------------------------------------------------------------------ real model
def test_real_gemma3_270m(gemma3_270m_gguf: Path) -> None:
    meta = read_gguf_metadata(gemma3_270m_gguf)
    assert meta.version == 3
    assert meta.architecture == "gemma3"
    assert meta.tensor_count == len(meta.tensors or []) == 236
    assert meta.arch_key("embedding_length") == 640
    assert meta.arch_key("block_count") == 18
    assert meta.arch_key("attention.head_count_kv") == 1
    assert meta.arch_key("attention.key_length") == 256
    assert meta.vocab_size == 262144
    tokens = meta.kv["tokenizer.ggml.tokens"]
    assert isinstance(tokens, GgufArray) and tokens.item_type == GgufValueType.STRING
    assert meta.tensor_data_end() == meta.file_size == 253_113_024
    assert meta.tensor("token_embd.weight").type_name == "Q8_0"


def test_real_gemma3_270m_materialised_vocab(gemma3_270m_gguf: Path) -> None:
    """Raising max_array_items materialises the 262k-token vocabulary (GGUFReader needs ~25 s for this file, so
    the cross-check against the gguf package runs on the tiny files only)."""
    meta = read_gguf_metadata(gemma3_270m_gguf, read_tensors=False, max_array_items=300_000)
    tokens = meta.kv["tokenizer.ggml.tokens"]
    assert isinstance(tokens, list) and len(tokens) == 262144
    assert tokens[:4] == ["<pad>", "<eos>", "<bos>", "<unk>"]
    assert tokens[meta.get("tokenizer.ggml.bos_token_id")] == "<bos>"
    assert len(meta.kv["tokenizer.ggml.scores"]) == 262144


def test_fixture_module_cli(tmp_path: Path) -> None:
    """`python rigkit/sandbox/tiny_gemma4.py DIR` writes the pair (for people poking at llama-server by hand)."""
    out = subprocess.run(
        [sys.executable, str(Path(tiny_gemma4.__file__)), str(tmp_path)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    ).stdout.split()
    assert [Path(p).name for p in out] == ["tiny-gemma4.gguf", "tiny-gemma4-assistant.gguf"]
