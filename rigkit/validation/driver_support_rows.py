"""A GPU rig's driver branch against NVIDIA's support dates (module_utils/driver_support.py), as `make plan` and
`make status` show it: the branch, its support end and the source; past end of life a warning with what it means
and the exit. Never a refusal: the pin stays accepted."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import date
from typing import Any

from ansible.module_utils.driver_support import TABLE_FILE, UNKNOWN, branch_support, supported_branches

DOC = "docs/driver-support.md"
# The plan's continuation rows sit under the text of its labelled rows.
_INDENT = " " * 12
Values = Mapping[str, Any]


def _meaning(values: Values) -> str:
    """What an ended branch means for this rig: no fix for the next kernel API change, whoever packages it."""
    branch = values.get("nvidia_driver_branch")
    if values.get("nvidia_driver_source") == "distro":
        return (
            f"Debian's packaged driver: Debian ships security rebuilds of branch {branch} while NVIDIA publishes "
            "them, but no fix comes for the next kernel API change: a new kernel may get no NVIDIA module"
        )
    return (
        f"NVIDIA publishes no more builds of branch {branch}: no fix comes for the next kernel API change, and a "
        "new kernel may get no NVIDIA module"
    )


def _exit(host: str, values: Values, today: date | None) -> str:
    """Where to go: NVIDIA's repository with the newest branch the table still supports."""
    branches = supported_branches(today)
    if not branches:
        return f"exit: no branch in {TABLE_FILE} is supported today: add NVIDIA's current ones from its matrix"
    pins = f'nvidia_driver_branch: "{branches[0]}" and a {branches[0]} nvidia_driver_version'
    if values.get("nvidia_driver_source") != "nvidia":
        pins = f"nvidia_driver_source: nvidia, {pins}"
    return f"exit: NVIDIA's repository with a supported branch: {pins} in inventory/host_vars/{host}.yml ({DOC})"


def plan_lines(host: str, values: Values, today: date | None = None) -> list[str]:
    """`make plan`'s `support` rows for a GPU rig (none for a CPU rig). ``values``: the rig's variables over the
    roles' defaults (rigkit.cli.plan.plan_values); ``today`` defaults to today's date."""
    if values.get("rig_kind") != "gpu":
        return []
    shown = branch_support(values.get("nvidia_driver_branch"), today)
    if not shown.warning:
        return [f"  support   {shown.text} -> ok"]
    if shown.state == UNKNOWN:
        return [f"  support   {shown.text} -> warning: its end of support is unknown; the pin stays accepted"]
    return [
        f"  support   {shown.text} -> warning: past NVIDIA's end of life; the pin stays accepted",
        f"{_INDENT}{_meaning(values)}",
        f"{_INDENT}{_exit(host, values, today)}",
    ]


def status_note(host: str, values: Values, today: date | None = None) -> str | None:
    """`make status`'s note on a GPU rig's branch (None for a CPU rig)."""
    if values.get("rig_kind") != "gpu":
        return None
    shown = branch_support(values.get("nvidia_driver_branch"), today)
    if not shown.warning:
        return f"{host}: driver {shown.text}"
    return f"{host}: driver {shown.text} -> warning, the pin stays accepted (`make plan host={host}`, {DOC})"


def status_notes(
    hosts: Iterable[str], today: date | None = None, values_of: Callable[[str], Values] | None = None
) -> list[str]:
    """`make status`'s notes: every GPU rig among ``hosts`` with its branch's support, from the inventory
    (``values_of``: rigkit.cli.plan.plan_values unless given; hosts it does not know are skipped)."""
    if values_of is None:
        from rigkit.cli.plan import plan_values as values_of
    notes: list[str] = []
    for host in sorted(hosts):
        try:
            values = values_of(host)
        except LookupError:
            continue
        if note := status_note(host, values, today):
            notes.append(note)
    return notes
