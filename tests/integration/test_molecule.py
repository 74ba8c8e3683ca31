"""Every role's Molecule scenarios: converge, idempotence (0 changed), testinfra verify, in rig containers.
Scenarios that are heavy proofs (rigkit/proofs.py: the DKMS builds) run by their make target, not here;
tests/unit/test_proof_receipts.py checks their receipts."""

from __future__ import annotations

import pytest

from tests.support import REPO, molecule_scenarios, run

SCENARIOS = molecule_scenarios()


@pytest.mark.parametrize(("role", "scenario"), SCENARIOS, ids=[f"{role}-{name}" for role, name in SCENARIOS])
def test_molecule_scenario(harness, role, scenario):
    result = run(
        ["molecule", "test", "--scenario-name", scenario],
        cwd=REPO / "roles" / role,
        log_name=f"molecule-{role}-{scenario}",
        timeout=3600,
    )
    assert result.returncode == 0, f"molecule test -s {scenario} failed for {role}:\n{result.tail(120)}"
    assert "idempotence] Executed: Successful" in result.output or "idempotence: Executed: Successful" in result.output
    assert "Verifier completed successfully" in result.output
