"""Jinja filters for the drafter bench (logic in module_utils/bench_report.py)."""

from __future__ import annotations

import pathlib
from typing import Any

import ansible.module_utils
from ansible.errors import AnsibleFilterError

_MODULE_UTILS = str(pathlib.Path(__file__).resolve().parent.parent / "module_utils")
if _MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MODULE_UTILS)

from ansible.module_utils.bench_report import ReportError, schedule  # noqa: E402


def _bench_schedule(draft_lengths: list[int], passes: int) -> list[dict[str, Any]]:
    try:
        return schedule([int(length) for length in draft_lengths], int(passes))
    except ReportError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"bench_schedule": _bench_schedule}
