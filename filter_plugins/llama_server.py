"""Jinja filters for the llama_server role: the allow-list ruleset (logic in module_utils/nft_allowlist.py) and the
line a run ends with for each rig (the role's report.yml, and roles/rig_state's fast path from the record)."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

import rigkit  # noqa: F401  (first: it makes module_utils/ importable as ansible.module_utils)

# isort: split
from ansible.module_utils.net_address import is_loopback
from ansible.module_utils.nft_allowlist import AllowListError, normalise_networks, render_ruleset


def _nft_allowlist(networks: Any, instance: str, port: Any) -> str:
    """The allow-list ruleset (nft -f) of one server instance; bad entries fail naming the variable."""
    try:
        return render_ruleset(str(instance), int(port), normalise_networks(networks))
    except (AllowListError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(str(exc)) from exc


def _report_line(report: Any, rig: str, instance: str, url: str, spec_type: str, canary_tokens: Any) -> str:
    """Where the server answers and the figures of the canary it passed (``report``: llama_server_probe's result,
    or the fast path's figures of the unit's current run)."""
    figures = report if isinstance(report, dict) else {}
    drafted = int(figures.get("draft_n") or 0)
    if drafted > 0:
        drafting = (
            f"draft acceptance {float(figures.get('acceptance') or 0):.2f} "
            f"({int(figures.get('draft_n_accepted') or 0)} accepted / {drafted} drafted)"
        )
    else:
        drafting = "no drafting"
    speed = float(figures.get("predicted_per_second") or 0)
    return (
        f'llama-server "{instance}" on {rig} answers at {url} ({figures.get("build_info")}, {spec_type}): '
        f"{drafting}, {speed:.1f} tokens/s on a {canary_tokens}-token canary."
    )


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "llama_server_nft_allowlist": _nft_allowlist,
            "llama_server_report_line": _report_line,
            "rigkit_is_loopback": is_loopback,
        }
