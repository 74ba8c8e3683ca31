"""What a converged rig looks like, as one digest: the fast path of a no-op converge (library/rig_converged.py).

Standard library only (it runs on rigs). After a converge that ran every role, the kit records on the rig the
digest of its inputs (computed on the controller: the kit's code and the rig's variables) and the digest of the
rig's state read here. The next run reads the state again: when both digests are the ones recorded, every role
would find what it wants, so the run skips them for this rig. The state is read broadly, so that a change the
roles would undo is never missed:

- every file, directory and symlink under the watched roots (the kit's and the roles' configuration: apt
  sources, keys and settings, systemd units and their enablement links, daemon.json, the server's env file,
  the models...): path, type, mode, owner, and the content's sha256 (a file over SMALL_FILE: size, mtime and
  inode, as the model fetcher's verification record does); runtime records under the roots are left out;
- every installed package with its version and selection (a hold, an upgrade: any apt change anywhere);
- the state of the units the kit keeps running (active and enabled);
- the Docker images the engine holds (tag and ID);
- what the server's container runs: whether it runs, its image ID, and whether the configuration it started
  from is the one whose canary passed (module_utils/llama_server/config.py), so a record is never written, and never
  matches, for a server that still runs an older setting than its unit file;
- the running kernel and the kernel modules DKMS built;
- whether the nftables tables the kit loaded are still loaded (the allow-list lives in the kernel, not on disk:
  `nft -f` of a ruleset that begins with `flush ruleset` removes it and leaves every file as it was).
"""

from __future__ import annotations

import fnmatch
import hashlib
import http.client
import json
import os
import re
import socket
import stat
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ansible.module_utils.llama_server.config import problem, serving
from ansible.module_utils.rig_command import run

SMALL_FILE = 1 << 20  # bytes: hashed in full below this size
RECORD_PATH = "/var/lib/rigkit/converged.json"
# Where the Docker engine listens (the state's images are read from its API).
DOCKER_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")
# What the record keeps of the server: its address and unit, where its canary keeps its figures, and what it runs
# (instance, speculative decoding type, canary length) for the report line.
SERVER_KEYS = ("url", "ca_file", "unit", "container", "proven", "record", "instance", "spec_type", "canary_tokens")
# 3: the state covers what the server's container runs (the record names the container and its .proven file).
RECORD_VERSION = 3


def _output(argv: Sequence[str]) -> str:
    """A read-only command's output; a missing command or a failure reads as its own marker, not an error."""
    code, out, err = run(argv)
    return out if code == 0 else f"<{argv[0]} exit {code}>\n{out or err}"


def _excluded(path: str, exclude: Sequence[str]) -> bool:
    return any(fnmatch.fnmatch(path, pattern) for pattern in exclude)


def _file_line(path: str, st: os.stat_result) -> str:
    kind = stat.S_IFMT(st.st_mode)
    head = f"{path} {oct(stat.S_IMODE(st.st_mode))} {st.st_uid}:{st.st_gid}"
    if kind == stat.S_IFLNK:
        return f"{head} link {os.readlink(path)}"
    if kind == stat.S_IFDIR:
        return f"{head} dir"
    if kind != stat.S_IFREG:
        return f"{head} special {kind}"
    if st.st_size > SMALL_FILE:
        return f"{head} file {st.st_size} {st.st_mtime_ns} {st.st_ino}"
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return f"{head} file {digest.hexdigest()}"


def files(roots: Iterable[str], exclude: Sequence[str] = ()) -> list[str]:
    """One line per file, directory and symlink under each root (the root included), sorted; a missing root is a
    line of its own (its appearance is a change too)."""
    lines: list[str] = []
    for root in sorted(set(roots)):
        try:
            lines.append(_file_line(root, os.lstat(root)))
        except FileNotFoundError:
            lines.append(f"{root} absent")
            continue
        if not os.path.isdir(root) or os.path.islink(root):
            continue
        for directory, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(name for name in dirnames if not _excluded(os.path.join(directory, name), exclude))
            for name in sorted(dirnames + filenames):
                path = os.path.join(directory, name)
                if _excluded(path, exclude):
                    continue
                try:
                    lines.append(_file_line(path, os.lstat(path)))
                except FileNotFoundError:  # removed while walking: the next read tells
                    lines.append(f"{path} vanished")
    return lines


