"""The main job on the embedded default rig: `make provision host=sandbox`, then again with nothing to do (the
no-op fast path), then the full path without the record, and after a hand edit."""

from __future__ import annotations

from tests.support import recap, run

FAST_PATH = "rig_state : Compare the rig with what its last full converge recorded"
RECORD = "/var/lib/rigkit/converged.json"
HEALTH = "llama_server : Check that the server answers, with the canary it passed since it last started"
ENV_TASK = "llama_server : Write the environment file (root-only, may hold the API key)"
REPORT = "llama_server : Report where the server answers"
FAST_PATH_REPORT = "rig_state : Report the rigs that match their last converge"


def provision_sandbox(log_name: str):
    return run(["make", "--no-print-directory", "provision", "host=sandbox"], log_name=log_name, results=True)


def test_second_converge_takes_the_fast_path_and_changes_nothing(sandbox_provisioned):
    second = provision_sandbox("provision-sandbox-second")
    assert second.returncode == 0, second.tail(120)
    counters = recap(second.output)["sandbox"]
    assert counters["changed"] == 0, second.tail(120)
    assert counters["failed"] == 0
    assert second.statuses("sandbox", FAST_PATH) == ["ok"]
    assert "sandbox: as its last converge left it: no role runs on it in this run" in second.output
    # no role ran, and the server was still asked, in the fast path's own module run: /health and the canary
    # of its current run (no second round trip: the probe module does not run)
    assert second.tasks("sandbox", "llamacpp_image : Build the image") == []
    assert second.tasks("sandbox", "llama_server : Write the unit") == []
    assert second.tasks("sandbox", HEALTH) == []
    # the line a run ends with comes from the record on the rig (what it runs) and the canary's figures
    assert second.tasks("sandbox", REPORT) == [] and second.statuses("sandbox", FAST_PATH_REPORT) == ["ok"]
    assert 'llama-server "main" on sandbox answers at http://127.0.0.1:18080' in " ".join(second.output.split())
    assert "draft-simple): draft acceptance" in " ".join(second.output.split())


def test_a_server_restarted_since_its_canary_is_sent_one_on_the_fast_path(sandbox_provisioned):
    """A restart (a crash, a reboot) leaves the rig as recorded, but the server's current run has passed no canary:
    the fast path names the rig's settings (roles/rig_context, only now) and sends one, changing nothing."""
    unit = "rigkit-llama-main.service"
    assert run(["docker", "exec", "rigkit-sandbox", "systemctl", "restart", unit]).returncode == 0
    again = provision_sandbox("provision-sandbox-restarted")
    assert again.returncode == 0, again.tail(120)
    assert recap(again.output)["sandbox"]["changed"] == 0, again.tail(120)
    assert again.statuses("sandbox", FAST_PATH) == ["ok"]
    assert again.statuses("sandbox", HEALTH) == ["ok"]
    assert again.statuses("sandbox", REPORT) == ["ok"]
    assert "sandbox: as its last converge left it: no role runs on it in this run" in again.output
    after = provision_sandbox("provision-sandbox-after-restart")
    assert after.tasks("sandbox", HEALTH) == [] and after.statuses("sandbox", FAST_PATH_REPORT) == ["ok"]
    assert 'llama-server "main" on sandbox answers at' in " ".join(after.output.split())


def test_a_full_converge_of_the_converged_rig_changes_nothing_and_records_it(sandbox_provisioned):
    """Without the record every role runs, finds what it wants (changed=0), and the record is written again."""
    assert run(["docker", "exec", "rigkit-sandbox", "rm", "-f", RECORD]).returncode == 0
    full = provision_sandbox("provision-sandbox-full")
    assert full.returncode == 0, full.tail(120)
    assert recap(full.output)["sandbox"]["changed"] == 0, full.tail(120)
    assert "no converge recorded on this rig" in full.output
    # Nothing was built or shipped: the image with this tag is already on the controller and in the rig.
    assert full.statuses("sandbox", "llamacpp_image : Build the image") == ["skipped"]
    assert full.statuses("sandbox", "llama_server : Write the unit") == ["ok"]
    assert full.statuses("sandbox", "rig_state : Record that the rig is as the repo describes") == ["ok"]
    assert run(["docker", "exec", "rigkit-sandbox", "test", "-s", RECORD]).returncode == 0


def test_a_hand_edit_on_the_rig_is_seen_and_undone(sandbox_provisioned):
    """The fast path reads the rig's files: an edited env file sends the rig down the full path, which puts the
    kit's file back (and restarts the server behind its canary)."""
    env_file = "/etc/rigkit/llama-main.env"
    assert run(["docker", "exec", "rigkit-sandbox", "sh", "-c", f"echo 'EDITED=1' >> {env_file}"]).returncode == 0
    again = provision_sandbox("provision-sandbox-hand-edit")
    assert again.returncode == 0, again.tail(120)
    assert "its files changed" in again.output, again.tail(120)
    assert again.statuses("sandbox", ENV_TASK) == ["changed"]
    assert "EDITED" not in run(["docker", "exec", "rigkit-sandbox", "cat", env_file]).output
    after = provision_sandbox("provision-sandbox-after-hand-edit")
    assert after.statuses("sandbox", FAST_PATH) == ["ok"]
    assert "sandbox: as its last converge left it" in after.output


def test_sandbox_runs_its_own_engine(sandbox_provisioned):
    result = run(["docker", "exec", "rigkit-sandbox", "systemctl", "is-active", "docker"])
    assert result.output.strip() == "active"
    result = run(["docker", "exec", "rigkit-sandbox", "docker", "info", "--format", "{{.ServerVersion}}"])
    assert result.returncode == 0 and result.output.strip().startswith("20.10.24")


def test_make_logs_prints_the_servers_journal(sandbox_provisioned):
    done = run(["make", "--no-print-directory", "logs", "host=sandbox", "lines=40"], log_name="logs-sandbox")
    assert done.returncode == 0, done.tail()
    header = "== sandbox: llama-server's journal, last 40 lines"
    lines = done.output.split(header + "\n", 1)[1].splitlines()
    assert 0 < len(lines) <= 40, done.output
    assert any("llama-server" in line or "slot" in line or "srv" in line for line in lines), done.output
    assert "\x1b" not in done.output
