"""Every role input that carries a secret is declared no_log, so Ansible never prints it in a result."""

from __future__ import annotations

import yaml

from rigkit.validation.rules import SECRET_NAME_RE
from tests.support import REPO


def test_every_secret_input_of_every_role_is_no_log():
    secret, missing = [], []
    for spec in sorted(REPO.glob("roles/*/meta/argument_specs.yml")):
        for entry, point in (yaml.safe_load(spec.read_text())["argument_specs"] or {}).items():
            for name, option in (point.get("options") or {}).items():
                if SECRET_NAME_RE.search(name) and option.get("type", "str") == "str":
                    secret.append(name)
                    if option.get("no_log") is not True:
                        missing.append(f"{spec.relative_to(REPO)} {entry}: {name}")
    assert {"models_hf_token", "models_mirror_secret", "llama_server_api_key"} <= set(secret)
    assert not missing, "secret inputs without no_log: true:\n" + "\n".join(missing)


# Secrets not named like one: a URL that is itself a capability (whoever holds it posts to the channel).
CAPABILITIES = {"roles/fleet_monitor/meta/argument_specs.yml": "fleet_monitor_webhook_url"}


def test_capability_urls_are_no_log_too():
    for path, name in CAPABILITIES.items():
        points = yaml.safe_load((REPO / path).read_text())["argument_specs"].values()
        declared = [point["options"][name] for point in points if name in (point.get("options") or {})]
        assert declared and all(option.get("no_log") is True for option in declared), f"{path}: {name}"


def _secret_names() -> set[str]:
    names = set(CAPABILITIES.values())
    for spec in REPO.glob("roles/*/meta/argument_specs.yml"):
        for point in (yaml.safe_load(spec.read_text())["argument_specs"] or {}).values():
            names |= {name for name, option in (point.get("options") or {}).items() if option.get("no_log") is True}
    return names


class _TaskLoader(yaml.SafeLoader):
    """YAML as task files carry it, Ansible's own tags (!unsafe, !vault) read as their text."""


_TaskLoader.add_multi_constructor("!", lambda loader, _tag, node: loader.construct_scalar(node))


def _tasks(node: object) -> list[dict]:
    """Every task of a task list, blocks opened."""
    found: list[dict] = []
    for task in node if isinstance(node, list) else []:
        if isinstance(task, dict):
            found.append(task)
            for key in ("block", "rescue", "always"):
                found += _tasks(task.get(key))
    return found


def test_no_fact_or_loop_carries_a_secret_unless_its_task_is_no_log():
    """What -v prints of a task is its result: a set_fact's facts, each loop item. A task that puts a secret input
    into a fact, iterates over one, or reads one from hostvars must be no_log (the plans name rigs instead)."""
    import re

    secrets = "|".join(sorted(_secret_names()))
    assert {"llama_server_api_key", "node_exporter_password", "fleet_gateway_api_key"} <= set(secrets.split("|"))
    mention = re.compile(rf"\b({secrets})\b")
    from_hostvars = re.compile(rf"hostvars\[[^\]]+\]\s*(\[\s*['\"]|\.)\s*({secrets})\b")
    # whether a secret is set (its length, compared) is no secret: api_key_set, the summary's "keyed"
    only_length = re.compile(rf"\b({secrets})\b(\s*\|\s*default\([^)]*\))?\s*\|\s*length\b")
    offenders = []
    for path in sorted([*REPO.glob("roles/*/tasks/*.yml"), *REPO.glob("playbooks/*.yml")]):
        for task in _tasks(yaml.load(path.read_text(), Loader=_TaskLoader)):  # noqa: S506 - a SafeLoader subclass
            if task.get("no_log") not in (None, False):
                continue
            text = yaml.safe_dump(task)
            shown = {
                "set_fact": yaml.safe_dump(task.get("ansible.builtin.set_fact") or task.get("set_fact") or ""),
                "loop": yaml.safe_dump([task[key] for key in task if key == "loop" or str(key).startswith("with_")]),
            }
            found = [what for what, value in shown.items() if mention.search(only_length.sub("", value))]
            found += ["hostvars"] if from_hostvars.search(text) else []
            offenders += [f"{path.relative_to(REPO)}: {task.get('name')!r} ({what})" for what in found]
    assert not offenders, "secrets in task results (-v) without no_log:\n" + "\n".join(offenders)
