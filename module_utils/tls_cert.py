"""The llama-server's TLS certificate on a rig: which names it must carry, whether the one on disk still fits,
and how to make a self-signed one with the openssl CLI (stdlib only: it runs on rigs, where the
``cryptography`` package is not installed, but ``openssl`` is).

Used by library/llama_server_tls.py (on the rig) and by the kit's tests.
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Iterable, Sequence

from ansible.module_utils.net_address import is_loopback, is_wildcard

# Always in a kit-made certificate: the role's own probe and the rig's tools reach the server on loopback.
LOOPBACK_NAMES = ("127.0.0.1", "::1", "localhost")


class TlsCertError(Exception):
    """openssl failed, or a given certificate and key do not belong together."""


def san_entry(name: str) -> str:
    """``IP:<canonical address>`` for an address, ``DNS:<name>`` (lower case) for anything else."""
    text = name.strip().strip("[]")
    try:
        return f"IP:{ipaddress.ip_address(text).compressed}"
    except ValueError:
        return f"DNS:{text.lower()}"


def wanted_sans(names: Iterable[str]) -> list[str]:
    """The subjectAltName entries a rig's certificate carries: the loopback names plus every given address or name
    (the rig's inventory name, its ansible_host, a specific bind address, llama_server_tls_san), deduplicated and
    sorted so that the same inventory always asks for the same set. Wildcard binds name no host and are left out."""
    entries = {san_entry(name) for name in (*LOOPBACK_NAMES, *names) if name.strip() and not is_wildcard(name)}
    return sorted(entries)


def parse_sans(openssl_text: str) -> list[str]:
    """The entries of ``openssl x509 -noout -ext subjectAltName`` output, normalised as `san_entry` writes them
    (OpenSSL prints IPv6 addresses uncompressed: ``IP Address:0:0:0:0:0:0:0:1``)."""
    entries: set[str] = set()
    for line in openssl_text.splitlines():
        for item in line.split(","):
            kind, _, value = item.strip().partition(":")
            if (kind == "DNS" and value) or (kind == "IP Address" and value):
                entries.add(san_entry(value))
    return sorted(entries)


def common_name(sans: Sequence[str]) -> str:
    """The subject CN: the first non-loopback name, else localhost (clients check the SANs, not the CN)."""
    for entry in sans:
        value = entry.split(":", 1)[1]
        if not is_loopback(value):
            return value[:64]
    return "localhost"


def self_signed_argv(openssl: str, key_path: str, cert_path: str, sans: Sequence[str], days: int) -> list[str]:
    """argv of one ``openssl req`` that writes a new P-256 key and a self-signed server certificate for `sans`."""
    return [
        openssl,
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-sha256",
        "-days",
        str(days),
        "-keyout",
        key_path,
        "-out",
        cert_path,
        "-subj",
        f"/O=rigkit/CN={common_name(sans)}",
        "-addext",
        "subjectAltName=" + ",".join(sans),
        "-addext",
        "basicConstraints=critical,CA:FALSE",
        "-addext",
        "keyUsage=critical,digitalSignature",
        "-addext",
        "extendedKeyUsage=serverAuth",
    ]


def run_openssl(argv: Sequence[str], stdin: bytes | None = None) -> str:
    proc = subprocess.run(list(argv), input=stdin, capture_output=True, check=False)
    if proc.returncode != 0:
        what = " ".join(argv[1:3])
        raise TlsCertError(f"openssl {what} failed: {proc.stderr.decode(errors='replace').strip()[-500:]}")
    return proc.stdout.decode(errors="replace")


def certificate_sans(openssl: str, cert_path: str) -> list[str]:
    return parse_sans(run_openssl([openssl, "x509", "-noout", "-ext", "subjectAltName", "-in", cert_path]))


def expires_within(openssl: str, cert_path: str, seconds: int) -> bool:
    """Whether the certificate expires within `seconds` (``openssl x509 -checkend`` exits 1 then)."""
    proc = subprocess.run(
        [openssl, "x509", "-noout", "-checkend", str(seconds), "-in", cert_path], capture_output=True, check=False
    )
    return proc.returncode != 0


def public_key(openssl: str, *, cert_path: str | None = None, key_pem: bytes | None = None) -> str:
    """The PEM public key of a certificate file or of a private key given on stdin (never on argv)."""
    if cert_path is not None:
        return run_openssl([openssl, "x509", "-noout", "-pubkey", "-in", cert_path]).strip()
    return run_openssl([openssl, "pkey", "-pubout"], stdin=key_pem).strip()


def not_after(openssl: str, cert_path: str) -> str:
    return run_openssl([openssl, "x509", "-noout", "-enddate", "-in", cert_path]).strip().partition("=")[2]


def fingerprint(openssl: str, cert_path: str) -> str:
    """SHA-256 fingerprint, colon-separated hex as browsers and ``openssl s_client`` show it."""
    return (
        run_openssl([openssl, "x509", "-noout", "-fingerprint", "-sha256", "-in", cert_path]).strip().partition("=")[2]
    )
