"""A fleet of three sandbox rigs gets its models through the controller: each file crosses the "internet" once.

The kit's models play (playbooks/models.yml, as provision.yml imports it) runs on rigkit-fleet1..3 with a fresh
controller cache: the sandbox's stand-in hub (the upstream) must serve every file exactly once, the controller's
mirror serves the rigs, every rig ends with verified, root-owned, read-only files, and a second run changes
nothing and downloads nothing. A bad pin then fails the play without touching the good files anywhere.
"""

from __future__ import annotations

import hashlib
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.module_utils.model_catalog import rig_model_path

from rigkit.paths import cached_model_path
from tests.support import REPO, Run, free_port, model_catalog, recap, remove_rig, role_defaults, run

CATALOG = model_catalog()

FLEET = ("fleet1", "fleet2", "fleet3")
INVENTORY = ["-i", "inventory/hosts.yml", "-i", "tests/integration/inventories/fleet/hosts.yml"]
PLAYBOOK = "tests/integration/playbooks/models_fleet.yml"
MODELS_DIR = role_defaults("models")["models_dir"]
FLEET_INVENTORY = yaml.safe_load((REPO / "tests/integration/inventories/fleet/hosts.yml").read_text())
RIG_MODELS = {
    host: sorted({spec["models_target"], spec["models_drafter"]})
    for host, spec in FLEET_INVENTORY["all"]["children"]["rigs"]["children"]["sandbox_rigs"]["children"]["fleet"][
        "hosts"
    ].items()
}
USED = sorted({name for names in RIG_MODELS.values() for name in names})


def url_path(name: str) -> str:
    entry = CATALOG[name]
    return f"/{entry['repo']}/resolve/{entry['revision']}/{entry['filename']}"


def rig_path(name: str) -> str:
    return rig_model_path(MODELS_DIR, CATALOG[name])


def remove_rigs() -> None:
    for host in FLEET:
        remove_rig(f"rigkit-{host}")


@dataclass
class Fleet:
    cache: Path
    hub_port: int
    mirror_port: int

    def provision(self, log_name: str, *extra: str, playbook: str = PLAYBOOK) -> Run:
        return run(
            [
                "ansible-playbook",
                playbook,
                *INVENTORY,
                "--limit",
                "fleet",
                "-e",
                f"rig_controller_cache_dir={self.cache}",
                "-e",
                f"models_sandbox_hub_port={self.hub_port}",
                "-e",
                f"models_mirror_port={self.mirror_port}",
                *extra,
            ],
            log_name=log_name,
            timeout=1200,
        )

    def stats(self, server: str) -> dict[str, Any]:
        """The byte counters the server wrote when it stopped (sandbox-hub: the upstream; mirror: the LAN)."""
        return json.loads((self.cache / "run" / f"{server}.stats.json").read_text())

    def served(self, server: str, name: str) -> dict[str, int]:
        return self.stats(server)["files"].get(url_path(name), {"bytes": 0, "requests": 0, "complete": 0})


