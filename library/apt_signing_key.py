#!/usr/bin/python
"""Ansible module: install an apt repository's signing key only when its fingerprint is the pinned one."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: apt_signing_key
short_description: Install a repository signing key, refused unless its fingerprint is pinned
description:
  - Downloads O(url) (TLS verified) and parses it into OpenPGP packets (armored or binary). It must hold
    exactly one public key (one primary key with its user IDs, subkeys and signatures) and nothing else; a
    second armor block, a second primary key or trailing bytes are refused, since apt trusts every key a
    keyring holds. The key's fingerprint must be listed in O(fingerprints).
  - Only the packets that were checked are written to O(dest), re-encoded and ASCII-armored (a fresh CRC-24),
    never the downloaded file. Anything else (a rotated or substituted key, an HTML error page, a file with a
    second key) fails, naming what was found, and leaves O(dest) as it was.
  - O(dest) is then the repository's C(signed_by) (C(ansible.builtin.deb822_repository)).
options:
  url:
    description: Where the vendor publishes the key.
    type: str
    required: true
  fingerprints:
    description: Accepted primary-key fingerprints (hex; spaces and case do not matter).
    type: list
    elements: str
    required: true
  fingerprints_variable:
    description:
      - The inventory variable O(fingerprints) comes from, named in the refusal so the operator knows what to
        check and where to pin a rotated key.
    type: str
  dest:
    description: Key file to write (its directory is created, mode 0755, when missing).
    type: path
    required: true
  mode:
    description: Mode of O(dest).
    type: str
    default: "0644"
  timeout:
    description: Seconds for the download.
    type: int
    default: 30
supports_check_mode: true
author: rigkit
"""

EXAMPLES = r"""
- name: Docker's key, pinned
  apt_signing_key:
    url: https://download.docker.com/linux/debian/gpg
    fingerprints: [9DC858229FC7DD38854AE2D88D81803C0EBFCD88]
    fingerprints_variable: docker_apt_signing_key_fingerprints
    dest: /etc/apt/keyrings/docker.asc
"""

RETURN = r"""
fingerprints:
  description: The primary-key fingerprint found in the downloaded key (one; a file with more is refused).
  returned: always
  type: list
  elements: str
"""

import os

from ansible.module_utils.atomic_file import write_bytes_atomic
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.openpgp_key import MAX_KEY_FILE, KeyFileError, normalise_fingerprint, read_public_key
from ansible.module_utils.urls import fetch_url


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "fingerprints": {"type": "list", "elements": "str", "required": True},
            "fingerprints_variable": {"type": "str"},
            "dest": {"type": "path", "required": True},
            "mode": {"type": "str", "default": "0644"},
            "timeout": {"type": "int", "default": 30},
        },
        supports_check_mode=True,
    )
    url, dest = module.params["url"], module.params["dest"]
    pinned = {normalise_fingerprint(fp) for fp in module.params["fingerprints"]}
    variable = module.params["fingerprints_variable"]
    source = f"{variable} ({', '.join(sorted(pinned))})" if variable else f"({', '.join(sorted(pinned))})"
    if not pinned or any(len(fp) not in (40, 64) or not all(c in "0123456789ABCDEF" for c in fp) for fp in pinned):
        module.fail_json(
            msg=f"fingerprints {source} must be full 40- or 64-digit hex fingerprints, not key ids"
            + (f": set {variable} to the vendor's full fingerprint" if variable else "")
        )
    resp, info = fetch_url(module, url, timeout=module.params["timeout"])
    if resp is None or info.get("status") != 200:
        module.fail_json(msg=f"cannot download the signing key {url}: HTTP {info.get('status')} {info.get('msg')}")
    data = resp.read(MAX_KEY_FILE + 1)
    try:
        key = read_public_key(data)
    except KeyFileError as exc:
        module.fail_json(
            msg=f"refusing the signing key from {url}: {exc}. Nothing was installed; check the URL, and ask the "
            "vendor if the file there really changed"
        )
    found = [key.fingerprint]
    if key.fingerprint not in pinned:
        module.fail_json(
            msg=(
                f"refusing the signing key from {url}: its fingerprint {key.fingerprint} is not a pinned one "
                f"{source}. If the vendor really rotated its key, check the new fingerprint against its "
                f"documentation and pin it in {variable or 'the role defaults'}."
            ),
            fingerprints=found,
        )
    try:
        with open(dest, "rb") as handle:
            current = handle.read()
    except FileNotFoundError:
        current = None
    checked = key.armored()  # only the packets checked above, never the downloaded bytes
    changed = current != checked
    if changed and not module.check_mode:
        os.makedirs(os.path.dirname(dest) or ".", mode=0o755, exist_ok=True)
        write_bytes_atomic(dest, checked, int(module.params["mode"], 8))
    module.exit_json(changed=changed, fingerprints=found, dest=dest)


if __name__ == "__main__":
    main()
