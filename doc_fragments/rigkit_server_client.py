"""The options every module that talks to llama-server shares (ansible.cfg: doc_fragment_plugins)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  api_key:
    description: API key, when the server requires one (sent as a bearer token; never logged or returned).
    type: str
  ca_file:
    description:
      - Certificate (PEM file on the rig) an C(https://) server is verified against, for example the rig's own
        self-signed one; the host name in the URL must be among its names. Verification is never skipped.
    type: path
"""
