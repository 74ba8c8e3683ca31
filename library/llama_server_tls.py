#!/usr/bin/python
"""Ansible module: the llama-server's TLS certificate and key on the rig (self-signed here, or given)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llama_server_tls
short_description: Keep the llama-server's TLS certificate and key on the rig
description:
  - Without I(certificate) and I(private_key), makes a self-signed P-256 certificate for I(names) with the
    rig's own C(openssl), so the private key never leaves the rig. It is made again only when a file is
    missing or unreadable, the key does not match the certificate, the certificate expires within
    I(renew_days), or its subjectAltName entries differ from I(names) (plus the loopback names).
  - With I(certificate) and I(private_key) (PEM contents, for example from Ansible Vault), writes them when
    they differ from the files, after checking that they belong together.
  - The key is written owner C(root), group I(group), mode C(0640) (readable by the container's user through
    its group only); the certificate C(0644). Both are written atomically.
  - Returns the certificate (public) so clients can verify the server against it.
options:
  cert_path:
    description: Certificate file (PEM).
    type: path
    required: true
  key_path:
    description: Private key file (PEM).
    type: path
    required: true
  names:
    description: Addresses and DNS names the certificate is for (the loopback names are always added).
    type: list
    elements: str
    default: []
  days:
    description: Validity of a self-signed certificate, in days.
    type: int
    default: 825
  renew_days:
    description: Make a new self-signed certificate when the current one expires within this many days.
    type: int
    default: 30
  certificate:
    description: A given certificate (PEM contents, a chain with the leaf first); empty to self-sign.
    type: str
    default: ""
  private_key:
    description: The given certificate's private key (PEM contents).
    type: str
    default: ""
  group:
    description: Group that may read the key (the container's gid).
    type: int
    default: 10001
supports_check_mode: true
author: rigkit
"""

EXAMPLES = r"""
- name: Keep the server's certificate
  llama_server_tls:
    cert_path: /etc/rigkit/tls/main/server.crt
    key_path: /etc/rigkit/tls/main/server.key
    names: [rig1, 192.168.1.20]
"""

RETURN = r"""
certificate:
  description: The certificate (PEM) the server presents.
  type: str
  returned: success
sans:
  description: Its subjectAltName entries (C(DNS:name), C(IP:address)).
  type: list
  elements: str
  returned: success
not_after:
  description: Its expiry, as openssl prints it.
  type: str
  returned: success
fingerprint:
  description: Its SHA-256 fingerprint.
  type: str
  returned: success
reason:
  description: Why the certificate was (or would be) written; empty when it was kept.
  type: str
  returned: success
"""

import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.tls_cert import (
    TlsCertError,
    certificate_sans,
    expires_within,
    fingerprint,
    not_after,
    public_key,
    run_openssl,
    self_signed_argv,
    wanted_sans,
)

DAY = 86400


def self_signed_reason(openssl: str, cert_path: str, key_path: str, sans: list[str], renew_days: int) -> str:
    """Why the self-signed certificate on disk must be made again; empty when it still fits."""
    if not os.path.isfile(cert_path) or not os.path.isfile(key_path):
        return "no certificate yet"
    try:
        have = certificate_sans(openssl, cert_path)
        with open(key_path, "rb") as handle:
            matches = public_key(openssl, cert_path=cert_path) == public_key(openssl, key_pem=handle.read())
    except (OSError, TlsCertError) as exc:
        return f"the files on the rig are unreadable ({exc})"
    if not matches:
        return "the key does not match the certificate"
    if have != sans:
        return f"its names changed ({', '.join(have)} -> {', '.join(sans)})"
    if expires_within(openssl, cert_path, renew_days * DAY):
        return f"it expires within {renew_days} days"
    return ""