def packages() -> str:
    """Every package dpkg knows, with its version and its selection and status (h: held)."""
    return _output(["dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Abbrev}\n"])


def units(names: Iterable[str]) -> list[str]:
    names = sorted(set(names))
    if not names:
        return []
    shown = _output(["systemctl", "show", "--property", "Id,ActiveState,SubState,UnitFileState", "--", *names])
    return unit_lines(shown)


def unit_lines(shown: str) -> list[str]:
    """``systemctl show``'s blocks (one per unit, blank-line separated) as lines; a timer's SubState is left out:
    it reads "running" while its service runs (every few seconds for the GPU collector), which is no change."""
    lines: list[str] = []
    for block in shown.split("\n\n"):
        rows = [row for row in block.splitlines() if row]
        timer = any(row.startswith("Id=") and row.endswith(".timer") for row in rows)
        lines += [row for row in rows if not (timer and row.startswith("SubState="))]
    return lines


class _EngineConnection(http.client.HTTPConnection):
    """HTTP over the Docker engine's unix socket (what the docker CLI speaks, without starting it)."""

    def __init__(self, socket_path: str, timeout: float = 30) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


def _engine_get(api_path: str, sockets: Sequence[str] = DOCKER_SOCKETS) -> tuple[Any, str | None]:
    """(the JSON the engine answered, None) or (None, why not: no engine, a status, unreadable)."""
    path = next((candidate for candidate in sockets if os.path.exists(candidate)), None)
    if path is None:
        return None, "<no docker engine>"
    connection = _EngineConnection(path)
    try:
        connection.request("GET", api_path)
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            return None, f"<docker engine answered {response.status}>"
        return json.loads(body), None
    except (OSError, ValueError, http.client.HTTPException) as exc:
        return None, f"<docker engine unreadable: {exc.__class__.__name__}>"
    finally:
        connection.close()


def images(sockets: Sequence[str] = DOCKER_SOCKETS) -> str:
    """Every image the engine holds, one "repository:tag id" line each (untagged: <none>:<none>), sorted; read
    from the engine's API (GET /images/json) on its socket."""
    listed, failure = _engine_get("/images/json", sockets)
    if failure:
        return failure
    lines = [f"{tag} {image.get('Id')}" for image in listed for tag in image.get("RepoTags") or ["<none>:<none>"]]
    return "\n".join(sorted(lines))


CONTAINER_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def server_container(name: str, proven_path: str, sockets: Sequence[str] = DOCKER_SOCKETS) -> dict[str, Any]:
    """What the server's container runs (module_utils/llama_server/config.serving), read from the engine's API
    (GET /containers/NAME/json); not running when the engine does not know it."""
    if not CONTAINER_NAME_RE.fullmatch(name):
        raise ValueError(f"{name!r} is not a container name")
    inspected, _failure = _engine_get(f"/containers/{name}/json", sockets)
    return serving(inspected, proven_path)


def server_part(server: dict[str, Any] | None) -> str:
    """The state's line for the server's container ("" when no server is recorded)."""
    if not server or not server.get("container"):
        return ""
    running = server_container(str(server["container"]), str(server.get("proven") or ""))
    return json.dumps({"container": server["container"], **running}, sort_keys=True)


def server_problem(server: dict[str, Any] | None) -> str | None:
    """Why the server's container does not run a configuration whose canary passed (None: it does)."""
    if not server or not server.get("container"):
        return None
    return problem(server_container(str(server["container"]), str(server.get("proven") or "")))


def kernel() -> list[str]:
    release = os.uname().release
    built = []
    for base in sorted(os.listdir("/lib/modules")) if os.path.isdir("/lib/modules") else []:
        updates = os.path.join("/lib/modules", base, "updates")
        if os.path.isdir(updates):
            built.extend(files([updates]))
    return [f"running {release}", *built]


NFT_TABLE_RE = re.compile(r"(inet|ip|ip6|arp|bridge|netdev) [A-Za-z_][A-Za-z0-9_]{0,63}")


