"""What the fleet's model download does in one run (roles/models_fleet): each file once, from the rigs' own needs.

Every rig of the play says what its models are (``needs``: catalog entries with their upstream) and which of them
it lacks verified (``wants``). The controller fetches a file when some rig lacks it or its own cache lacks it; the
mirror serves only the files some rig lacks, listens only on the addresses the rigs reach the controller at, and
accepts only the addresses the downloading rigs report.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

# A rig's address as its facts give it (IPv4, IPv6 with an optional zone): anything else is not passed on.
_ADDRESS_RE = re.compile(r"^[0-9A-Fa-f:.]+(%[A-Za-z0-9_.-]+)?$")


def _unique_by_name(entries: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    seen: dict[str, Mapping[str, Any]] = {}
    for entry in entries:
        seen.setdefault(str(entry["name"]), entry)
    return list(seen.values())


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _flags(flag: str, values: Sequence[str]) -> list[str]:
    return [part for value in values for part in (flag, value)]


def fleet_download_plan(
    rigs: Sequence[Mapping[str, Any]], cached: Callable[[Mapping[str, Any]], bool]
) -> dict[str, Any]:
    """``rigs``: [{"needs": [entry], "wants": [entry], "address": str, "addresses": [str]}] in play order;
    ``cached``: whether the controller's cache holds an entry's file. The first rig's entry wins a name."""
    downloads = _unique_by_name(entry for rig in rigs for entry in rig.get("wants") or [])
    served = {str(entry["name"]) for entry in downloads}
    fetches = [
        entry
        for entry in _unique_by_name(entry for rig in rigs for entry in rig.get("needs") or [])
        if entry["name"] in served or not cached(entry)
    ]
    binds = _unique(str(rig["address"]) for rig in rigs if rig.get("address"))
    clients = _unique(
        str(address)
        for rig in rigs
        if rig.get("wants")
        for address in rig.get("addresses") or []
        if _ADDRESS_RE.match(str(address))
    )
    allow = [f"{entry['repo']}/resolve/{entry['revision']}/{entry['filename']}" for entry in downloads]
    return {
        "downloads": downloads,
        "fetches": fetches,
        "binds": binds,
        "clients": clients,
        "allow": allow,
        "mirror_args": _flags("--allow", allow) + _flags("--bind", binds) + _flags("--client", clients),
    }
