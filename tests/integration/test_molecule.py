"""Every role's Molecule scenario: converge, idempotence (0 changed), testinfra verify, in rig containers."""

from __future__ import annotations

import pytest

from tests.support import REPO, run

SCENARIOS = sorted(path.parent.parent.parent.name for path in REPO.glob("roles/*/molecule/default/molecule.yml"))


@pytest.mark.parametrize("role", SCENARIOS)
def test_molecule_scenario(harness, role):
    result = run(["molecule", "test"], cwd=REPO / "roles" / role, log_name=f"molecule-{role}")
    assert result.returncode == 0, f"molecule test failed for {role}:\n{result.tail(120)}"
    assert "idempotence] Executed: Successful" in result.output or "idempotence: Executed: Successful" in result.output
    assert "Verifier completed successfully" in result.output
