"""promtool for the fleet monitor's checks, fetched and unpacked into the kit's cache once, whoever asks first."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from rigkit.fleet.promtool import pinned_prometheus, prometheus_deb
from tests.support import CACHE_DIR

ASK = "import sys, pathlib, rigkit.fleet.promtool as p; print(p.promtool(pathlib.Path(sys.argv[1])))"


def test_workers_that_ask_at_once_each_get_a_whole_promtool(tmp_path: Path) -> None:
    """make test's workers load it at the same moment on a fresh cache: none may see the package or the tree half
    made or removed under it (the package is the machine cache's, fetched from Debian once per machine)."""
    deb = prometheus_deb(CACHE_DIR)
    (tmp_path / "tools" / "download").mkdir(parents=True)
    shutil.copy(deb, tmp_path / "tools" / "download" / deb.name)
    asks = [
        subprocess.Popen(
            [sys.executable, "-c", ASK, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    answers = [(*ask.communicate(timeout=120), ask.returncode) for ask in asks]
    assert all(code == 0 for _out, _err, code in answers), answers
    paths = {out.strip() for out, _err, _code in answers}
    assert len(paths) == 1, paths
    version = subprocess.run([paths.pop(), "--version"], capture_output=True, text=True, check=True)
    assert pinned_prometheus()[1].split("+")[0] in version.stdout + version.stderr
    # nothing left aside: no half-fetched package, no half-unpacked tree
    left = sorted(path.name for path in (tmp_path / "tools").iterdir())
    assert left == ["download", f"prometheus-{pinned_prometheus()[0]}"], left
    assert [path.name for path in (tmp_path / "tools" / "download").iterdir()] == [deb.name]
