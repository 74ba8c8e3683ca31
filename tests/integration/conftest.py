"""Integration tests converge real roles in real containers: they need the harness first."""

from __future__ import annotations

import pytest

from tests.support import ARTIFACTS, recap, run


@pytest.fixture(scope="session")
def harness() -> dict[str, int]:
    """Docker engine + base and rig images, as `make harness` leaves them; returns the second run's recap. One
    worker at a time (each worker has its session): the second run of each must find nothing to change."""
    import fcntl

    ARTIFACTS.mkdir(exist_ok=True)
    with (ARTIFACTS / ".harness.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        first = run(["ansible-playbook", "playbooks/harness.yml"], log_name="harness-first")
        assert first.returncode == 0, first.tail()
        second = run(["ansible-playbook", "playbooks/harness.yml"], log_name="harness-second")
        assert second.returncode == 0, second.tail()
    return recap(second.output)["localhost"]


@pytest.fixture(scope="session")
def llama_image(harness) -> None:
    """The sandbox rigs' llama.cpp image (one tag for every sandbox rig the tests make), made once per worker
    before a test provisions a sandbox rig: `make image host=sandbox` builds it, and workers that ask while it builds
    wait for that one build (the role's build lock) instead of each starting their own, then find it (about 2 s when
    the engine has it)."""
    built = run(["make", "--no-print-directory", "image", "host=sandbox"], log_name="image-sandbox")
    assert built.returncode == 0, built.tail(80)


@pytest.fixture(scope="session")
def sandbox_provisioned(llama_image) -> str:
    """`make provision host=sandbox` from whatever state the sandbox is in; returns its output."""
    first = run(["make", "--no-print-directory", "provision", "host=sandbox"], log_name="provision-sandbox-first")
    assert first.returncode == 0, first.tail(120)
    return first.output


@pytest.fixture(scope="session")
def mtp_provisioned(llama_image) -> str:
    """`make provision host=sandbox-mtp` (the tiny gemma4 pair on draft-mtp); returns its output."""
    first = run(
        ["make", "--no-print-directory", "provision", "host=sandbox-mtp"], log_name="provision-sandbox-mtp-first"
    )
    assert first.returncode == 0, first.tail(120)
    return first.output
