"""What the fleet gateway (roles/fleet_gateway, HAProxy) puts in front of: one upstream per rig, and the model
aliases the fleet answers to. Computed on the controller from each rig's own settings, so a rig the gateway
cannot reach, or could reach only by sending its API key in clear, is refused before the gateway host is touched.

A rig's server is reached where its bind says: a specific address as it is, a wildcard bind (0.0.0.0, ::) at the
rig's ansible_host, a loopback bind only from a gateway that shares the rig's network (the sandbox's containers
on host networking). TLS follows the server's own rule (ansible.module_utils.net_address.serves_tls).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import rigkit  # noqa: F401  (first: it makes module_utils/ importable as ansible.module_utils)

# isort: split
from ansible.module_utils.llama_server.paths import tls_cert_path
from ansible.module_utils.model_catalog import ALIAS_RE
from ansible.module_utils.net_address import is_loopback, is_wildcard, serves_tls

from rigkit.validation.variables import API_KEY_RE, API_KEY_SHAPE


@dataclass(frozen=True)
class Upstream:
    """One rig's llama-server as the gateway reaches it."""

    rig: str
    alias: str
    address: str  # what HAProxy connects to (an IPv6 address without brackets)
    port: int
    tls: bool
    # The name the rig's certificate must carry (the kit's own certificate always lists the rig's inventory
    # name); empty: the certificate the rig presents is pinned as the only trusted one, without a name check.
    verify_name: str
    # whether the rig wants llama_server_api_key: the plan names rigs, never their keys (it is a fact, shown by -v)
    keyed: bool
    # where the rig keeps the certificate its server presents (read from the rig for verification)
    cert_path: str
    # llama-server's slots: more concurrent requests would only queue inside the rig
    max_connections: int

    @property
    def backend_name(self) -> str:
        return backend_name(self.alias)


def backend_name(alias: str) -> str:
    """The HAProxy backend of one alias (HAProxy names: letters, digits, '-', '_', '.', ':')."""
    return "model_" + alias


def alias_of(catalog: Mapping[str, Any], target: str) -> str:
    """The name clients ask for (the request's "model"): the catalog entry's alias, or its key."""
    entry = catalog.get(target) if isinstance(catalog, Mapping) else None
    alias = (entry or {}).get("alias") if isinstance(entry, Mapping) else None
    return str(alias or target).lower()


def reach_address(rig: str, bind: object, values: Mapping[str, Any]) -> str:
    """Where a service of the rig bound to ``bind`` is reached: a specific address as it is, a wildcard bind at the
    rig's ansible_host, localhost as 127.0.0.1 (an IPv6 address without brackets). The gateway's and the monitor's
    rule for the rig's server and its node exporter alike."""
    host = str(bind or "127.0.0.1").strip()
    if is_wildcard(host):
        host = str(values.get("ansible_host") or rig)
    if host.lower() == "localhost":
        return "127.0.0.1"
    return host.removeprefix("[").removesuffix("]")


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def upstream(
    rig: str,
    values: Mapping[str, Any],
    catalog: Mapping[str, Any],
    *,
    shares_network: bool,
    gateway: str,
    service: str = "the gateway",
    rigs_variable: str = "fleet_gateway_rigs",
) -> tuple[Upstream | None, list[str]]:
    """The rig's upstream, or the reasons ``service`` on host ``gateway`` cannot use it (each naming the variable
    and the file; ``rigs_variable``: the list of rigs to leave it out of)."""
    rig_file = f"inventory/host_vars/{rig}.yml"
    bind = str(values.get("llama_server_host") or "127.0.0.1")
    address = reach_address(rig, values.get("llama_server_host"), values)
    tls = serves_tls(values.get("llama_server_tls", "auto"), bind)
    api_key = str(values.get("llama_server_api_key") or "")
    problems: list[str] = []
    if is_loopback(address) and not shares_network:
        problems.append(
            f"{rig}: llama_server_host is {bind} (loopback), which {service} on {gateway} cannot reach: serve on "
            f"an address {service} reaches (llama_server_host, with llama_server_api_key from Vault) in "
            f"{rig_file}, or leave {rig} out of {rigs_variable} in inventory/host_vars/{gateway}.yml"
        )
    if not is_loopback(address) and not tls:
        problems.append(
            f"{rig}: its server speaks plain HTTP on {address} (llama_server_tls: {values.get('llama_server_tls')}), "
            f"so {service} would send its key (and any prompt) across the network in clear: set llama_server_tls to "
            f"auto in {rig_file}"
        )
    if api_key and not API_KEY_RE.match(api_key):
        problems.append(
            f"{rig}: llama_server_api_key must be {API_KEY_SHAPE} ({service} sends it in an Authorization "
            f"header): set another one in Vault for {rig_file}"
        )
    target = str(values.get("models_target") or "")
    alias = alias_of(catalog, target)
    if not ALIAS_RE.fullmatch(alias):
        problems.append(
            f"{rig}: the model alias {alias!r} (catalog entry {target!r}) must be lowercase letters, digits, '.', "
            "'_' or '-': set its alias in inventory/group_vars/all/model_catalog.yml"
        )
    try:
        port = int(values.get("llama_server_port", 8080))
        parallel = int(values.get("llama_server_parallel", 1))
    except (TypeError, ValueError):
        problems.append(f"{rig}: llama_server_port and llama_server_parallel must be numbers ({rig_file})")
        return None, problems
    if problems:
        return None, problems
    own_certificate = not str(values.get("llama_server_tls_cert") or "")
    verify_name = rig if own_certificate else ("" if _is_ip(address) else address)
    return (
        Upstream(
            rig=rig,
            alias=alias,
            address=address,
            port=port,
            tls=tls,
            verify_name=verify_name if tls else "",
            keyed=bool(api_key),
            cert_path=tls_cert_path(values.get("llama_server_instance") or "main") if tls else "",
            max_connections=max(parallel, 1),
        ),
        [],
    )


