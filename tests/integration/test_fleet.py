"""A fleet of three sandbox rigs of its own (rollout-1..3, tests/integration/inventories/rollout): rolling
provision, the status table, the lock file, a broken rig stopping the rollout while the others keep serving, a
rebuild that reproduces its lock entry, and the drift check before and after a hand edit on a rig. Its rigs, ports
and controller cache are its own, so it runs beside the tests that read the kit's sandboxes."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator

import pytest
import yaml

from tests.support import (
    ARTIFACTS,
    LLAMACPP_BUILD_INFO,
    LLAMACPP_COMMIT,
    REPO,
    own_cache,
    recap,
    remove_rig,
    run,
)

INVENTORY_DIR = REPO / "tests/integration/inventories/rollout"
RIGS = yaml.safe_load((INVENTORY_DIR / "hosts.yml").read_text())["all"]["children"]["rigs"]["children"]["sandbox_rigs"][
    "hosts"
]
FLEET = list(RIGS)
FIRST, BROKEN, LAST = FLEET
UNIT = "/etc/systemd/system/rigkit-llama-main.service"
INVENTORY = f"inventory/hosts.yml,{INVENTORY_DIR.relative_to(REPO)}"
BROKEN_INVENTORY = "inventory/hosts.yml,tests/integration/inventories/rollout-broken"
PROVISION_PLAY = "PLAY [Provision the rigs, one at a time]"


def in_rig(host: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker", "exec", RIGS[host]["ansible_host"], *argv], capture_output=True, text=True, check=False
    )


def health(host: str) -> str:
    return in_rig(host, "curl", "-s", f"http://127.0.0.1:{RIGS[host]['llama_server_port']}/health").stdout.strip()


def make(target: str, *extra: str, fleet: dict, inventory: str = INVENTORY, log: str, results: bool = False):
    """A make target against the fleet's rigs, with the fleet's own lock file and controller cache."""
    return run(
        ["make", "--no-print-directory", target, *extra],
        log_name=log,
        results=results,
        ANSIBLE_INVENTORY=inventory,
        RIGKIT_LOCK_FILE=str(fleet["lock"]),
        RIGKIT_CACHE_DIR=str(fleet["cache"]),
    )


def record_time(name: str, seconds: float) -> None:
    """Wall times for the closing notes: .artifacts/fleet-times.json."""
    path = ARTIFACTS / "fleet-times.json"
    ARTIFACTS.mkdir(exist_ok=True)
    times = json.loads(path.read_text()) if path.exists() else {}
    times[name] = round(seconds, 1)
    path.write_text(json.dumps(times, indent=1))


def remove_rigs() -> None:
    for host in FLEET:
        remove_rig(RIGS[host]["ansible_host"])


@pytest.fixture(scope="module")
def fleet(llama_image, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The three rigs provisioned as one fleet: two converged before on another draft length (a change to roll
    out), the third from nothing; so all three run the provision play, one at a time."""
    remove_rigs()
    cache = own_cache(tmp_path_factory, "fleet-cache")
    fleet = {"lock": cache / "rigs.lock.json", "cache": cache}
    two = make(
        "provision",
        f"host={FIRST},{BROKEN}",
        "ARGS=-e llama_server_spec_draft_n_max=2",
        fleet=fleet,
        log="fleet-provision-two",
    )
    assert two.returncode == 0, two.tail(80)
    started = time.monotonic()
    result = make("provision", f"host={','.join(FLEET)}", fleet=fleet, log="fleet-provision")
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.tail(80)
    record_time("provision 3 rigs (2 converged, 1 new)", elapsed)
    yield {**fleet, "output": result.output, "seconds": elapsed}
    remove_rigs()


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
    again = make("provision", f"host={','.join(FLEET)}", fleet=fleet, log="fleet-provision-noop", results=True)
    assert again.returncode == 0, again.tail(60)
    for host in FLEET:
        assert f"{host}: as its last converge left it" in again.output, again.tail(60)
        assert again.tasks(host, "llama_server : Write the unit") == [], host
        assert recap(again.output)[host]["changed"] == 0, host
    in_rig(LAST, "sh", "-c", f"echo '# edited by hand' >> {UNIT}")
    one = make("provision", f"host={','.join(FLEET)}", fleet=fleet, log="fleet-provision-one-differs", results=True)
    assert one.returncode == 0, one.tail(80)
    assert one.statuses(LAST, "llama_server : Write the unit") == ["changed"]
    for host in (FIRST, BROKEN):
        assert one.tasks(host, "llama_server : Write the unit") == [], host
        assert recap(one.output)[host]["changed"] == 0, host
    assert "# edited by hand" not in in_rig(LAST, "cat", UNIT).stdout
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
    assert rigs[LAST]["models"] == rigs[BROKEN]["models"]


