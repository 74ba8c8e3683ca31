"""What a llama-server instance is called on the rig (stdlib only): its container, its unit and its TLS files. The
one rule the llama_server role, the fleet services (which read the rig's certificate) and the rig suite share."""

from __future__ import annotations

TLS_ROOT = "/etc/rigkit/tls"
UNIT_DIR = "/etc/systemd/system"


def container_name(instance: object) -> str:
    return f"rigkit-llama-{instance}"


def unit_name(instance: object) -> str:
    return f"{container_name(instance)}.service"


def unit_path(instance: object) -> str:
    return f"{UNIT_DIR}/{unit_name(instance)}"


def tls_dir(instance: object) -> str:
    return f"{TLS_ROOT}/{instance}"


def tls_cert_path(instance: object) -> str:
    return f"{tls_dir(instance)}/server.crt"


def tls_key_path(instance: object) -> str:
    return f"{tls_dir(instance)}/server.key"
