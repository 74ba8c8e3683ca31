#!/usr/bin/python
"""Ansible module: put one model-catalog GGUF on disk, verified (module_utils/fetch/model.py does the work)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gguf_fetch
short_description: Download one pinned GGUF from Hugging Face (or a mirror), verified, resumable and atomic
description:
  - Downloads C({base_url}/{repo}/resolve/{revision}/{filename}) to O(dest), streaming into C(dest.part) while
    hashing, resuming an interrupted part with an HTTP Range request and retrying transient failures with
    exponential backoff.
  - Before installing, checks the size, the sha256 and the GGUF header (magic, version and
    C(general.architecture)); only then fsyncs and atomically renames the file onto O(dest). A failed check
    deletes the partial file and leaves any previous O(dest) untouched.
  - Refuses entries without a pinned commit, sha256 and size (pin them with C(make pin host=RIG) or
    C(make pin model=NAME)).
  - Re-runs are cheap - a verification record in C(<dest dir>/.rigkit-verified/) lets O(verify=fast) accept an
    unchanged file (same size, mtime, inode and device) without reading it.
  - Runs on the managed host with the Python standard library only.
version_added: "1.0.0"
author: rigkit
options:
  entry:
    description:
      - A C(model_catalog) entry (C(repo), C(revision), C(filename), C(sha256), C(size), C(architecture), C(role));
        other keys are ignored. The catalog's own rules apply (module_utils/model_catalog.py).
      - Mutually exclusive with the individual fields.
    type: dict
  name:
    description: The catalog entry's name, used in messages.
    type: str
  repo:
    description: Hugging Face repository (C(owner/name)).
    type: str
  revision:
    description: Full 40-character commit of O(repo).
    type: str
  filename:
    description: Path of the file inside the repository.
    type: str
  sha256:
    description: Expected sha256 (the file's Git LFS oid).
    type: str
  size:
    description: Expected size in bytes.
    type: int
  architecture:
    description: Expected C(general.architecture) of the GGUF; not checked when omitted.
    type: str
  role:
    description: C(target) or C(drafter).
    type: str
    choices: [target, drafter]
  dest:
    description: Absolute path of the file to create. Its directory must exist.
    type: path
    required: true
  base_url:
    description: Hugging Face endpoint or a mirror speaking the same C(/resolve/) layout.
    type: str
    default: https://huggingface.co
  token:
    description:
      - Hugging Face access token, sent as a bearer token (gated and private repositories). Never returned or
        logged. Dropped when a redirect leaves the base URL's host.
      - Falls back to the E(HF_TOKEN) environment variable of the managed host.
      - Never sent to the controller's mirror (O(mirror_secret) set), whether given or from the environment.
    type: str
  mirror_secret:
    description:
      - The per-run secret of the controller's model mirror (C(bin/rigkit mirror --secret-file)); the URLs become
        C({base_url}/{mirror_secret}/{repo}/resolve/...). Never returned or logged.
      - Marks O(base_url) as the controller's mirror, so no token (neither O(token) nor E(HF_TOKEN)) goes there.
    type: str
  allow_insecure_http:
    description: Accept a plain C(http://) base URL or redirect. Only for a trusted LAN mirror.
    type: bool
    default: false
  ca_file:
    description: PEM file of the CA(s) to trust for HTTPS instead of the system store (a LAN mirror's own CA).
    type: path
  verify:
    description:
      - V(fast) accepts an existing O(dest) whose stat matches its verification record; V(full) always re-hashes
        it. A file that fails verification is downloaded again and replaced atomically.
    type: str
    choices: [fast, full]
    default: fast
  timeout:
    description: Seconds a download may stall (no bytes received) before the attempt is retried.
    type: float
    default: 60
  connect_timeout:
    description: Seconds allowed to connect (TCP and TLS).
    type: float
    default: 15
  min_rate:
    description:
      - Minimum average rate in bytes per second over every O(rate_window) seconds (retries and stalls
        included); slower, the download stops with how far it got and keeps the part. C(0) turns it off.
    type: float
    default: 65536
  rate_window:
    description: Seconds over which O(min_rate) is measured.
    type: float
    default: 600
  deadline:
    description: Seconds for the whole download, retries included; C(0) for none.
    type: float
    default: 0
  retries:
    description: Consecutive failed attempts without progress tolerated before giving up.
    type: int
    default: 5
  backoff:
    description: First retry delay in seconds; doubles per consecutive failure, capped at 60.
    type: float
    default: 1
  progress:
    description:
      - Draw a one-line progress bar (bytes, percent, MB/s, ETA) while downloading on the terminal the play was
        started from - C(/dev/tty), else the terminal of the nearest ancestor process (ansible-core detaches its
        workers from the controlling terminal). Meant for the controller (C(delegate_to=localhost)) when a human
        watches; without a terminal (CI, cron) it is silently skipped. Never affects the result.
    type: bool
    default: false
extends_documentation_fragment:
  - ansible.builtin.files
notes:
  - Supports check mode - reports whether a download would happen, without network access or writes.
  - O(owner), O(group) and O(mode) apply to the final file; changing only them reports changed too.
"""

