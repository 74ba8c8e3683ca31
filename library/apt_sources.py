#!/usr/bin/python
"""Ansible module: add an apt repository's missing components beside the rig's own sources, never against them."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: apt_sources
short_description: Add to the rig's apt sources only what they lack, signed as they already are
description:
  - Reads every entry apt reads (sources.list, sources.list.d/*.list and *.sources; one-line and deb822), leaving
    out the kit's own files.
  - For each repository, per URI and suite, writes to C(sources.list.d/NAME.sources) only the components no
    enabled C(deb) entry of the rig already lists, signed by the keyring those entries already name (else
    C(signed_by)). apt refuses two keyrings for one URI and suite, and warns on a component listed twice.
  - When the rig's own entries already have everything, the file is removed. Entries that already name two
    keyrings for one source are refused with what to fix, and nothing is written.
options:
  repositories:
    description:
      - Repositories, each with C(name), C(uris), C(suites), C(components) (empty for a flat one), C(signed_by).
    type: list
    elements: dict
    required: true
  apt_dir:
    description: apt's configuration directory.
    type: path
    default: /etc/apt
supports_check_mode: true
author: rigkit
"""

EXAMPLES = r"""
- name: Debian's non-free components, beside whatever the installer or apt modernize-sources wrote
  apt_sources:
    repositories:
      - name: debian-nonfree
        uris: [http://deb.debian.org/debian]
        suites: [trixie, trixie-updates]
        components: [contrib, non-free, non-free-firmware]
        signed_by: /usr/share/keyrings/debian-archive-keyring.pgp
"""

RETURN = r"""
files:
  description: Per repository, its file and the content written there ("" when the rig's own sources have it all).
  returned: always
  type: list
  elements: dict
"""

import os

from ansible.module_utils.apt_sources import SourcesError, plan, read_sources, render
from ansible.module_utils.atomic_file import write_atomic
from ansible.module_utils.basic import AnsibleModule


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "repositories": {"type": "list", "elements": "dict", "required": True},
            "apt_dir": {"type": "path", "default": "/etc/apt"},
        },
        supports_check_mode=True,
    )
    apt_dir, repositories = module.params["apt_dir"], module.params["repositories"]
    paths = [os.path.join(apt_dir, "sources.list.d", f"{repo['name']}.sources") for repo in repositories]
    entries = read_sources(apt_dir, managed=paths)
    files, diffs = [], []
    try:
        for repo, path in zip(repositories, paths, strict=True):
            stanzas = plan(
                [str(u) for u in repo["uris"]],
                [str(s) for s in repo["suites"]],
                [str(c) for c in repo.get("components") or []],
                str(repo["signed_by"]),
                entries,
            )
            files.append({"path": path, "content": render(str(repo["name"]), stanzas)})
    except SourcesError as exc:
        module.fail_json(msg=str(exc))
    changed = False
    for item in files:
        try:
            with open(item["path"], encoding="utf-8") as handle:
                current = handle.read()
        except FileNotFoundError:
            current = ""
        if current == item["content"]:
            continue
        changed = True
        diffs.append(
            {"before_header": item["path"], "before": current, "after_header": item["path"], "after": item["content"]}
        )
        if module.check_mode:
            continue
        if item["content"]:
            write_atomic(item["path"], lambda handle, text=item["content"]: handle.write(text))
        else:
            os.unlink(item["path"])
    module.exit_json(changed=changed, files=files, diff=diffs)


if __name__ == "__main__":
    main()