def write_atomic(path: str, data: bytes, mode: int, gid: int) -> None:
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tls-")
    try:
        os.fchmod(fd, mode)
        os.fchown(fd, 0, gid)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "cert_path": {"type": "path", "required": True},
            "key_path": {"type": "path", "required": True},
            "names": {"type": "list", "elements": "str", "default": []},
            "days": {"type": "int", "default": 825},
            "renew_days": {"type": "int", "default": 30},
            "certificate": {"type": "str", "default": ""},
            "private_key": {"type": "str", "default": "", "no_log": True},
            "group": {"type": "int", "default": 10001},
        },
        required_together=[("certificate", "private_key")],
        supports_check_mode=True,
    )
    params = module.params
    openssl = shutil.which("openssl")
    if openssl is None:
        module.fail_json(msg="openssl is not installed on the rig: install the openssl package, then run again")
    cert_path, key_path = params["cert_path"], params["key_path"]
    if not os.path.isdir(os.path.dirname(cert_path)) or not os.path.isdir(os.path.dirname(key_path)):
        if module.check_mode:
            module.exit_json(
                changed=True, reason="no certificate yet", certificate="", sans=[], not_after="", fingerprint=""
            )
        module.fail_json(msg=f"the directory of {cert_path} / {key_path} does not exist: create it first")
    sans = wanted_sans(params["names"])
    reason = ""
    try:
        if params["certificate"]:
            cert_pem = params["certificate"].strip().encode() + b"\n"
            key_pem = params["private_key"].strip().encode() + b"\n"
            with tempfile.NamedTemporaryFile(dir=os.path.dirname(cert_path), prefix=".tls-check-") as probe:
                probe.write(cert_pem)
                probe.flush()
                if public_key(openssl, cert_path=probe.name) != public_key(openssl, key_pem=key_pem):
                    module.fail_json(
                        msg="llama_server_tls_key does not belong to llama_server_tls_cert "
                        "(their public keys differ): give the key the certificate was issued for"
                    )
            if read(cert_path) != cert_pem or read(key_path) != key_pem:
                reason = "the given certificate or key differs from the rig's"
                if not module.check_mode:
                    write_atomic(key_path, key_pem, 0o640, params["group"])
                    write_atomic(cert_path, cert_pem, 0o644, 0)
        else:
            reason = self_signed_reason(openssl, cert_path, key_path, sans, params["renew_days"])
            if reason and not module.check_mode:
                workdir = tempfile.mkdtemp(dir=os.path.dirname(key_path), prefix=".tls-new-")
                try:
                    new_key, new_cert = os.path.join(workdir, "key"), os.path.join(workdir, "cert")
                    run_openssl(self_signed_argv(openssl, new_key, new_cert, sans, params["days"]))
                    write_atomic(key_path, read(new_key), 0o640, params["group"])
                    write_atomic(cert_path, read(new_cert), 0o644, 0)
                finally:
                    shutil.rmtree(workdir, ignore_errors=True)
        if not reason:
            # Kept: make sure the modes and owners still are what the container needs and nothing more.
            for path, mode, gid in ((key_path, 0o640, params["group"]), (cert_path, 0o644, 0)):
                stat = os.stat(path)
                if (stat.st_mode & 0o7777, stat.st_uid, stat.st_gid) != (mode, 0, gid):
                    reason = reason or f"{path} had mode {oct(stat.st_mode & 0o7777)} owner {stat.st_uid}:{stat.st_gid}"
                    if not module.check_mode:
                        os.chown(path, 0, gid)
                        os.chmod(path, mode)
        exists = os.path.isfile(cert_path)
        result = {
            "changed": bool(reason),
            "reason": reason,
            "certificate": read(cert_path).decode() if exists else "",
            "sans": certificate_sans(openssl, cert_path) if exists else [],
            "not_after": not_after(openssl, cert_path) if exists else "",
            "fingerprint": fingerprint(openssl, cert_path) if exists else "",
        }
    except (OSError, TlsCertError) as exc:
        module.fail_json(msg=f"could not write the server's TLS certificate in {os.path.dirname(cert_path)}: {exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
