"""Jinja filters for the drafter bench (logic in rigkit/bench/report.py)."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from rigkit.bench.report import ReportError, schedule


def _bench_schedule(draft_lengths: list[int], passes: int) -> list[dict[str, Any]]:
    try:
        return schedule([int(length) for length in draft_lengths], int(passes))
    except ReportError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"bench_schedule": _bench_schedule}
