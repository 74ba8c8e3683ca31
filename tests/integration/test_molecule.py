"""Every role's Molecule scenarios: converge, idempotence (0 changed), testinfra verify, in rig containers."""

from __future__ import annotations

import pytest

from tests.support import BACKGROUND, REPO, run

SCENARIOS = sorted((path.parents[2].name, path.parent.name) for path in REPO.glob("roles/*/molecule/*/molecule.yml"))


@pytest.mark.parametrize(("role", "scenario"), SCENARIOS, ids=[f"{role}-{name}" for role, name in SCENARIOS])
def test_molecule_scenario(harness, role, scenario):
    started = BACKGROUND.pop(f"molecule-{role}-{scenario}", None)  # the long ones run beside the other tests
    if started is not None:
        result = started.wait(timeout=3600)
    else:
        result = run(
            ["molecule", "test", "--scenario-name", scenario],
            cwd=REPO / "roles" / role,
            log_name=f"molecule-{role}-{scenario}",
            timeout=3600,
        )
    assert result.returncode == 0, f"molecule test -s {scenario} failed for {role}:\n{result.tail(120)}"
    assert "idempotence] Executed: Successful" in result.output or "idempotence: Executed: Successful" in result.output
    assert "Verifier completed successfully" in result.output
