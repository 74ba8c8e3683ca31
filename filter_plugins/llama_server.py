"""Jinja filters for the llama_server role (logic in module_utils/nft_allowlist.py)."""

from __future__ import annotations

import pathlib
from typing import Any

import ansible.module_utils
from ansible.errors import AnsibleFilterError

_MODULE_UTILS = str(pathlib.Path(__file__).resolve().parent.parent / "module_utils")
if _MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MODULE_UTILS)

from ansible.module_utils.nft_allowlist import AllowListError, normalise_networks, render_ruleset  # noqa: E402


def _nft_allowlist(networks: Any, instance: str, port: Any) -> str:
    """The allow-list ruleset (nft -f) of one server instance; bad entries fail naming the variable."""
    try:
        return render_ruleset(str(instance), int(port), normalise_networks(networks))
    except (AllowListError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"llama_server_nft_allowlist": _nft_allowlist}
