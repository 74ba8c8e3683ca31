"""The main job on the embedded default rig: `make provision host=sandbox`, then again with nothing to do."""

from __future__ import annotations

from tests.support import recap, run


def test_second_converge_changes_nothing(sandbox_provisioned):
    second = run(
        ["make", "--no-print-directory", "provision", "host=sandbox"], log_name="provision-sandbox-second", results=True
    )
    assert second.returncode == 0, second.tail(120)
    counters = recap(second.output)["sandbox"]
    assert counters["changed"] == 0, second.tail(120)
    assert counters["failed"] == 0
    # Nothing was built or shipped: the image with this tag is already on the controller and in the rig.
    assert second.statuses("sandbox", "llamacpp_image : Build the image") == ["skipped"]


def test_sandbox_runs_its_own_engine(sandbox_provisioned):
    result = run(["docker", "exec", "rigkit-sandbox", "systemctl", "is-active", "docker"])
    assert result.output.strip() == "active"
    result = run(["docker", "exec", "rigkit-sandbox", "docker", "info", "--format", "{{.ServerVersion}}"])
    assert result.returncode == 0 and result.output.strip().startswith("20.10.24")
