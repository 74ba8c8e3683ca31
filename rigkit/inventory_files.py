"""Which inventory file sets a rig's variable, and the YAML reading behind it (syntax errors as file:line:column).

Used by the controller-side validation (rigkit/validation/rules.py, rigkit/validation/preflight.py) so every problem
names the file to edit, and by ``rigkit inventory-syntax``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

import yaml


def show(value: Any) -> str:
    """A value as the person wrote it: strings quoted, the rest as JSON."""
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return repr(value)


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader that keeps Ansible's tagged values (!vault, !unsafe) as plain strings."""


def _tagged(loader: yaml.SafeLoader, _suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    return loader.construct_mapping(node)  # type: ignore[arg-type]


_Loader.add_multi_constructor("!", _tagged)


def load_yaml_file(path: str) -> Any:
    """Parse one inventory file; a syntax error says file:line:column (yaml.MarkedYAMLError's mark, 1-based)."""
    with open(path, encoding="utf-8") as handle:
        return yaml.load(handle, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


# Parsed files by identity (path, inode, size, mtime): the rigs of a fleet share their group_vars files, which the
# fleet-wide validation reads once instead of once per rig. Read only: callers never change what they get.
_PARSED: dict[tuple[str, int, int, int], Any] = {}


def _load_shared(path: str) -> Any:
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _PARSED:
        _PARSED[key] = load_yaml_file(path)
    return _PARSED[key]


def yaml_error_message(path: str, exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    detail = f"{context}, {problem}" if context else problem
    return f"{where}: YAML syntax error: {detail}. Fix that line (indentation, quotes, a missing ':')."


def inventory_yaml_errors(paths: Iterable[str]) -> list[str]:
    """file:line:column of every YAML syntax error in these inventory files and directories."""
    errors: list[str] = []
    for top in paths:
        files = [top] if os.path.isfile(top) else []
        if os.path.isdir(top):
            for root, dirs, names in os.walk(top):
                dirs.sort()
                files += [os.path.join(root, n) for n in sorted(names) if n.endswith((".yml", ".yaml"))]
        for path in files:
            try:
                load_yaml_file(path)
            except yaml.YAMLError as exc:
                errors.append(yaml_error_message(display_path(path), exc))
    return errors


def display_path(path: str) -> str:
    """A path relative to the working directory when it lies below it, else absolute."""
    absolute = os.path.abspath(path)
    relative = os.path.relpath(absolute)
    return absolute if relative.startswith("..") else relative


def _candidate_files(inventory_dir: str, kind: str, name: str) -> list[str]:
    base = os.path.join(inventory_dir, kind)
    files = [os.path.join(base, name + ext) for ext in ("", ".yml", ".yaml")]
    folder = os.path.join(base, name)
    if os.path.isdir(folder):
        files += [os.path.join(folder, n) for n in sorted(os.listdir(folder)) if n.endswith((".yml", ".yaml"))]
    return [path for path in files if os.path.isfile(path)]


def _inline_hosts(node: Any, host: str) -> dict[str, Any] | None:
    """The variables written under ``host`` in a YAML inventory tree (all: children: ... hosts: host: {...})."""
    if not isinstance(node, dict):
        return None
    hosts = node.get("hosts")
    if isinstance(hosts, dict) and isinstance(hosts.get(host), dict):
        return hosts[host]
    for child in (node.get("children") or {}).values() if isinstance(node.get("children"), dict) else ():
        found = _inline_hosts(child, host)
        if found is not None:
            return found
    return None


def _inline_host_vars(inventory_dir: str, host: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for name in sorted(os.listdir(inventory_dir)) if os.path.isdir(inventory_dir) else []:
        path = os.path.join(inventory_dir, name)
        if not (name.endswith((".yml", ".yaml")) and os.path.isfile(path)):
            continue
        try:
            data = _load_shared(path)
        except (OSError, yaml.YAMLError):
            continue
        variables = _inline_hosts(data.get("all") if isinstance(data, dict) else None, host)
        if variables:
            found.append((display_path(path), variables))
    return found


class Sources:
    """Which inventory file sets a variable for one host: host_vars first, then its groups', then group all."""

    def __init__(self, inventory: str | Iterable[str], host: str, groups: Iterable[str]) -> None:
        # Every inventory source (a file: its directory), the last one first: later sources override earlier ones.
        sources = [inventory] if isinstance(inventory, str) else list(inventory)
        dirs = list(dict.fromkeys(s if os.path.isdir(s) else os.path.dirname(s) for s in reversed(sources)))
        ordered = [("host_vars", host)] + [("group_vars", g) for g in groups if g != "all"] + [("group_vars", "all")]
        self._files: list[tuple[str, dict[str, Any]]] = []
        for kind, name in ordered:
            for inventory_dir in dirs:
                for path in _candidate_files(inventory_dir, kind, name):
                    try:
                        data = _load_shared(path)
                    except (OSError, yaml.YAMLError):
                        continue
                    if isinstance(data, dict):
                        self._files.append((display_path(path), data))
                if kind == "host_vars":  # variables written inline under the host in an inventory file
                    self._files += _inline_host_vars(inventory_dir, host)

    def file_of(self, variable: str, value: Any = None) -> str:
        """The file that sets ``variable``; with its ``value``, --extra-vars when that overrides the file's."""
        for path, data in self._files:
            if variable in data:
                raw = data[variable]
                templated = isinstance(raw, str) and "{{" in raw
                if value is None or templated or str(raw) == str(value) or show(raw) == show(value):
                    return path
                return f"--extra-vars (overriding {path})"
        return "--extra-vars or a role default"

    def raw(self, variable: str) -> Any:
        for _path, data in self._files:
            if variable in data:
                return data[variable]
        return None
