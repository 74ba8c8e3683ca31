"""The role entry points that run on a rig of each kind, read from the playbooks that run them.

A role that provision.yml starts to run is checked on the controller (its argument spec) and seen by the fast
path (its variables are inputs) at once: the list is derived, never kept by hand. An entry point is a role's
task file that has an argument spec; it is found in a play whose hosts are rigs (``roles:``, or an
``include_role``/``import_role`` task), then through the task files those entry points include in turn. A role
run only ``when: rig_kind == 'gpu'`` (or on ``sandbox_rigs``) belongs to that kind only.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from rigkit import REPO

KINDS = ("gpu", "sandbox")
# What shapes or reads a rig (provision, status) and what only measures it (bench).
SHAPING_PLAYBOOKS = ("provision.yml", "status.yml")
BENCH_PLAYBOOKS = ("bench.yml",)
_ROLE_KEYS = ("ansible.builtin.include_role", "ansible.builtin.import_role", "include_role", "import_role")
_TASKS_KEYS = ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks", "include_tasks", "import_tasks")
_KIND_RE = re.compile(r"rig_kind\s*==\s*'(\w+)'")

EntryPoint = tuple[str, str]


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """Ansible's YAML: its tags (!unsafe, !vault) read as plain values."""


_Loader.add_multi_constructor("!", lambda loader, _tag, node: loader.construct_scalar(node))


def _load(path: Path) -> Any:
    return yaml.load(path.read_text(), Loader=_Loader)  # noqa: S506 - a SafeLoader that reads Ansible's tags


def _kinds(hosts: str, when: object) -> frozenset[str]:
    named = set(_KIND_RE.findall(str(when or "")))
    named |= {kind for kind in KINDS if f"{kind}_rigs" in hosts}
    return frozenset(named or KINDS)


def _references(
    tasks: Any, kinds: frozenset[str], here: Path | None = None
) -> Iterator[tuple[str, str, frozenset[str]]]:
    """(role, task file, kinds) for each include_role/import_role among ``tasks``, blocks and (``here``: a
    playbook's directory) its included task files too; a templated ``tasks_from`` names each file it may choose."""
    for task in tasks if isinstance(tasks, list) else []:
        if not isinstance(task, dict):
            continue
        scope = kinds & _kinds("", task.get("when"))
        for key in _TASKS_KEYS:
            if here is not None and isinstance(task.get(key), str) and (here / task[key]).is_file():
                yield from _references(_load(here / task[key]), scope, here)
        for key in ("block", "rescue", "always"):
            yield from _references(task.get(key), scope)
        for key in _ROLE_KEYS:
            if isinstance(task.get(key), dict):
                target = task[key]
                files = re.findall(r"([\w-]+)\.yml", str(target.get("tasks_from", "main.yml")))
                for name in files or [str(target["tasks_from"])]:
                    yield str(target["name"]), name, scope


def _task_files(root: Path, role: str, entry: str) -> Iterator[Any]:
    """The entry point's task file and the files it includes within its role."""
    tasks_dir = root / "roles" / role / "tasks"
    seen: set[str] = set()
    todo = [entry]
    while todo:
        name = todo.pop()
        path = tasks_dir / f"{name}.yml"
        if name in seen or not path.is_file():
            continue
        seen.add(name)
        tasks = _load(path)
        yield tasks
        todo += re.findall(r"(?:include|import)_tasks:\s*[\"']?([\w-]+)\.yml", path.read_text())


def _specs(root: Path, role: str) -> set[str]:
    path = root / "roles" / role / "meta" / "argument_specs.yml"
    return set((_load(path) or {}).get("argument_specs", {})) if path.is_file() else set()


def _plays(root: Path, playbook: str) -> Iterator[dict[str, Any]]:
    for play in _load(root / "playbooks" / playbook) or []:
        imported = play.get("ansible.builtin.import_playbook") or play.get("import_playbook")
        if imported:
            yield from _plays(root, str(imported))
        elif "rigs" in str(play.get("hosts", "")):
            yield play


def _from_playbooks(root: Path, playbooks: Iterable[str]) -> dict[str, list[EntryPoint]]:
    found: dict[str, list[EntryPoint]] = {kind: [] for kind in KINDS}
    todo: list[tuple[str, str, frozenset[str]]] = []
    for playbook in playbooks:
        for play in _plays(root, playbook):
            hosts = _kinds(str(play["hosts"]), None)
            here = root / "playbooks"
            for key in ("pre_tasks", "tasks"):
                todo += _references(play.get(key), hosts, here)
            todo += [(str(r["role"]), "main", hosts & _kinds("", r.get("when"))) for r in play.get("roles") or []]
            todo += _references(play.get("post_tasks"), hosts, here)
    done: set[tuple[str, str, frozenset[str]]] = set()
    while todo:
        role, entry, kinds = todo.pop(0)
        if (role, entry, kinds) in done:
            continue
        done.add((role, entry, kinds))
        if entry in _specs(root, role):
            for kind in kinds:
                if (role, entry) not in found[kind]:
                    found[kind].append((role, entry))
        for tasks in _task_files(root, role, entry):
            todo += _references(tasks, kinds)
    return found


def derive(root: Path) -> tuple[dict[str, tuple[EntryPoint, ...]], frozenset[str]]:
    """(per rig kind, every entry point provision, status and bench run on it; the roles only the bench runs,
    which read a rig and do not shape it), from the playbooks and roles under ``root``."""
    shaping, bench = _from_playbooks(root, SHAPING_PLAYBOOKS), _from_playbooks(root, BENCH_PLAYBOOKS)
    points = {kind: tuple(dict.fromkeys([*shaping[kind], *bench[kind]])) for kind in KINDS}
    shaping_roles = {role for kind in KINDS for role, _ in shaping[kind]}
    return points, frozenset({role for kind in KINDS for role, _ in bench[kind]} - shaping_roles)


@functools.cache
def _derived() -> tuple[dict[str, tuple[EntryPoint, ...]], frozenset[str]]:
    return derive(REPO)


def entry_points() -> dict[str, tuple[EntryPoint, ...]]:
    return _derived()[0]


def bench_only_roles() -> frozenset[str]:
    return _derived()[1]
