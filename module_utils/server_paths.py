"""Where a llama-server instance keeps its TLS files on the rig (stdlib only): the one rule the llama_server role
and the fleet gateway (which reads the rig's certificate to verify it) share."""

from __future__ import annotations

TLS_ROOT = "/etc/rigkit/tls"


def tls_dir(instance: object) -> str:
    return f"{TLS_ROOT}/{instance}"


def tls_cert_path(instance: object) -> str:
    return f"{tls_dir(instance)}/server.crt"


def tls_key_path(instance: object) -> str:
    return f"{tls_dir(instance)}/server.key"
