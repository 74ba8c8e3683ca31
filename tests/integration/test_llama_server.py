"""The server on both sandbox profiles: the rig suite passes and a second converge changes nothing. The faults a
rollout must survive run on a rig of their own (test_llama_server_faults.py)."""

from __future__ import annotations

from tests.support import recap, rig_suite, run

MTP_RIG = "sandbox-mtp"


def test_gemma3_self_draft_profile_passes_the_rig_suite(sandbox_provisioned):
    assert "draft acceptance" in sandbox_provisioned
    suite = rig_suite("sandbox", log_name="rig-suite-sandbox")
    assert "test_llama_server::test_journal_shows_the_drafter_loaded" in suite.passed


def test_mtp_profile_passes_the_rig_suite(mtp_provisioned):
    assert "draft-mtp" in mtp_provisioned
    suite = rig_suite(MTP_RIG, log_name=f"rig-suite-{MTP_RIG}")
    assert "test_llama_server::test_completion_drafts_and_the_journal_reports_acceptance" in suite.passed


def test_mtp_profile_second_converge_changes_nothing(mtp_provisioned):
    done = run(
        ["make", "--no-print-directory", "provision", f"host={MTP_RIG}"], log_name="provision-sandbox-mtp-second"
    )
    assert done.returncode == 0, done.output[-6000:]
    assert recap(done.output)[MTP_RIG]["changed"] == 0, done.output[-6000:]