def plan(
    rigs: Mapping[str, Mapping[str, Any]],
    catalog: Mapping[str, Any],
    *,
    shares_network: bool,
    gateway: str,
    default_alias: str = "",
    service: str = "the gateway",
    rigs_variable: str = "fleet_gateway_rigs",
) -> dict[str, Any]:
    """{"upstreams": [...], "aliases": [...], "default_alias": str, "problems": [...]} for ``service`` on host
    ``gateway`` in front of ``rigs`` ({inventory name: its resolved variables}, listed by ``rigs_variable``)."""
    upstreams: list[Upstream] = []
    problems: list[str] = []
    if not rigs:
        problems.append(
            f"{rigs_variable} is empty: list the rigs {service} on {gateway} serves in "
            f"inventory/host_vars/{gateway}.yml"
        )
    for rig in sorted(rigs):
        found, refused = upstream(
            rig,
            rigs[rig],
            catalog,
            shares_network=shares_network,
            gateway=gateway,
            service=service,
            rigs_variable=rigs_variable,
        )
        problems += refused
        if found is not None:
            upstreams.append(found)
    aliases = sorted({item.alias for item in upstreams})
    default = default_alias or (aliases[0] if aliases else "")
    if default_alias and aliases and default_alias not in aliases:
        problems.append(
            f"fleet_gateway_default_model is {default_alias!r}, which no rig of fleet_gateway_rigs serves "
            f"(they serve {', '.join(aliases)}): fix it in inventory/host_vars/{gateway}.yml"
        )
    return {
        "upstreams": [{**asdict(item), "backend": item.backend_name} for item in upstreams],
        "aliases": aliases,
        "default_alias": default,
        "problems": problems,
    }


def models_list(aliases: list[str], created: int = 0) -> dict[str, Any]:
    """The gateway's answer to GET /v1/models (OpenAI's list shape)."""
    return {
        "object": "list",
        "data": [{"id": alias, "object": "model", "created": created, "owned_by": "rigkit"} for alias in aliases],
    }


# ------------------------------------------------------------------------------------------------ key files
# A rig's name in the rig key map: HAProxy splits a map line at its first blank, so the name is one token.
RIG_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,253}\Z")


class KeyFileError(ValueError):
    """A key that a key file cannot carry as one token; the message names the variable and the file, never the key."""


def _entries(text: str) -> list[list[str]]:
    """The entries HAProxy reads from a pattern or map file: each line that is not blank or a comment, its leading
    blanks trimmed, split at blanks (a map's value is the rest of the line)."""
    lines = (line.strip(" \t\r") for line in text.split("\n"))
    return [line.split() for line in lines if line and not line.startswith("#")]


def client_keys_file(key: Any, gateway: str) -> str:
    """The gateway's client key file (an HAProxy pattern file): the key alone on its line, no second field."""
    if not isinstance(key, str) or not API_KEY_RE.match(key):
        raise KeyFileError(
            f"fleet_gateway_api_key must be {API_KEY_SHAPE} (the key file holds it as one token, its value is not "
            f"shown): set it from Ansible Vault in inventory/host_vars/{gateway}.yml"
        )
    text = f"# the client API key, alone on its line (roles/fleet_gateway)\n{key}\n"
    if _entries(text) != [[key]]:  # read back as HAProxy reads it: one entry, one field
        raise KeyFileError(f"the client key file would not hold one token: fix inventory/host_vars/{gateway}.yml")
    return text


def rig_keys_file(upstreams: list[Mapping[str, Any]], keys: Mapping[str, Any]) -> str:
    """The rig key map: `RIG KEY` per keyed rig of the plan, its key from ``keys`` (rig: llama_server_api_key, read
    by a no_log task), each a single token (HAProxy takes a map line's value from its first blank to the end: a
    second field would become part of the key sent)."""
    lines = ["# rig  its llama_server_api_key (roles/fleet_gateway)"]
    for item in upstreams:
        rig = str(item.get("rig", ""))
        if not item.get("keyed"):
            continue
        key = keys.get(rig) or ""
        if not RIG_NAME_RE.match(rig) or not isinstance(key, str) or not API_KEY_RE.match(key):
            raise KeyFileError(
                f"{rig!r}: its name must be one token and llama_server_api_key {API_KEY_SHAPE} (the rig key map "
                f"holds both on one line, the key's value is not shown): fix inventory/host_vars/{rig}.yml"
            )
        lines.append(f"{rig} {key}")
    text = "\n".join(lines) + "\n"
    if any(len(entry) != 2 for entry in _entries(text)):  # read back as HAProxy reads it: name and key only
        raise KeyFileError("the rig key map would hold a line of other than two fields: fix the rigs' host_vars")
    return text


def key_file_problems(text: str, expected: str, path: str) -> list[str]:
    """Why a key file as found on the gateway host is not ``expected`` (what this run wrote), naming the file and
    counting entries, never showing a key. Asked before HAProxy reloads: what it would load is what was meant."""
    found, meant = _entries(text), _entries(expected)
    if found == meant:
        return []
    return [
        f"{path} holds {len(found)} entries where this run wrote {len(meant)}, or other ones: HAProxy is not "
        "reloaded; write it again with this role (and see who else writes it)"
    ]
