"""A GPU rig stays up (roles/rig_power): suspend and hibernate cannot start, logind ignores the lid and the sleep
keys. A laptop that suspends mid-request loses its CUDA context and drops off the fleet."""

from __future__ import annotations

import pytest
import yaml

from tests.support import REPO, not_applicable, plain, role_defaults

ROLE = REPO / "roles" / "rig_power"
VARS = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())


@pytest.fixture(scope="module")
def power(host) -> tuple[object, bool]:
    """(host, whether it must stay up): GPU rigs run the role; elsewhere it applies only where the inventory sets
    rig_power_stay_up."""
    hostvars = plain(host.ansible.get_variables())
    name = hostvars.get("inventory_hostname", host.backend.get_hostname())
    if hostvars.get("rig_kind") != "gpu" and "rig_power_stay_up" not in hostvars:
        not_applicable(f"{name} is not a GPU rig: roles/rig_power does not run there")
    return host, bool(hostvars.get("rig_power_stay_up", role_defaults("rig_power")["rig_power_stay_up"]))


def test_power_suspend_and_hibernate_cannot_start(power):
    host, stays_up = power
    states = {
        target: host.run(f"systemctl is-enabled {target}").stdout.strip()
        for target in VARS["__rig_power_sleep_targets"]
    }
    assert all((state == "masked") == stays_up for state in states.values()), states
    if stays_up:
        refused = host.run("systemctl start --no-block suspend.target")
        assert refused.rc != 0 and "masked" in refused.stderr, refused.stderr


def test_power_logind_ignores_the_lid_and_the_sleep_keys(power):
    """What logind will read at its next start: the last value of each setting across its files wins."""
    host, stays_up = power
    dropin = host.file(VARS["__rig_power_logind_dropin"])
    assert dropin.exists == stays_up
    if not stays_up:
        return
    merged = host.check_output("systemd-analyze cat-config systemd/logind.conf")
    last: dict[str, str] = {}
    for line in merged.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and not key.startswith("#"):
            last[key] = value
    assert {key: last.get(key) for key in VARS["__rig_power_logind_settings"]} == VARS["__rig_power_logind_settings"]