EXAMPLES = r"""
- name: Install the target model from the catalog
  gguf_fetch:
    entry: "{{ model_catalog[models_target] }}"
    name: "{{ models_target }}"
    dest: "/srv/models/{{ model_catalog[models_target].filename | basename }}"
    token: "{{ hf_token | default(omit) }}"
    owner: llama
    group: llama
    mode: "0644"

- name: From a LAN mirror with its own CA, re-hashing whatever is already there
  gguf_fetch:
    repo: unsloth/gemma-4-E4B-it-GGUF
    revision: 0123456789abcdef0123456789abcdef01234567
    filename: gemma-4-E4B-it-Q4_K_M.gguf
    sha256: "{{ pinned_sha256 }}"
    size: 5000000000
    architecture: gemma4
    dest: /srv/models/gemma-4-E4B-it-Q4_K_M.gguf
    base_url: https://mirror.lan
    ca_file: /etc/ssl/lan-ca.pem
    verify: full
"""

RETURN = r"""
path:
  description: The installed file.
  returned: always
  type: str
sha256:
  description: Its sha256 (the pinned one; verified as described by RV(verification)).
  returned: success
  type: str
size:
  description: Its size in bytes.
  returned: success
  type: int
operation:
  description: What was (in check mode, would be) done - C(none), C(download), C(resume) or C(replace).
  returned: success
  type: str
verification:
  description: >-
    How the file was verified - C(fast) (verification record), C(full) (re-hashed), C(download) (hashed while
    downloaded) or C(none) (check mode, nothing verified).
  returned: success
  type: str
reason:
  description: Why a download was needed.
  returned: success
  type: str
bytes_downloaded:
  description: Body bytes received in this run (0 when nothing changed).
  returned: success
  type: int
resumed_from:
  description: Size of the partial file the download continued from (0 for a fresh download).
  returned: success
  type: int
restarted:
  description: The server ignored a Range request, so the partial file started over.
  returned: success
  type: bool
attempts:
  description: HTTP requests made for the body.
  returned: success
  type: int
url:
  description: The URL fetched (never carries the token).
  returned: success
  type: str
events:
  description: Notable steps (retries, resumes), oldest first.
  returned: success
  type: list
  elements: str
error_kind:
  description: >-
    On failure, the class of problem - entry, insecure_url, tls, http, download, verification, disk_space or locked.
  returned: failure
  type: str
"""

import os
import re
import time

from ansible.module_utils.basic import AnsibleModule, env_fallback
from ansible.module_utils.fetch.model import (
    DEFAULT_BASE_URL,
    DEFAULT_MIN_RATE,
    DEFAULT_RATE_WINDOW_S,
    CatalogEntry,
    FetchError,
    FetchOptions,
    HttpStatusError,
    VerificationError,
    fetch_model,
)

ENTRY_FIELDS = ("repo", "revision", "filename", "sha256", "size", "architecture", "role")


def argument_spec() -> dict:
    return {
        "entry": {"type": "dict"},
        "name": {"type": "str"},
        "repo": {"type": "str"},
        "revision": {"type": "str"},
        "filename": {"type": "str"},
        "sha256": {"type": "str"},
        "size": {"type": "int"},
        "architecture": {"type": "str"},
        "role": {"type": "str", "choices": ["target", "drafter"]},
        "dest": {"type": "path", "required": True},
        "base_url": {"type": "str", "default": DEFAULT_BASE_URL},
        "token": {"type": "str", "no_log": True, "fallback": (env_fallback, ["HF_TOKEN"])},
        "mirror_secret": {"type": "str", "no_log": True},
        "allow_insecure_http": {"type": "bool", "default": False},
        "ca_file": {"type": "path"},
        "verify": {"type": "str", "choices": ["fast", "full"], "default": "fast"},
        "timeout": {"type": "float", "default": 60.0},
        "connect_timeout": {"type": "float", "default": 15.0},
        "retries": {"type": "int", "default": 5},
        "min_rate": {"type": "float", "default": float(DEFAULT_MIN_RATE)},
        "rate_window": {"type": "float", "default": DEFAULT_RATE_WINDOW_S},
        "deadline": {"type": "float", "default": 0.0},
        "backoff": {"type": "float", "default": 1.0},
        "progress": {"type": "bool", "default": False},
    }


