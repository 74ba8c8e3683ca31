"""Integration tests converge real roles in real containers: they need the harness first."""

from __future__ import annotations

import pytest

from tests.support import recap, run


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.path):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def harness() -> dict[str, int]:
    """Docker engine + base and rig images, as `make harness` leaves them; returns the second run's recap."""
    first = run(["ansible-playbook", "playbooks/harness.yml"], log_name="harness-first")
    assert first.returncode == 0, first.tail()
    second = run(["ansible-playbook", "playbooks/harness.yml"], log_name="harness-second")
    assert second.returncode == 0, second.tail()
    return recap(second.output)["localhost"]


@pytest.fixture(scope="session")
def sandbox_provisioned(harness) -> str:
    """`make provision host=sandbox` from whatever state the sandbox is in; returns its output."""
    first = run(["make", "--no-print-directory", "provision", "host=sandbox"], log_name="provision-sandbox-first")
    assert first.returncode == 0, first.tail(120)
    return first.output
