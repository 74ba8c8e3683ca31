"""The main job on the embedded default rig: `make provision host=sandbox`, then again with nothing to do."""

from __future__ import annotations

import pytest

from tests.support import recap, run


@pytest.fixture(scope="module")
def provisioned(harness):
    first = run(["make", "--no-print-directory", "provision", "host=sandbox"], log_name="provision-sandbox-first")
    assert first.returncode == 0, first.tail(120)
    return first


def test_second_converge_changes_nothing(provisioned):
    second = run(["make", "--no-print-directory", "provision", "host=sandbox"], log_name="provision-sandbox-second")
    assert second.returncode == 0, second.tail(120)
    counters = recap(second.output)["sandbox"]
    assert counters["changed"] == 0, second.tail(120)
    assert counters["failed"] == 0


def test_sandbox_runs_its_own_engine(provisioned):
    result = run(["docker", "exec", "rigkit-sandbox", "systemctl", "is-active", "docker"])
    assert result.output.strip() == "active"
    result = run(["docker", "exec", "rigkit-sandbox", "docker", "info", "--format", "{{.ServerVersion}}"])
    assert result.returncode == 0 and result.output.strip().startswith("20.10.24")
