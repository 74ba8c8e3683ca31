"""tests/conftest.py's skip policy, on a real pytest run: under CI only "not applicable" skips pass."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import REPO

TESTS = """
import pytest
from tests.support import not_applicable

def test_gpu_check():
    not_applicable("this host has no GPU by inventory")

def test_passes():
    assert True
"""

BARE_SKIP = """
import pytest

def test_skipped_for_no_reason_ci_accepts():
    pytest.skip("flaky today")
"""


def pytest_run(tmp_path: Path, body: str, ci: bool) -> subprocess.CompletedProcess:
    (tmp_path / "test_sample.py").write_text(body)
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    if ci:
        env["CI"] = "true"
    argv = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-o", "addopts="]
    argv += ["--rootdir", str(tmp_path), str(tmp_path / "test_sample.py")]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_not_applicable_skips_pass_under_ci(tmp_path: Path) -> None:
    done = pytest_run(tmp_path, TESTS, ci=True)
    assert done.returncode == 0, done.stdout
    assert "skips: 1 (1 not applicable by inventory, 0 other)" in done.stdout


def test_a_bare_skip_fails_a_ci_run_and_is_named(tmp_path: Path) -> None:
    done = pytest_run(tmp_path, TESTS + BARE_SKIP, ci=True)
    assert done.returncode == 1, done.stdout
    assert "skips: 2 (1 not applicable by inventory, 1 other)" in done.stdout
    named = "CI does not accept this skip: test_sample.py::test_skipped_for_no_reason_ci_accepts: flaky today"
    assert named in done.stdout


def test_a_bare_skip_is_only_counted_off_ci(tmp_path: Path) -> None:
    done = pytest_run(tmp_path, TESTS + BARE_SKIP, ci=False)
    assert done.returncode == 0, done.stdout
    assert "skips: 2 (1 not applicable by inventory, 1 other)" in done.stdout
