"""llama-server's client allow-list as an nftables ruleset the kit owns (standard library only).

The role writes the ruleset to a file and a small systemd unit loads it (``nft -f``) and deletes the table on
stop. The table is the kit's own (``inet rigkit_llama_<instance>``): loading it replaces only that table, never
another owner's rules. Its one chain sees new TCP connections to the server's port: loopback and the listed
networks are accepted (by this table; another table may still drop them), anything else is answered with a TCP
reset.

    networks = normalise_networks(["192.168.1.0/24", "fd00::/8"])   # refuses "192.168.1.5/24", "10.0.0.0/33"
    text = render_ruleset("main", 8080, networks)
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["AllowListError", "Networks", "normalise_networks", "render_ruleset", "table_name"]

_INSTANCE_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,47}\Z")


class AllowListError(ValueError):
    """An allow-list entry or setting the kit cannot turn into a ruleset."""


@dataclass(frozen=True)
class Networks:
    ipv4: tuple[str, ...]
    ipv6: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.ipv4 or self.ipv6)


def normalise_networks(entries: Iterable[object], variable: str = "llama_server_allowed_networks") -> Networks:
    """Each entry an address or a network in CIDR form (host bits clear); duplicates dropped, order kept."""
    if isinstance(entries, (str, bytes)) or entries is None:
        raise AllowListError(f"{variable} must be a list of networks such as [192.168.1.0/24], not {entries!r}")
    v4: list[str] = []
    v6: list[str] = []
    for entry in entries:
        if not isinstance(entry, str) or not entry.strip():
            raise AllowListError(f"{variable}: {entry!r} is not a network; expected CIDR such as 192.168.1.0/24")
        text = entry.strip()
        try:
            network = ipaddress.ip_network(text, strict=True)
        except ValueError as exc:
            try:
                loose = ipaddress.ip_network(text, strict=False)
            except ValueError:
                raise AllowListError(
                    f"{variable}: {text!r} is not a network ({exc}); expected CIDR such as 192.168.1.0/24 or fd00::/8"
                ) from None
            raise AllowListError(
                f"{variable}: {text!r} has host bits set; did you mean {loose.with_prefixlen}?"
            ) from None
        if network.prefixlen == 0:
            raise AllowListError(
                f"{variable}: {text!r} allows every address; leave {variable} empty (no allow-list) instead"
            )
        bucket = v4 if network.version == 4 else v6
        if network.with_prefixlen not in bucket:
            bucket.append(network.with_prefixlen)
    return Networks(tuple(v4), tuple(v6))


def table_name(instance: str) -> str:
    """The kit's nftables table for one server instance (nft names take no '-')."""
    if not _INSTANCE_RE.fullmatch(instance):
        raise AllowListError(f"llama_server_instance {instance!r} is not a valid instance name")
    return "rigkit_llama_" + instance.replace("-", "_")


def _set(name: str, kind: str, elements: tuple[str, ...]) -> list[str]:
    lines = [f"\tset {name} {{", f"\t\ttype {kind}", "\t\tflags interval"]
    if elements:
        lines.append(f"\t\telements = {{ {', '.join(elements)} }}")
    return [*lines, "\t}"]


def render_ruleset(instance: str, port: int, networks: Networks) -> str:
    """The whole file ``nft -f`` loads: (re)creates the kit's table atomically, touching nothing else."""
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise AllowListError(f"llama_server_port {port!r} is not a port 1-65535")
    table = table_name(instance)
    shown = ", ".join(networks.ipv4 + networks.ipv6) or "none"
    lines = [
        f"# rigkit: llama-server {instance!r} accepts TCP port {port} only from loopback and: {shown}.",
        "# Written by the llama_server role (llama_server_allowed_networks); loaded by its firewall unit.",
        f"table inet {table}",
        f"delete table inet {table}",
        f"table inet {table} {{",
        *_set("allowed_ipv4", "ipv4_addr", networks.ipv4),
        *_set("allowed_ipv6", "ipv6_addr", networks.ipv6),
        "\tchain input {",
        "\t\ttype filter hook input priority filter - 5; policy accept;",
        f'\t\ttcp dport {port} iifname "lo" accept',
        f"\t\ttcp dport {port} ip saddr @allowed_ipv4 accept",
        f"\t\ttcp dport {port} ip6 saddr @allowed_ipv6 accept",
        f"\t\ttcp dport {port} counter reject with tcp reset",
        "\t}",
        "}",
    ]
    return "\n".join(lines) + "\n"
