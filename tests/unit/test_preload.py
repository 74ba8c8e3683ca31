"""callback_plugins/rigkit_preload.py: what it loads before Ansible forks its workers (the speed it buys is measured
by tests/bench/bench_converge.py, never asserted here)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from rigkit.rig_inputs import code_digest

REPO = Path(__file__).resolve().parents[2]


def _load_callback():
    spec = importlib.util.spec_from_file_location(
        "rigkit_preload_under_test", REPO / "callback_plugins" / "rigkit_preload.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_playbook_start_digests_the_kit_once_for_the_whole_run() -> None:
    module = _load_callback()
    code_digest.cache_clear()
    module.CallbackModule().v2_playbook_on_start(None)
    assert code_digest.cache_info().currsize == 1
    assert str(REPO) == module.KIT  # the checkout whose digest filter rig_inputs_digest asks for
    before = code_digest.cache_info().hits
    code_digest(str(REPO))
    assert code_digest.cache_info().hits == before + 1


def test_playbook_start_loads_the_kit_filter_plugins_in_the_controller_process() -> None:
    """In a fresh interpreter (nothing imported yet): after the callback's start, the controller code the kit's
    filters import is loaded, so a worker forked afterwards inherits it."""
    probe = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("preload", {str(REPO / "callback_plugins" / "rigkit_preload.py")!r})
module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
from ansible.plugins.loader import filter_loader, init_plugin_loader
init_plugin_loader()
filter_loader.add_directory({str(REPO / "filter_plugins")!r})
assert "rigkit.validation.rules" not in sys.modules
module.CallbackModule().v2_playbook_on_start(None)
wanted = ("rigkit.validation.rules", "rigkit.rig_inputs", "rigkit.validation.preflight")
print(sorted(name for name in wanted if name in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.split("\n")[-2] == "['rigkit.rig_inputs', 'rigkit.validation.preflight', 'rigkit.validation.rules']"
    )
