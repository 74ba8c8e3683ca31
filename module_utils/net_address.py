"""What counts as a loopback bind (stdlib only): the one definition the controller's validation, the
llama_server role (API key, TLS), the certificate's names and the rig tests share."""

from __future__ import annotations

import ipaddress

LOOPBACK_HOSTNAMES = ("localhost",)


def is_loopback(host: object) -> bool:
    """localhost, or any address in 127.0.0.0/8 or ::1 (brackets allowed): reachable from this machine only."""
    text = str(host or "").strip()
    if text.lower() in LOOPBACK_HOSTNAMES:
        return True
    try:
        return ipaddress.ip_address(text.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False
