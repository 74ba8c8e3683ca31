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


WILDCARD_BINDS = ("0.0.0.0", "::", "[::]")  # noqa: S104 - names the wildcard binds, binds nothing
TLS_ON = ("true", "yes", "on")


def serves_tls(setting: object, host: object) -> bool:
    """Whether a server bound to ``host`` speaks TLS under ``llama_server_tls`` = ``setting``: when asked for, or
    (auto) whenever the bind is not loopback (an API key would otherwise cross the network in clear)."""
    text = str(setting).strip().lower()
    return text in TLS_ON or (text == "auto" and not is_loopback(host))


def is_wildcard(host: object) -> bool:
    """0.0.0.0 or :: : every address of the machine."""
    return str(host or "").strip() in WILDCARD_BINDS
