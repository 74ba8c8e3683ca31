"""How long NVIDIA supports each driver branch (standard library only), as NVIDIA's driver support matrix gives it.

A rig on a branch past its end of life is warned, never refused: the pin stays accepted, and the owner is told
what that means and where the exit is (rigkit/validation/driver_support_rows.py words it for `make plan` and
`make status`; docs/driver-support.md for people).
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import date

TABLE_FILE = "module_utils/driver_support.py"
SOURCE = "NVIDIA's driver support matrix, as read 2026-12"

SUPPORTED = "supported"
END_OF_LIFE = "end of life"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class BranchSupport:
    """One row of the matrix: the branch as NVIDIA names it, its status in the matrix's words, the last month or
    day of support ("YYYY-MM" or "YYYY-MM-DD"; None where the matrix gives no date), and where that was read."""

    name: str
    status: str
    end: str | None
    source: str = SOURCE


# The branches the kit's rigs pin (the dates decide; ``status`` only where the matrix gives no date).
BRANCHES: dict[str, BranchSupport] = {
    "535": BranchSupport("R535 (LTSB)", END_OF_LIFE, "2026-06"),
    "550": BranchSupport("R550", END_OF_LIFE, None),
    "570": BranchSupport("R570", END_OF_LIFE, "2026-02"),
    "580": BranchSupport("R580", SUPPORTED, "2028-08"),
}


@dataclass(frozen=True)
class Shown:
    """What to show for a rig's branch: ``text`` (branch, status, end date, source), ``state`` (SUPPORTED,
    END_OF_LIFE or UNKNOWN) and whether it is a warning."""

    text: str
    state: str
    warning: bool


def last_day(end: str) -> date:
    """The last day of support: a month alone ("2026-06") means its last day."""
    parts = [int(part) for part in end.split("-")]
    if len(parts) == 2:
        return date(parts[0], parts[1], calendar.monthrange(parts[0], parts[1])[1])
    return date(parts[0], parts[1], parts[2])


def state_on(row: BranchSupport, today: date) -> str:
    """SUPPORTED or END_OF_LIFE on ``today``: past the end date it is end of life, whatever the status said."""
    if row.end is None:
        return row.status
    return SUPPORTED if today <= last_day(row.end) else END_OF_LIFE


def _label(branch: str, row: BranchSupport) -> str:
    """The label "branch 535 (LTSB)": the kit's branch number, with what NVIDIA adds to its name."""
    extra = row.name.partition(" ")[2]
    return f"branch {branch} {extra}" if extra else f"branch {branch}"


def branch_support(branch: object, today: date | None = None) -> Shown:
    """The row to show for driver branch ``branch`` on ``today`` (default: today), and whether it is a warning
    (end of life, or a branch the table does not know)."""
    key = str(branch or "").strip()
    row = BRANCHES.get(key)
    if row is None:
        text = (
            f"branch {key or '(none)'}: not in the support table: add its row from NVIDIA's driver support matrix "
            f"to BRANCHES in {TABLE_FILE}"
        )
        return Shown(text, UNKNOWN, True)
    state = state_on(row, today or date.today())
    if state == SUPPORTED:
        until = f"supported to {row.end}" if row.end else "supported"
        return Shown(f"{_label(key, row)}: {until} ({row.source})", SUPPORTED, False)
    since = f"end of life since {row.end}" if row.end else "end of life"
    return Shown(f"{_label(key, row)}: {since} ({row.source})", END_OF_LIFE, True)


def supported_branches(today: date | None = None) -> list[str]:
    """The table's branches still supported on ``today``, newest first: where a rig on an ended branch can go."""
    when = today or date.today()
    found = [branch for branch, row in BRANCHES.items() if state_on(row, when) == SUPPORTED]
    return sorted(found, key=int, reverse=True)
