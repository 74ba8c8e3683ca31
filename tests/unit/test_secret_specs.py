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
