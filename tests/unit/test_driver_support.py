"""NVIDIA driver branches' support dates (module_utils/driver_support.py) and how `make plan` and `make status`
show them (rigkit/validation/driver_support_rows.py): a warning past end of life, never a refusal."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest
from ansible.module_utils.driver_support import (
    BRANCHES,
    END_OF_LIFE,
    SUPPORTED,
    UNKNOWN,
    branch_support,
    last_day,
    supported_branches,
)

from rigkit.validation.compat import compat_findings
from rigkit.validation.driver_support_rows import plan_lines, status_notes
from tests.support import seed_values

TODAY = date(2026, 12, 7)
MATRIX = "(NVIDIA's driver support matrix, as read 2026-12)"


@pytest.mark.parametrize(
    ("branch", "text", "state"),
    [
        ("535", f"branch 535 (LTSB): end of life since 2026-06 {MATRIX}", END_OF_LIFE),
        ("550", f"branch 550: end of life {MATRIX}", END_OF_LIFE),
        ("570", f"branch 570: end of life since 2026-02 {MATRIX}", END_OF_LIFE),
        ("580", f"branch 580: supported to 2028-08 {MATRIX}", SUPPORTED),
    ],
)
def test_every_branch_of_the_table_on_todays_date(branch, text, state):
    shown = branch_support(branch, TODAY)
    assert (shown.text, shown.state, shown.warning) == (text, state, state != SUPPORTED)


def test_the_table_holds_the_branches_the_matrix_lists():
    assert sorted(BRANCHES) == ["535", "550", "570", "580"]


def test_a_branch_the_table_does_not_know_says_so_and_where_to_add_it():
    shown = branch_support("560", TODAY)
    assert shown.state == UNKNOWN and shown.warning
    assert shown.text == (
        "branch 560: not in the support table: add its row from NVIDIA's driver support matrix to BRANCHES in "
        "module_utils/driver_support.py"
    )
    assert "branch (none)" in branch_support("", TODAY).text


@pytest.mark.parametrize(
    ("branch", "day", "state"),
    [
        ("535", date(2026, 6, 30), SUPPORTED),  # a month without a day: supported to its last day
        ("535", date(2026, 7, 1), END_OF_LIFE),
        ("570", date(2026, 2, 28), SUPPORTED),
        ("570", date(2026, 3, 1), END_OF_LIFE),
        ("580", date(2028, 8, 31), SUPPORTED),
        ("580", date(2028, 9, 1), END_OF_LIFE),  # the date decides, whatever the status said
        ("550", date(2020, 1, 1), END_OF_LIFE),  # no date: the matrix's status
    ],
)
def test_the_end_date_is_the_last_day_of_support(branch, day, state):
    assert branch_support(branch, day).state == state


def test_a_month_ends_on_its_last_day_and_a_day_is_kept():
    assert last_day("2028-02") == date(2028, 2, 29)
    assert last_day("2026-06") == date(2026, 6, 30)
    assert last_day("2026-06-15") == date(2026, 6, 15)


def test_without_a_date_it_is_todays():
    assert branch_support("580") == branch_support("580", date.today())


def test_the_exit_is_the_newest_supported_branch():
    assert supported_branches(TODAY) == ["580"]
    assert supported_branches(date(2026, 1, 1)) == ["580", "570", "535"]
    assert supported_branches(date(2028, 9, 1)) == []


@pytest.mark.parametrize("host", ["desktop3050", "laptop1650ti"])
def test_the_seed_rigs_branch_535_is_warned_and_not_refused(host):
    values = seed_values(host)
    lines = plan_lines(host, values, TODAY)
    assert lines == [
        f"  support   branch 535 (LTSB): end of life since 2026-06 {MATRIX} -> warning: past NVIDIA's end of "
        "life; the pin stays accepted",
        "            Debian's packaged driver: Debian ships security rebuilds of branch 535 while NVIDIA publishes "
        "them, but no fix comes for the next kernel API change: a new kernel may get no NVIDIA module",
        "            exit: NVIDIA's repository with a supported branch: nvidia_driver_source: nvidia, "
        f'nvidia_driver_branch: "580" and a 580 nvidia_driver_version in inventory/host_vars/{host}.yml '
        "(docs/driver-support.md)",
    ]
    assert compat_findings(values) == []


def test_a_supported_branch_is_shown_ok_with_its_end_date():
    values = {**seed_values("desktop3050"), "nvidia_driver_branch": "580", "nvidia_driver_version": "580.95.05"}
    assert plan_lines("desktop3050", values, TODAY) == [f"  support   branch 580: supported to 2028-08 {MATRIX} -> ok"]


def test_a_rig_on_nvidias_repository_is_sent_to_a_supported_branch_only():
    values = {**seed_values("desktop3050"), "nvidia_driver_source": "nvidia", "nvidia_driver_branch": "570"}
    meaning, exit_ = plan_lines("desktop3050", values, TODAY)[1:]
    assert "Debian" not in meaning and "no fix comes for the next kernel API change" in meaning
    assert exit_.endswith(
        'exit: NVIDIA\'s repository with a supported branch: nvidia_driver_branch: "580" and a 580 '
        "nvidia_driver_version in inventory/host_vars/desktop3050.yml (docs/driver-support.md)"
    )


def test_with_no_supported_branch_left_the_exit_says_to_extend_the_table():
    lines = plan_lines("desktop3050", seed_values("desktop3050"), date(2028, 9, 1))
    assert "exit: no branch in module_utils/driver_support.py is supported today" in lines[-1]


def test_an_unknown_branch_is_a_one_line_warning():
    values = {**seed_values("desktop3050"), "nvidia_driver_branch": "560"}
    (line,) = plan_lines("desktop3050", values, TODAY)
    assert line.startswith("  support   branch 560: not in the support table") and "-> warning:" in line


def test_a_cpu_rig_has_no_support_row():
    assert plan_lines("sandbox", {"rig_kind": "sandbox"}, TODAY) == []


def test_status_notes_show_every_gpu_rigs_branch_and_warn_past_end_of_life():
    values = {
        "old": seed_values("desktop3050"),
        "new": {**seed_values("laptop1650ti"), "nvidia_driver_branch": "580"},
        "cpu": {"rig_kind": "sandbox"},
    }

    def values_of(host: str) -> dict:
        if host not in values:
            raise LookupError(host)
        return values[host]

    assert status_notes(["old", "cpu", "gone", "new"], TODAY, values_of) == [
        f"new: driver branch 580: supported to 2028-08 {MATRIX}",
        f"old: driver branch 535 (LTSB): end of life since 2026-06 {MATRIX} -> warning, the pin stays accepted "
        "(`make plan host=old`, docs/driver-support.md)",
    ]


def test_status_notes_read_the_seed_rigs_from_the_inventory():
    notes = status_notes(["desktop3050", "laptop1650ti", "sandbox"], TODAY)
    assert [note.split(":", 1)[0] for note in notes] == ["desktop3050", "laptop1650ti"]
    assert all("end of life since 2026-06" in note and "-> warning" in note for note in notes), notes


def test_make_status_prints_the_support_notes_beside_the_archives(monkeypatch, capsys):
    """rigkit status's hook: the play and the archive are stand-ins; the notes come from the inventory."""
    import argparse
    import json
    import subprocess

    from rigkit.cli import fleet, plan

    def play(argv: list[str], **_: object) -> subprocess.CompletedProcess:
        output = next(arg.split("=", 1)[1] for arg in argv if arg.startswith("rig_status_output="))
        Path(output).write_text(json.dumps({"desktop3050": {"reachable": True}}))
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(fleet.subprocess, "run", play)
    monkeypatch.setattr(plan, "archive_notes", lambda hosts: ["desktop3050: the archive's note"])
    args = argparse.Namespace(limit="desktop3050", ansible_args=[], json=False)
    assert fleet.status(args) == 0
    printed = capsys.readouterr().out.splitlines()
    support = [line for line in printed if line.startswith("desktop3050: driver branch 535 (LTSB): end of life")]
    assert support and printed.index(support[0]) == printed.index("desktop3050: the archive's note") + 1, printed