def test_status_shows_all_three(fleet):
    compact = make("status", f"host={','.join(FLEET)}", fleet=fleet, log="fleet-status")
    assert compact.returncode == 0, compact.output
    rows = {
        line.split()[0]: line.split()
        for line in compact.output.splitlines()
        if line.split()[:1] and line.split()[0] in FLEET
    }
    assert sorted(rows) == sorted(FLEET)
    for host, cells in rows.items():  # rig, serving, uptime, model, url, accept, tok/s
        assert cells[1] == "serving" and cells[4].startswith("http") and float(cells[6]) > 0, (host, cells)
    table = make("status", f"host={','.join(FLEET)}", "wide=1", fleet=fleet, log="fleet-status-wide")
    assert table.returncode == 0, table.output
    rows = {
        line.split()[0]: line for line in table.output.splitlines() if line.split()[:1] and line.split()[0] in FLEET
    }
    assert sorted(rows) == sorted(FLEET)
    for line in rows.values():
        assert " yes " in line and LLAMACPP_BUILD_INFO in line and "(verified)" in line and "active" in line, line
    as_json = make("status", f"host={','.join(FLEET)}", "json=1", fleet=fleet, log="fleet-status-json")
    data = json.loads(as_json.output[as_json.output.index("{") :])
    assert all(data[host]["reachable"] for host in FLEET)
    assert data[LAST]["deployed"]["server"]["ctx_per_slot"] == 512
    for host in FLEET:  # read back from the running container, equal to what the inventory says
        running, expected = data[host]["deployed"]["container"]["settings"], data[host]["expected"]
        assert {key: str(running.get(key)) for key in ("ctx_size", "parallel")} == {
            key: str(expected[key]) for key in ("ctx_size", "parallel")
        }, host
        if expected["spec_type"] != "none":
            assert str(running["draft_n_max"]) == str(expected["draft_n_max"]), host
    assert " !" not in table.output and " !" not in compact.output, table.output


def test_broken_rig_stops_the_rollout_and_the_others_keep_serving(fleet):
    third_unit = in_rig(LAST, "cat", UNIT).stdout
    mtp_unit = in_rig(BROKEN, "cat", UNIT).stdout
    result = make("provision", f"host={','.join(FLEET)}", inventory=BROKEN_INVENTORY, fleet=fleet, log="fleet-broken")
    assert result.returncode != 0
    assert "llama_server_ctx_size" in result.output
    counts = recap(result.output)
    assert counts[FIRST]["failed"] == 0 and counts[FIRST]["changed"] == 0
    assert counts[BROKEN]["failed"] == 1
    # The controller's cache holds the tiny gemma4 pair (the fleet's first provision fetched it): the validation
    # play refuses the broken rig from the cached header, and with it the whole run, before any rig is touched.
    assert "controller preflight on the cached GGUF headers" in result.output
    assert PROVISION_PLAY not in result.output, "the run stops before any rig is provisioned"
    # the broken rig's server was never touched; the rig after it kept its old draft length
    assert in_rig(BROKEN, "cat", UNIT).stdout == mtp_unit
    assert in_rig(LAST, "cat", UNIT).stdout == third_unit
    assert "--spec-draft-n-max 2" in re.sub(r'[\s\\"]+', " ", third_unit)
    for host in FLEET:
        assert health(host) == '{"status":"ok"}', host


def test_rebuild_reproduces_the_lock_entry(fleet):
    before = json.loads(fleet["lock"].read_text())["rigs"][LAST]
    started = time.monotonic()
    result = make("rebuild", f"host={LAST}", fleet=fleet, log="fleet-rebuild", results=True)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.tail(80)
    assert result.statuses(LAST, "models : Remove the models directory") == ["changed"]
    assert result.statuses(LAST, "llamacpp_image : Remove the image from the rig") == ["changed"]
    assert f"{LAST} reproduced its lock entry" in result.output
    after = json.loads(fleet["lock"].read_text())["rigs"][LAST]
    assert {k: v for k, v in after.items() if k != "image"} == {k: v for k, v in before.items() if k != "image"}
    assert after["image"]["tag"] == before["image"]["tag"]
    assert health(LAST) == '{"status":"ok"}'
    record_time(f"rebuild {LAST}", elapsed)


def test_check_finds_no_drift_then_the_hand_edit(fleet):
    started = time.monotonic()
    clean = make("check", f"host={LAST}", fleet=fleet, log="fleet-check-clean")
    record_time(f"check {LAST} (no drift)", time.monotonic() - started)
    assert clean.returncode == 0, clean.tail(60)
    assert f"{LAST}: no drift" in clean.output
    in_rig(LAST, "sh", "-c", f"echo '# edited by hand' >> {UNIT}")
    drifted = make("check", f"host={LAST}", fleet=fleet, log="fleet-check-drift")
    assert drifted.returncode == 2, drifted.tail(60)
    summary = drifted.output[drifted.output.index("rigkit drift summary:") :]
    assert f"{LAST}: DRIFT" in summary and "Write the unit" in summary
    assert "# edited by hand" in drifted.output  # the diff shows what differs


def test_remove_leaves_nothing_of_the_rig_and_a_provision_brings_it_back(fleet):
    """make remove on a sandbox rig: its server, image and models first (what a GPU rig gets), then its container
    and Docker volume; a second remove finds nothing to do; the next provision converges it from scratch."""
    container = RIGS[LAST]["ansible_host"]
    removed = make("remove", f"host={LAST}", fleet=fleet, log="fleet-remove", results=True)
    assert removed.returncode == 0, removed.tail(60)
    assert removed.statuses(LAST, "models : Remove the models directory") == ["changed"]
    assert removed.statuses(LAST, "llamacpp_image : Remove the image from the rig") == ["changed"]
    inspect = ["docker", "inspect", container]
    assert subprocess.run(inspect, capture_output=True, check=False).returncode != 0, "the rig container is still there"
    volume = ["docker", "volume", "inspect", f"{container}-docker"]
    assert subprocess.run(volume, capture_output=True, check=False).returncode != 0, "its Docker volume is still there"
    again = make("remove", f"host={LAST}", fleet=fleet, log="fleet-remove-again")
    assert again.returncode == 0, again.tail(40)
    started = time.monotonic()
    back = make("provision", f"host={LAST}", fleet=fleet, log="fleet-after-remove")
    assert back.returncode == 0, back.tail(80)
    assert health(LAST) == '{"status":"ok"}'
    record_time(f"provision {LAST} after make remove", time.monotonic() - started)
