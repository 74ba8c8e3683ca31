"""`.gitignore` keeps secrets and local environments out of commits, wherever they land."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

IGNORED = [
    ".env",
    "roles/x/.env",
    ".env.local",
    "server.pem",
    "inventory/host_vars/tls/rig.key",
    "venv/bin/python",
    "tools/venv/lib/x.py",
    ".venv/bin/python",
    "sub/.venv/bin/python",
    ".vault_pass",
    ".vault_pass.txt",
    "run/mirror.secret",
    "playbooks/models.retry",
]
KEPT = ["reports/README.md", "reports/rig1/2026-01-01.json", "README.md", "inventory/group_vars/all/models.yml"]


@pytest.fixture(scope="module")
def git() -> str:
    found = shutil.which("git")
    if found is None:
        pytest.fail("git is not installed: install it (apt-get install git) to run this test")
    return found


def check_ignore(git: str, paths: list[str]) -> set[str]:
    done = subprocess.run(
        [git, "check-ignore", "--no-index", "--stdin"],
        input="\n".join(paths) + "\n",
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    return set(done.stdout.split())


def test_secrets_and_environments_are_ignored(git: str) -> None:
    assert check_ignore(git, IGNORED) == set(IGNORED)


def test_reports_and_the_kit_are_not(git: str) -> None:
    assert check_ignore(git, KEPT) == set()


def test_nothing_tracked_is_ignored(git: str) -> None:
    done = subprocess.run(
        [git, "ls-files", "-ci", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout == ""
