"""A build killed mid-way leaves its context behind; the next build removes it, and only contexts that are older
than the longest build the kit waits for (a younger one may be another tag's build in flight)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support import REPO, kit_env

PLAYBOOK = REPO / "tests/unit/playbooks/stale_contexts.yml"


def cleanup(work_dir: Path, timeout: int) -> subprocess.CompletedProcess[str]:
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), str(PLAYBOOK)]
    argv += ["-e", f"llamacpp_image_work_dir={work_dir}", "-e", f"llamacpp_image_build_timeout={timeout}"]
    return subprocess.run(argv, cwd=REPO, env=kit_env(), capture_output=True, text=True, timeout=300, check=False)


def test_only_contexts_older_than_the_build_timeout_are_removed(tmp_path: Path) -> None:
    work = tmp_path / "llamacpp"
    stale, in_flight = work / "context-rigkit_llama-server_killed", work / "context-rigkit_llama-server_building"
    for context in (stale, in_flight):
        (context / "src").mkdir(parents=True)
        (context / "Dockerfile").write_text("FROM scratch\n")
    (work / "build-rigkit_llama-server_killed.log").write_text("$ docker build\n")
    two_hours_ago = time.time() - 7300
    os.utime(stale, (two_hours_ago, two_hours_ago))

    done = cleanup(work, 7200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert not stale.exists()
    assert (in_flight / "Dockerfile").is_file()  # another build's, younger than the timeout
    assert (work / "build-rigkit_llama-server_killed.log").is_file()  # the log tells what happened: kept

    again = cleanup(work, 7200)
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-2000:]


def test_a_missing_work_dir_is_created_not_warned_about(tmp_path: Path) -> None:
    work = tmp_path / "fresh" / "llamacpp"
    done = cleanup(work, 7200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert work.is_dir() and oct(work.stat().st_mode & 0o777) == "0o750"
    assert "WARNING" not in done.stdout + done.stderr
