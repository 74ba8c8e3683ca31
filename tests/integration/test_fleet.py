"""A fleet of three sandbox rigs (sandbox, sandbox-mtp and a third, sandbox-3): rolling provision, the status
table, the lock file, a broken rig stopping the rollout while the others keep serving, a rebuild that reproduces
its lock entry, and the drift check before and after a hand edit on a rig."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import ARTIFACTS, LLAMACPP_BUILD_INFO, LLAMACPP_COMMIT, recap, run

FLEET = ["sandbox", "sandbox-mtp", "sandbox-3"]
URLS = {"sandbox": 18080, "sandbox-mtp": 18081, "sandbox-3": 18082}
UNIT = "/etc/systemd/system/rigkit-llama-main.service"
INVENTORY = "inventory/hosts.yml,tests/integration/inventories/rollout"
BROKEN_INVENTORY = "inventory/hosts.yml,tests/integration/inventories/rollout-broken"
PROVISION_PLAY = "PLAY [Provision the rigs, one at a time]"


def container(host: str) -> str:
    return f"rigkit-{host}"


def in_rig(host: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "exec", container(host), *argv], capture_output=True, text=True, check=False)


def health(host: str) -> str:
    return in_rig(host, "curl", "-s", f"http://127.0.0.1:{URLS[host]}/health").stdout.strip()


def make(target: str, *extra: str, inventory: str = INVENTORY, lock: Path, log: str, results: bool = False):
    return run(
        ["make", "--no-print-directory", target, *extra],
        log_name=log,
        results=results,
        ANSIBLE_INVENTORY=inventory,
        RIGKIT_LOCK_FILE=str(lock),
    )


def record_time(name: str, seconds: float) -> None:
    """Wall times for the closing notes: .artifacts/fleet-times.json."""
    path = ARTIFACTS / "fleet-times.json"
    ARTIFACTS.mkdir(exist_ok=True)
    times = json.loads(path.read_text()) if path.exists() else {}
    times[name] = round(seconds, 1)
    path.write_text(json.dumps(times, indent=1))


def remove_third_rig() -> None:
    subprocess.run(["docker", "rm", "-f", container("sandbox-3")], capture_output=True, check=False)
    subprocess.run(
        ["docker", "volume", "rm", "-f", f"{container('sandbox-3')}-docker"], capture_output=True, check=False
    )


@pytest.fixture(scope="module")
def fleet(sandbox_provisioned, mtp_provisioned, tmp_path_factory):
    """The three rigs provisioned as one fleet, the third from nothing."""
    remove_third_rig()
    lock = tmp_path_factory.mktemp("fleet") / "rigs.lock.json"
    started = time.monotonic()
    result = make("provision", f"host={','.join(FLEET)}", lock=lock, log="fleet-provision")
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.tail(80)
    record_time("provision 3 rigs (2 converged, 1 new)", elapsed)
    yield {"lock": lock, "output": result.output, "seconds": elapsed}
    remove_third_rig()


def test_fleet_rolls_one_rig_at_a_time(fleet):
    output = fleet["output"]
    assert output.count(PROVISION_PLAY) == 3, "serial: 1 runs the provision play once per rig"
    starts = [output.index(f"[{host}]", output.index(PROVISION_PLAY)) for host in FLEET]
    assert starts == sorted(starts)
    counts = recap(output)
    assert all(counts[host]["failed"] == 0 for host in FLEET)
    for host in FLEET:
        assert health(host) == '{"status":"ok"}', host


def test_a_fleet_provision_runs_roles_only_on_the_rigs_that_differ(fleet):
    """Rigs as their last converge left them take the fast path, all at once; only a rig that differs rolls."""
    again = make("provision", f"host={','.join(FLEET)}", lock=fleet["lock"], log="fleet-provision-noop", results=True)
    assert again.returncode == 0, again.tail(60)
    for host in FLEET:
        assert f"{host}: as its last converge left it" in again.output, again.tail(60)
        assert again.tasks(host, "llama_server : Write the unit") == [], host
        assert recap(again.output)[host]["changed"] == 0, host
    in_rig("sandbox-3", "sh", "-c", f"echo '# edited by hand' >> {UNIT}")
    one = make(
        "provision", f"host={','.join(FLEET)}", lock=fleet["lock"], log="fleet-provision-one-differs", results=True
    )
    assert one.returncode == 0, one.tail(80)
    assert one.statuses("sandbox-3", "llama_server : Write the unit") == ["changed"]
    for host in ("sandbox", "sandbox-mtp"):
        assert one.tasks(host, "llama_server : Write the unit") == [], host
        assert recap(one.output)[host]["changed"] == 0, host
    assert "# edited by hand" not in in_rig("sandbox-3", "cat", UNIT).stdout
    for host in FLEET:
        assert health(host) == '{"status":"ok"}', host


def test_lock_records_every_rig(fleet):
    rigs = json.loads(fleet["lock"].read_text())["rigs"]
    assert sorted(rigs) == sorted(FLEET)
    for host, entry in rigs.items():
        assert entry["image"]["llamacpp_commit"] == LLAMACPP_COMMIT, host
        assert entry["image"]["tag"].startswith(f"rigkit/llama-server:{LLAMACPP_BUILD_INFO}-cpu-"), host
        assert entry["packages"]["docker.io"].startswith("20.10.24"), host
        unit_sha = in_rig(host, "sha256sum", UNIT).stdout.split()[0]
        assert entry["unit_sha256"] == unit_sha, host
        assert len(entry["models"]["target"]["sha256"]) == 64, host
    assert rigs["sandbox-3"]["models"] == rigs["sandbox-mtp"]["models"]


def test_status_shows_all_three(fleet):
    table = make("status", f"host={','.join(FLEET)}", lock=fleet["lock"], log="fleet-status")
    assert table.returncode == 0, table.output
    rows = {
        line.split()[0]: line for line in table.output.splitlines() if line.split()[:1] and line.split()[0] in FLEET
    }
    assert sorted(rows) == sorted(FLEET)
    for line in rows.values():
        assert " yes " in line and LLAMACPP_BUILD_INFO in line and "(verified)" in line and "active" in line, line
    as_json = make("status", f"host={','.join(FLEET)}", "json=1", lock=fleet["lock"], log="fleet-status-json")
    data = json.loads(as_json.output[as_json.output.index("{") :])
    assert all(data[host]["reachable"] for host in FLEET)
    assert data["sandbox-3"]["deployed"]["server"]["ctx_per_slot"] == 512
    for host in FLEET:  # read back from the running container, equal to what the inventory says
        running, expected = data[host]["deployed"]["container"]["settings"], data[host]["expected"]
        assert {key: str(running.get(key)) for key in ("ctx_size", "parallel")} == {
            key: str(expected[key]) for key in ("ctx_size", "parallel")
        }, host
        if expected["spec_type"] != "none":
            assert str(running["draft_n_max"]) == str(expected["draft_n_max"]), host
    assert " !" not in table.output, table.output


def test_broken_rig_stops_the_rollout_and_the_others_keep_serving(fleet):
    third_unit = in_rig("sandbox-3", "cat", UNIT).stdout
    mtp_unit = in_rig("sandbox-mtp", "cat", UNIT).stdout
    result = make(
        "provision", f"host={','.join(FLEET)}", inventory=BROKEN_INVENTORY, lock=fleet["lock"], log="fleet-broken"
    )
    assert result.returncode != 0
    assert "llama_server_ctx_size" in result.output
    counts = recap(result.output)
    assert counts["sandbox"]["failed"] == 0 and counts["sandbox"]["changed"] == 0
    assert counts["sandbox-mtp"]["failed"] == 1
    # The controller's cache holds the tiny gemma4 pair (the fleet's first provision fetched it): the validation
    # play refuses the broken rig from the cached header, and with it the whole run, before any rig is touched.
    assert "controller preflight on the cached GGUF headers" in result.output
    assert PROVISION_PLAY not in result.output, "the run stops before any rig is provisioned"
    # the broken rig's server was never touched; the rig after it kept its old draft length
    assert in_rig("sandbox-mtp", "cat", UNIT).stdout == mtp_unit
    assert in_rig("sandbox-3", "cat", UNIT).stdout == third_unit
    assert "--spec-draft-n-max 2" in re.sub(r'[\s\\"]+', " ", third_unit)
    for host in FLEET:
        assert health(host) == '{"status":"ok"}', host


def test_rebuild_reproduces_the_lock_entry(fleet):
    before = json.loads(fleet["lock"].read_text())["rigs"]["sandbox-3"]
    started = time.monotonic()
    result = make("rebuild", "host=sandbox-3", lock=fleet["lock"], log="fleet-rebuild", results=True)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.tail(80)
    assert result.statuses("sandbox-3", "models : Remove the models directory") == ["changed"]
    assert result.statuses("sandbox-3", "llamacpp_image : Remove the image from the rig") == ["changed"]
    assert "sandbox-3 reproduced its lock entry" in result.output
    after = json.loads(fleet["lock"].read_text())["rigs"]["sandbox-3"]
    assert {k: v for k, v in after.items() if k != "image"} == {k: v for k, v in before.items() if k != "image"}
    assert after["image"]["tag"] == before["image"]["tag"]
    assert health("sandbox-3") == '{"status":"ok"}'
    record_time("rebuild sandbox-3", elapsed)


def test_check_finds_no_drift_then_the_hand_edit(fleet):
    started = time.monotonic()
    clean = make("check", "host=sandbox-3", lock=fleet["lock"], log="fleet-check-clean")
    record_time("check sandbox-3 (no drift)", time.monotonic() - started)
    assert clean.returncode == 0, clean.tail(60)
    assert "sandbox-3: no drift" in clean.output
    in_rig("sandbox-3", "sh", "-c", f"echo '# edited by hand' >> {UNIT}")
    drifted = make("check", "host=sandbox-3", lock=fleet["lock"], log="fleet-check-drift")
    assert drifted.returncode == 2, drifted.tail(60)
    summary = drifted.output[drifted.output.index("rigkit drift summary:") :]
    assert "sandbox-3: DRIFT" in summary and "Write the unit" in summary
    assert "# edited by hand" in drifted.output  # the diff shows what differs