def _controller_terminal() -> str | None:
    """The terminal of the human who started Ansible, or None.

    /dev/tty first; ansible-core 2.19 detaches its workers from the controlling terminal (setsid), so then the
    nearest ancestor process (ansible-playbook itself) whose stderr, stdout or stdin is a terminal.
    """
    candidates = ["/dev/tty"]
    pid = os.getppid()
    for _ in range(32):
        if pid <= 1:
            break
        for fd in (2, 1, 0):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(("/dev/pts/", "/dev/tty")) and target not in candidates:
                candidates.append(target)
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as stat_file:
                pid = int(stat_file.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    for path in candidates:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError:
            continue
        is_tty = os.isatty(fd)
        os.close(fd)
        if is_tty:
            return path
    return None


class TtyProgress:
    """A one-line progress bar on the controller's terminal; does nothing when there is none."""

    WIDTH = 24
    INTERVAL_S = 0.25

    def __init__(self, label: str, path: str | None = None) -> None:
        self.label = label if len(label) <= 40 else "..." + label[-37:]
        self._tty = None
        path = path or _controller_terminal()
        if path is None:
            return
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC)
            self._tty = os.fdopen(fd, "w", encoding="utf-8")
        except OSError:
            return
        self._start = time.monotonic()
        self._last = 0.0
        self._first: int | None = None

    def __call__(self, done: int, total: int) -> None:
        if self._tty is None:
            return
        now = time.monotonic()
        if self._first is None:
            self._first = done  # bytes already there when this run started (a resumed part)
        if now - self._last < self.INTERVAL_S and done < total:
            return
        self._last = now
        rate = (done - self._first) / max(now - self._start, 1e-6)
        fraction = done / total if total else 1.0
        filled = int(fraction * self.WIDTH)
        eta = (total - done) / rate if rate > 0 else 0.0
        line = (
            f"\r{self.label} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {done / 1e6:,.1f}/{total / 1e6:,.1f} MB "
            f"{fraction * 100:5.1f}% {rate / 1e6:7.1f} MB/s ETA {int(eta) // 60:d}:{int(eta) % 60:02d}\x1b[K"
        )
        try:
            self._tty.write(line)
            self._tty.flush()
        except OSError:
            self.close()

    def close(self) -> None:
        if self._tty is None:
            return
        try:
            if self._first is not None:
                self._tty.write("\n")
            self._tty.close()
        except OSError:
            pass
        self._tty = None


def entry_from_params(params: dict) -> CatalogEntry:
    data = dict(params["entry"]) if params["entry"] is not None else {field: params[field] for field in ENTRY_FIELDS}
    return CatalogEntry.from_mapping(data, params["name"])


def main() -> None:
    module = AnsibleModule(
        argument_spec=argument_spec(),
        add_file_common_args=True,
        supports_check_mode=True,
        mutually_exclusive=[("entry", field) for field in ENTRY_FIELDS],
        required_one_of=[("entry", "repo")],
    )
    params = module.params
    dest = params["dest"]
    secret = params["mirror_secret"] or None
    if secret is not None and not re.fullmatch(r"[A-Za-z0-9_-]{16,}", secret):
        module.fail_json(msg="mirror_secret must be the 16+ URL-safe characters `rigkit mirror --secret-file` wrote")
    options = FetchOptions(
        # The controller's mirror: its secret is the first path component (of requests only); it never sees a token.
        base_url=params["base_url"],
        mirror_secret=secret,
        token=None if secret else params["token"] or None,
        allow_insecure_http=params["allow_insecure_http"],
        ca_file=params["ca_file"],
        verify=params["verify"],
        connect_timeout=params["connect_timeout"],
        read_timeout=params["timeout"],
        retries=params["retries"],
        min_rate=params["min_rate"],
        rate_window=params["rate_window"],
        deadline=params["deadline"],
        backoff_initial=params["backoff"],
        check_mode=module.check_mode,
    )
    bar = None
    try:
        entry = entry_from_params(params)
        if params["progress"] and not module.check_mode:
            bar = options.progress = TtyProgress(entry.label)
        result = fetch_model(entry, dest, options)
    except FetchError as exc:
        extra: dict = {"error_kind": exc.kind, "path": dest}
        if isinstance(exc, VerificationError):
            extra.update(check=exc.what, expected=exc.expected, actual=exc.actual)
        if isinstance(exc, HttpStatusError):
            extra["status"] = exc.status
        module.fail_json(msg=str(exc), **extra)
    except OSError as exc:
        module.fail_json(
            msg=f"{dest}: {exc.strerror or exc} ({exc.__class__.__name__}); check the path and its permissions",
            path=dest,
        )
    finally:
        if bar is not None:
            bar.close()

    out = result.as_dict()
    out.pop("check_mode", None)
    changed = result.changed
    if os.path.exists(result.path):
        file_args = module.load_file_common_arguments(params, path=result.path)
        changed = module.set_fs_attributes_if_different(file_args, changed)
    out["changed"] = changed
    module.exit_json(**out)


if __name__ == "__main__":
    main()
