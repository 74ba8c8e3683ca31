"""Values rendered into llama-server's env file and unit are checked first: a newline in
the API key (or the instance name, the host, an argument) must not add a variable or a unit setting."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.support import render_server_files

KEY = "k" * 24 + "-_.~+/=!"

HOSTS: dict[str, dict[str, Any]] = {
    "good": {"llama_server_api_key": KEY, "llama_server_host": "192.0.2.7"},
    "key_newline": {"llama_server_api_key": KEY + "\nLLAMA_ARG_HOST=0.0.0.0", "llama_server_host": "192.0.2.7"},
    "key_space": {"llama_server_api_key": "two words", "llama_server_host": "192.0.2.7"},
    # what `openssl rand -hex 32 | ansible-vault encrypt_string --stdin-name` stores: the key and its newline
    "key_trailing_newline": {"llama_server_api_key": KEY + "\n", "llama_server_host": "192.0.2.7"},
    "instance_trailing_newline": {"llama_server_instance": "main\n"},
    "host_trailing_newline": {"llama_server_host": "127.0.0.1\n"},
    "instance_newline": {"llama_server_instance": "main\nExecStartPre=/bin/touch /tmp/pwned"},
    "instance_path": {"llama_server_instance": "../../etc/x"},
    "host_newline": {"llama_server_host": "127.0.0.1\nLLAMA_API_KEY=known"},
    "arg_newline": {"llama_server_extra_args": ["--tags", "x\nExecStartPost=/bin/true"]},
    "dir_newline": {"llama_server_models_dir": "/var/lib/rigkit/models\nUser=root"},
    "port_text": {"llama_server_port": "8080\nX=1"},
    "port_privileged": {"llama_server_port": 80},
    "plain_lan": {"llama_server_api_key": KEY, "llama_server_host": "192.0.2.7", "llama_server_tls": False},
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    return render_server_files(tmp_path_factory.mktemp("render"), HOSTS)


def failures(result: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = {}
    for task in result["plays"][0]["tasks"]:
        for host, outcome in task["hosts"].items():
            if outcome.get("failed"):
                found.setdefault(host, outcome.get("msg", ""))
    return found


def test_good_values_render(rendered: tuple[Path, dict[str, Any]]) -> None:
    out, result = rendered
    assert "good" not in failures(result)
    env_lines = (out / "good.env").read_text().splitlines()
    digest = env_lines[[line.startswith("RIGKIT_SERVER_CONFIG=") for line in env_lines].index(True)]
    assert re.fullmatch(r"RIGKIT_SERVER_CONFIG=[0-9a-f]{64}", digest), digest  # what the container started from
    assert KEY not in digest
    assert [line for line in env_lines if not line.startswith("#")] == [
        digest,
        "LLAMA_ARG_HOST=192.0.2.7",
        "LLAMA_ARG_PORT=8080",
        f"LLAMA_API_KEY={KEY}",
    ]
    assert "ExecStart=/usr/bin/docker run --rm --name rigkit-llama-main" in (out / "good.service").read_text()


@pytest.mark.parametrize("host", [name for name in HOSTS if name != "good"])
def test_injection_is_refused_before_rendering(rendered: tuple[Path, dict[str, Any]], host: str) -> None:
    out, result = rendered
    message = failures(result).get(host)
    assert message is not None, f"{host}: rendered without complaint"
    assert not (out / f"{host}.env").exists() and not (out / f"{host}.service").exists()
    variable = {
        "key_newline": "llama_server_api_key",
        "key_space": "llama_server_api_key",
        "key_trailing_newline": "llama_server_api_key",
        "instance_trailing_newline": "llama_server_instance",
        "host_trailing_newline": "llama_server_host",
        "instance_newline": "llama_server_instance",
        "instance_path": "llama_server_instance",
        "host_newline": "llama_server_host",
        "arg_newline": "argument",
        "dir_newline": "path",
        "port_text": "llama_server_port",
        "port_privileged": "llama_server_port",
        "plain_lan": "llama_server_tls",
    }[host]
    assert variable in message
    assert KEY not in message  # the key's value is never echoed


def test_the_role_refuses_with_the_controllers_own_rules(rendered: tuple[Path, dict[str, Any]]) -> None:
    """One rule, two callers: the role's check on the rig says what the controller's validation says."""
    from rigkit.validation.rules import server_problems

    _, result = rendered
    found = failures(result)
    for host in ("port_privileged", "plain_lan", "key_trailing_newline"):
        expected = server_problems(
            host, {**HOSTS[host], "llama_server_host": HOSTS[host].get("llama_server_host", "127.0.0.1")}
        )
        assert expected and all(problem in found[host] for problem in expected), (host, expected, found[host])
    assert "port_privileged: llama_server_port is 80; expected 1024-65535" in found["port_privileged"]
