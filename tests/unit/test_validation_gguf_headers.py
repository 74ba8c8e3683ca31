"""rigkit/validation/gguf_headers.py: the controller preflight's headers, parsed once per file and read back from JSON
exactly as parsed (real GGUF files written by the sandbox's tiny gemma4 writer)."""

from __future__ import annotations

import json
from pathlib import Path

import rigkit  # noqa: F401  (first: it makes module_utils/ importable as ansible.module_utils)

# isort: split
from ansible.module_utils.gguf_metadata import read_gguf_metadata
from ansible.module_utils.preflight.server import preflight

from rigkit.sandbox.tiny_gemma4 import write_pair
from rigkit.validation.gguf_headers import cached_reader, to_json

SETTINGS = {"spec_type": "draft-mtp", "ctx_size": 512, "gpu_layers": 0, "gpu_layers_draft": 0, "flash_attn": "off"}


def test_a_cached_header_is_the_parsed_one_and_the_second_read_uses_the_cache(tmp_path: Path) -> None:
    target, drafter = write_pair(tmp_path / "t.gguf", tmp_path / "d.gguf")
    read = cached_reader(str(tmp_path / "cache"))
    first = read(target)
    assert to_json(first) == to_json(read_gguf_metadata(target, read_tensors=True))
    (entry,) = (tmp_path / "cache" / "headers").iterdir()
    marked = json.loads(entry.read_text())
    marked["version"] = 99  # the second read returns what the cache holds, not a new parse
    entry.write_text(json.dumps(marked))
    assert read(target).version == 99
    entry.write_text("{not json")  # an unreadable entry costs only the parse
    assert to_json(read(target)) == to_json(first)
    direct = preflight(target, drafter, SETTINGS, 4096)
    cached = preflight(target, drafter, SETTINGS, 4096, read)
    assert (cached.problems, cached.warnings, cached.facts) == (direct.problems, direct.warnings, direct.facts)


def test_a_changed_file_is_parsed_again(tmp_path: Path) -> None:
    target, _ = write_pair(tmp_path / "t.gguf", tmp_path / "d.gguf")
    read = cached_reader(str(tmp_path / "cache"))
    read(target)
    wider, _ = write_pair(tmp_path / "t.gguf", tmp_path / "d.gguf", embedding_length_out=128)
    assert to_json(read(wider)) == to_json(read_gguf_metadata(wider, read_tensors=True))
    assert len(list((tmp_path / "cache" / "headers").iterdir())) == 2
