"""Integration tests converge real roles in real containers: they need the harness first."""

from __future__ import annotations

import pytest

from tests.support import BACKGROUND, REPO, BackgroundRun, recap, run, wait_for_image_build

# Tests that never need the llama.cpp image run first.
FIRST = ("test_harness.py", "test_molecule.py", "test_models_fleet.py")
# Molecule scenarios of many minutes that need nothing but the harness: started in the background as soon as the
# harness is ready, collected by their test, which runs last (tests/integration/test_molecule.py).
BACKGROUND_SCENARIOS = (("nvidia_driver", "dkms"),)


def _is_background(item: pytest.Item) -> bool:
    return any(f"[{role}-{scenario}]" in item.nodeid for role, scenario in BACKGROUND_SCENARIOS)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.path):
            item.add_marker(pytest.mark.integration)

    def rank(item: pytest.Item) -> int:
        if "/integration/" not in str(item.path):
            return -1
        if _is_background(item):
            return len(FIRST) + 1
        return FIRST.index(item.path.name) if item.path.name in FIRST else len(FIRST)

    items[:] = [item for _, item in sorted(enumerate(items), key=lambda pair: (rank(pair[1]), pair[0]))]


@pytest.fixture(scope="session")
def harness(request: pytest.FixtureRequest) -> dict[str, int]:
    """Docker engine + base and rig images, as `make harness` leaves them; returns the second run's recap.
    Then starts the background scenarios this session will collect (only those among the selected tests)."""
    first = run(["ansible-playbook", "playbooks/harness.yml"], log_name="harness-first")
    assert first.returncode == 0, first.tail()
    second = run(["ansible-playbook", "playbooks/harness.yml"], log_name="harness-second")
    assert second.returncode == 0, second.tail()
    selected = {item.nodeid for item in request.session.items if _is_background(item)}
    for role, scenario in BACKGROUND_SCENARIOS:
        if any(f"[{role}-{scenario}]" in nodeid for nodeid in selected):
            BACKGROUND[f"molecule-{role}-{scenario}"] = BackgroundRun.start(
                ["molecule", "test", "--scenario-name", scenario],
                cwd=REPO / "roles" / role,
                log_name=f"molecule-{role}-{scenario}",
            )
    return recap(second.output)["localhost"]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A background scenario whose test never collected it (the session was interrupted) is stopped."""
    for started in BACKGROUND.values():
        started.stop()


@pytest.fixture(scope="session")
def sandbox_provisioned(harness) -> str:
    """`make provision host=sandbox` from whatever state the sandbox is in; returns its output."""
    wait_for_image_build()
    first = run(["make", "--no-print-directory", "provision", "host=sandbox"], log_name="provision-sandbox-first")
    assert first.returncode == 0, first.tail(120)
    return first.output


@pytest.fixture(scope="session")
def mtp_provisioned(harness) -> str:
    """`make provision host=sandbox-mtp` (the tiny gemma4 pair on draft-mtp); returns its output."""
    wait_for_image_build()
    first = run(
        ["make", "--no-print-directory", "provision", "host=sandbox-mtp"], log_name="provision-sandbox-mtp-first"
    )
    assert first.returncode == 0, first.tail(120)
    return first.output
