"""Binds and the addresses that reach them (stdlib only): what counts as loopback and as a wildcard bind, where the
rig itself reaches a service, and its URL. The one definition the controller's validation, the roles (llama_server,
node_exporter, fleet_gateway: through the rigkit_probe_address, rigkit_host_port and rigkit_url filters), the
certificate's names and the rig tests share."""

from __future__ import annotations

import ipaddress

from ansible.module_utils.parsing.convert_bool import boolean

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


def probe_address(bind: object) -> str:
    """Where the rig itself reaches a service bound to ``bind``: loopback for a wildcard bind, else the bind (an
    IPv6 address without brackets)."""
    host = str(bind or "").strip()
    return "127.0.0.1" if is_wildcard(host) or not host else host.removeprefix("[").removesuffix("]")


def host_port(host: object, port: object) -> str:
    """``host:port``, an IPv6 address in brackets."""
    text = str(host).strip().removeprefix("[").removesuffix("]")
    return f"[{text}]:{port}" if ":" in text else f"{text}:{port}"


def service_url(host: object, port: object, tls: object, path: str = "") -> str:
    """The http(s) URL of a service at ``host`` and ``port`` (``tls``: a boolean or Ansible's spellings of one)."""
    secure = boolean(tls, strict=False)
    return f"{'https' if secure else 'http'}://{host_port(host, port)}{path}"