def nft_tables(names: Iterable[str]) -> list[str]:
    """ "FAMILY NAME loaded" or "FAMILY NAME not loaded" for each table (`nft list table`, read only)."""
    lines = []
    for name in sorted(set(names)):
        if not NFT_TABLE_RE.fullmatch(name):
            raise ValueError(f"{name!r} is not an nftables table (FAMILY NAME, e.g. inet rigkit_llama_main)")
        code, _out, _err = run(["nft", "list", "table", *name.split()])
        lines.append(f"{name} {'loaded' if code == 0 else 'not loaded'}")
    return lines


def read_state(
    watch: Iterable[str],
    exclude: Sequence[str],
    unit_names: Iterable[str],
    tables: Iterable[str] = (),
    server: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything the digest covers, by part (the parts are kept so a mismatch can say where it is)."""
    return {
        "files": files(watch, exclude),
        "packages": packages(),
        "units": units(unit_names),
        "images": images(),
        "server": server_part(server),
        "kernel": kernel(),
        "nftables": nft_tables(tables),
    }


def part_digests(state: dict[str, Any]) -> dict[str, str]:
    return {
        part: hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest() for part, value in state.items()
    }


def digest(parts: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def load_record(path: str = RECORD_PATH) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except (FileNotFoundError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("version") == RECORD_VERSION else None


def recorded_units(record: dict[str, Any] | None) -> list[str]:
    """The units the record's state covers ([] without a record: the check finds no record anyway)."""
    units = (record or {}).get("units")
    return [str(unit) for unit in units] if isinstance(units, list) else []


def recorded_nft_tables(record: dict[str, Any] | None) -> list[str]:
    """The nftables tables the record's state covers (the kit's allow-lists)."""
    tables = (record or {}).get("nft_tables")
    return [str(table) for table in tables] if isinstance(tables, list) else []


def recorded_server(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """Where the recorded converge's server answers (url, ca_file, unit, canary record) and what it runs
    (instance, spec_type, canary_tokens); None: no server recorded."""
    server = (record or {}).get("server")
    if not isinstance(server, dict) or not all(server.get(key) for key in ("url", "unit", "record")):
        return None
    return {key: server.get(key) for key in SERVER_KEYS}


def write_record(
    inputs: str,
    parts: dict[str, str],
    path: str = RECORD_PATH,
    units: Sequence[str] = (),
    server: dict[str, Any] | None = None,
    tables: Sequence[str] = (),
) -> None:
    """Atomically, root-only (it says nothing secret, but only the kit writes it). Of ``server`` only SERVER_KEYS
    are kept (never a key)."""
    record = {
        "version": RECORD_VERSION,
        "inputs": inputs,
        "state": digest(parts),
        "parts": parts,
        "units": list(units),
        "nft_tables": list(tables),
        "server": {key: server.get(key) for key in SERVER_KEYS} if server else None,
        "recorded_at": int(time.time()),
    }
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    scratch = f"{path}.tmp"
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(record, handle, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(scratch, path)


_HINTS = {
    "nftables": " (a table the kit loaded, the client allow-list, is not loaded: a `flush ruleset`?)",
    "server": " (its container was restarted, replaced or stopped, or runs a configuration whose canary never passed)",
}


def compare(
    record: dict[str, Any] | None, inputs: str, parts: dict[str, str], max_age: int = 0, now: float | None = None
) -> list[str]:
    """Why the rig is not as its last full converge left it ([] when it is). A record older than ``max_age``
    seconds (0: no limit) no longer counts: what depends on time alone (a certificate due for renewal) is looked
    at again by a full converge."""
    if record is None:
        return ["no converge recorded on this rig (a first converge, a rebuild, or a kit that predates the record)"]
    reasons = []
    age = (time.time() if now is None else now) - float(record.get("recorded_at") or 0)
    if max_age > 0 and age > max_age:
        reasons.append(f"the record is {age / 3600:.0f} h old, over rig_state_max_age_hours ({max_age // 3600} h)")
    if record.get("inputs") != inputs:
        reasons.append("the inputs changed (the kit's code or this rig's variables)")
    recorded = record.get("parts") or {}
    reasons.extend(
        f"its {part} changed{_HINTS.get(part, '')}" for part in sorted(parts) if recorded.get(part) != parts[part]
    )
    return reasons
