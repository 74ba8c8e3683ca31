"""Merge settings into Docker's daemon.json without clobbering keys owned by others.

Several roles write /etc/docker/daemon.json (the docker role: logging, networking; the NVIDIA
container toolkit role: runtimes). Each one merges only the keys it owns, so the file is
rewritten only when a merged value really differs from what is on disk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ansible.module_utils.atomic_file import write_atomic
from ansible.module_utils.net_address import is_loopback

# Local transports of the Docker API: reachable only by who may open the socket.
LOCAL_API_SCHEMES = ("unix://", "fd://")
CLIENT_TLS_KEYS = ("tlscacert", "tlscert", "tlskey")


class DaemonConfigError(Exception):
    """daemon.json cannot be read or written safely."""


@dataclass(frozen=True)
class MergeResult:
    before: dict[str, Any]
    after: dict[str, Any]

    @property
    def changed(self) -> bool:
        return self.before != self.after


def deep_merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """Return base with overlay merged in: nested dicts merge key by key, anything else replaces."""
    merged = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def read_config(path: str) -> dict[str, Any]:
    """Read daemon.json; a missing or empty file is an empty config, a broken one is an error."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise DaemonConfigError(f"cannot read {path}: {exc}") from exc
    if not text.strip():
        return {}
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DaemonConfigError(
            f"{path} is not valid JSON ({exc}); Docker would not start with it either. "
            "Fix or remove the file by hand, then run again."
        ) from exc
    if not isinstance(config, dict):
        raise DaemonConfigError(f"{path} must hold a JSON object, found {type(config).__name__}")
    return config


def _api_host(entry: str) -> str | None:
    """The host part of a dockerd ``hosts`` entry on TCP (tcp://HOST:PORT, HOST:PORT, :PORT); None for local ones."""
    text = entry.strip()
    if text.startswith(LOCAL_API_SCHEMES):
        return None
    address = text.removeprefix("tcp://").split("/", 1)[0]
    if address.startswith("["):
        return address[1:].split("]", 1)[0]
    return address.rsplit(":", 1)[0] if ":" in address else address


def exposure_problems(settings: Any) -> list[str]:
    """Settings that would open the Docker API (root on the rig) over TCP without client certificates: on
    loopback too, where every local user and a DNS-rebinding web page reach it."""
    if not isinstance(settings, dict):
        return []
    hosts = settings.get("hosts", [])
    hosts = [hosts] if isinstance(hosts, str) else hosts
    if not isinstance(hosts, list):
        return [f"hosts is {hosts!r}; expected a list of dockerd listen addresses such as unix:///run/docker.sock"]
    verified = settings.get("tlsverify") is True and all(settings.get(key) for key in CLIENT_TLS_KEYS)
    problems = []
    for entry in hosts:
        host = _api_host(str(entry))
        if host is None or verified:
            continue
        where = (
            f"{host} (every local user, and web pages through DNS rebinding)" if is_loopback(host) else host
        ) or "every interface"
        problems.append(
            f"hosts has {str(entry)!r}: the Docker API on {where} is root on the rig for anyone who reaches it; "
            "remove it (the kit needs only the local socket, which only root and the docker group may open), or "
            "set tlsverify: true with tlscacert, tlscert and tlskey so that only holders of a client certificate "
            "connect"
        )
    return problems


def plan_merge(path: str, settings: dict[str, Any], remove: list[str] | None = None) -> MergeResult:
    """Compute the config that merging `settings` (and dropping `remove`) into `path` gives."""
    before = read_config(path)
    after = deep_merge(before, settings)
    for key in remove or []:
        after.pop(key, None)
    return MergeResult(before=before, after=after)


def render(config: dict[str, Any]) -> str:
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def write_config(path: str, config: dict[str, Any], mode: int = 0o644) -> None:
    """Write atomically: a crash mid-write never leaves Docker a half-written daemon.json."""
    write_atomic(path, lambda handle: handle.write(render(config)), mode)


def merge_into_file(path: str, settings: dict[str, Any], remove: list[str] | None = None) -> MergeResult:
    """Merge and write when the result differs; return what was there and what is there now."""
    result = plan_merge(path, settings, remove)
    if result.changed:
        write_config(path, result.after)
    return result
