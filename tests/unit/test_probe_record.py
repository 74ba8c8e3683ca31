"""The canary record (module_utils/llama_server/unit.py): the no-op converge reuses the figures of the canary the
server passed since it last started, and sends a new canary whenever that cannot be shown (another run, no or a
bad file)."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from types import ModuleType

import pytest

FIGURES = {
    "draft_n": 24,
    "draft_n_accepted": 23,
    "acceptance": 23 / 24,
    "predicted_per_second": 41.5,
    "speculative": True,
    "build_info": "b11312-0c1e5709",
}


@pytest.fixture(scope="module")
def probe() -> ModuleType:
    """module_utils/llama_server/unit.py, where llama_server_probe and rig_converged's fast path read the record."""
    from ansible.module_utils.llama_server import unit

    import rigkit  # noqa: F401  (it makes module_utils/ importable as ansible.module_utils)

    return unit


def test_the_figures_of_this_run_of_the_unit_come_back(probe: ModuleType, tmp_path: Path) -> None:
    record = tmp_path / "main.canary.json"
    probe.write_record(str(record), "inv-1", {**FIGURES, "waited": 3.2, "changed": False})
    assert probe.read_record(str(record), "inv-1") == FIGURES
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert json.loads(record.read_text())["invocation"] == "inv-1"
    assert not (tmp_path / "main.canary.json.tmp").exists()


def test_a_restarted_server_gets_a_new_canary(probe: ModuleType, tmp_path: Path) -> None:
    record = tmp_path / "main.canary.json"
    probe.write_record(str(record), "inv-1", FIGURES)
    assert probe.read_record(str(record), "inv-2") is None  # the unit ran again since: its canary is stale
    assert probe.read_record(str(record), "") is None  # the unit's run cannot be told: never trust the record


@pytest.mark.parametrize(
    "content",
    ["", "not json", "[1, 2]", json.dumps({"invocation": "inv-1", "draft_n": 3})],
    ids=["empty", "garbage", "not-an-object", "figures-missing"],
)
def test_an_unusable_record_means_a_canary(probe: ModuleType, tmp_path: Path, content: str) -> None:
    record = tmp_path / "main.canary.json"
    record.write_text(content)
    assert probe.read_record(str(record), "inv-1") is None
    assert probe.read_record(str(tmp_path / "missing.json"), "inv-1") is None