@pytest.fixture(scope="module")
def fleet(harness, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    remove_rigs()  # pristine rigs and a fresh controller cache: every file has to come from upstream
    yield Fleet(cache=tmp_path_factory.mktemp("fleet-cache"), hub_port=free_port(), mirror_port=free_port())
    remove_rigs()


@pytest.fixture(scope="module")
def first_run(fleet: Fleet) -> Run:
    result = fleet.provision("models-fleet-first")
    assert result.returncode == 0, result.tail(120)
    return result


def rig_sha256(host: str, path: str) -> str:
    result = run(["docker", "exec", f"rigkit-{host}", "sha256sum", path])
    assert result.returncode == 0, result.output
    return result.output.split()[0]


def rig_stat(host: str, path: str) -> str:
    result = run(["docker", "exec", f"rigkit-{host}", "stat", "-c", "%U:%G %a %F", path])
    assert result.returncode == 0, result.output
    return result.output.strip()


def assert_servers_stopped(fleet: Fleet) -> None:
    for server, port in (("sandbox-hub", fleet.hub_port), ("mirror", fleet.mirror_port)):
        assert not (fleet.cache / "run" / f"{server}.pid").exists(), f"{server} pidfile left behind"
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0, f"{server} still answers on port {port}"


def test_upstream_serves_each_file_once(fleet: Fleet, first_run: Run) -> None:
    for name in USED:
        counters = fleet.served("sandbox-hub", name)
        assert counters["bytes"] == CATALOG[name]["size"], (name, counters)
        assert counters["requests"] == 1, (name, counters)
    assert fleet.stats("sandbox-hub")["total_bytes"] == sum(CATALOG[name]["size"] for name in USED)


def test_controller_mirror_serves_every_rig(fleet: Fleet, first_run: Run) -> None:
    for name in USED:
        rigs = sum(name in names for names in RIG_MODELS.values())
        assert fleet.served("mirror", name)["bytes"] == rigs * CATALOG[name]["size"], name


def test_controller_cache_holds_verified_files(fleet: Fleet, first_run: Run) -> None:
    for name in USED:
        entry = CATALOG[name]
        cached = Path(cached_model_path(fleet.cache, entry))
        assert hashlib.sha256(cached.read_bytes()).hexdigest() == entry["sha256"]


@pytest.mark.parametrize("host", FLEET)
def test_rig_has_verified_read_only_files(first_run: Run, host: str) -> None:
    assert rig_stat(host, MODELS_DIR) == "root:root 755 directory"
    for name in RIG_MODELS[host]:
        path = rig_path(name)
        assert rig_sha256(host, path) == CATALOG[name]["sha256"], (host, name)
        assert rig_stat(host, path) == "root:root 644 regular file", (host, path)
        assert rig_stat(host, str(Path(path).parent)) == "root:root 755 directory"
    leftovers = run(["docker", "exec", f"rigkit-{host}", "find", MODELS_DIR, "-name", "*.part"])
    assert leftovers.output.strip() == ""


def test_servers_are_stopped_after_the_play(fleet: Fleet, first_run: Run) -> None:
    assert_servers_stopped(fleet)


def test_second_run_changes_nothing_and_starts_no_server(fleet: Fleet, first_run: Run) -> None:
    """Every rig holds its models verified and the cache holds them: neither server starts, nothing is fetched
    (a server writes its stats file when it stops, so the first run's files stay as they were)."""
    stats = [fleet.cache / "run" / f"{server}.stats.json" for server in ("sandbox-hub", "mirror")]
    before = [path.stat().st_mtime_ns for path in stats]
    second = fleet.provision("models-fleet-second")
    assert second.returncode == 0, second.tail(120)
    counters = recap(second.output)
    for host in FLEET:
        assert counters[host]["changed"] == 0, second.tail(120)
        assert counters[host]["failed"] == 0
    assert [path.stat().st_mtime_ns for path in stats] == before, "a server ran although every rig had its models"
    assert_servers_stopped(fleet)


def test_a_rig_that_lost_a_model_gets_only_that_one_from_the_mirror(fleet: Fleet, first_run: Run) -> None:
    name = RIG_MODELS["fleet2"][0]
    run(["docker", "exec", "rigkit-fleet2", "rm", "-f", rig_path(name)])
    again = fleet.provision("models-fleet-one-lost")
    assert again.returncode == 0, again.tail(120)
    counters = recap(again.output)
    assert counters["fleet2"]["changed"] >= 1 and counters["fleet1"]["changed"] == counters["fleet3"]["changed"] == 0
    assert rig_sha256("fleet2", rig_path(name)) == CATALOG[name]["sha256"]
    assert fleet.stats("mirror")["total_bytes"] == CATALOG[name]["size"]  # one file, to one rig
    assert fleet.stats("sandbox-hub")["total_bytes"] == 0  # the controller's cache had it: upstream untouched
    assert_servers_stopped(fleet)


def test_check_mode_on_the_converged_fleet_changes_nothing(fleet: Fleet, first_run: Run) -> None:
    # The kit's models play alone: the rigs exist (container_harness's rig.yml has no check mode of its own).
    checked = fleet.provision("models-fleet-check", "--check", playbook="playbooks/models.yml")
    assert checked.returncode == 0, checked.tail(120)
    for host in FLEET:
        assert recap(checked.output)[host]["changed"] == 0, checked.tail(120)
    assert_servers_stopped(fleet)


def test_bad_pin_fails_and_keeps_the_good_files(fleet: Fleet, first_run: Run, tmp_path: Path) -> None:
    name = "tiny-gemma4-target"
    catalog = json.loads(json.dumps(CATALOG))
    catalog[name]["sha256"] = "0" * 64  # a wrong pin: same repo, revision, file and size
    override = tmp_path / "bad-pin.json"
    override.write_text(json.dumps({"model_catalog": catalog}))

    result = fleet.provision("models-fleet-bad-pin", "-e", f"@{override}")

    assert result.returncode != 0
    assert "sha256 mismatch" in result.output, result.tail(80)
    entry = CATALOG[name]
    cached = Path(cached_model_path(fleet.cache, entry))
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == entry["sha256"]  # the cache kept the good file
    assert not Path(f"{cached}.part").exists()
    for host, names in RIG_MODELS.items():
        for model in names:
            assert rig_sha256(host, rig_path(model)) == CATALOG[model]["sha256"], (host, model)
    assert_servers_stopped(fleet)  # stopped on failure too (block/always)
