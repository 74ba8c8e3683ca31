"""Jinja filters for the llama_server role (logic in module_utils/nft_allowlist.py)."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

import rigkit  # noqa: F401  (first: it makes module_utils/ importable as ansible.module_utils)

# isort: split
from ansible.module_utils.nft_allowlist import AllowListError, normalise_networks, render_ruleset


def _nft_allowlist(networks: Any, instance: str, port: Any) -> str:
    """The allow-list ruleset (nft -f) of one server instance; bad entries fail naming the variable."""
    try:
        return render_ruleset(str(instance), int(port), normalise_networks(networks))
    except (AllowListError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"llama_server_nft_allowlist": _nft_allowlist}
