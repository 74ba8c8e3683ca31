"""library/local_docker_engine.py when it must not start an engine: one runs but refuses this user (the docker
group), or this user cannot start one. Run as a module, with a docker client on PATH that answers as the real one
does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import run_module

# What the real client prints as a user outside the docker group (Docker 20.10, Debian 12).
DENIED = (
    "Got permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock: "
    'Get "http://%2Fvar%2Frun%2Fdocker.sock/v1.24/version": dial unix /var/run/docker.sock: connect: '
    "permission denied"
)


def test_an_engine_that_refuses_this_user_is_said_so_and_none_is_started(tmp_path: Path, monkeypatch):
    client = tmp_path / "bin" / "docker"
    client.parent.mkdir()
    client.write_text(f"#!/bin/sh\necho 'Client: Docker Engine'\necho '{DENIED}' >&2\nexit 1\n")
    client.chmod(0o755)
    # a dockerd the module would start, were it to misread the refusal as no engine
    started = tmp_path / "dockerd-started"
    dockerd = tmp_path / "bin" / "dockerd"
    dockerd.write_text(f"#!/bin/sh\ntouch {started}\n")
    dockerd.chmod(0o755)
    monkeypatch.setenv("PATH", f"{client.parent}:{os.environ['PATH']}")
    log = tmp_path / "dockerd.log"
    result, printed = run_module("local_docker_engine", {"log_path": str(log), "daemon_json": str(tmp_path / "d.json")})
    assert result.get("failed"), printed
    assert "refuses this user (permission denied on its socket)" in result["msg"]
    assert "usermod -aG docker" in result["msg"] and result["started_by"] == "none"
    assert not started.exists() and not log.exists()


@pytest.mark.parametrize(
    ("said", "is_root", "expected"),
    [
        (DENIED, True, "refuses this user"),
        ("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?", False,
         "starting one needs root"),
        ("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?", True,
         None),
    ],
)  # fmt: skip
def test_refusal(said: str, is_root: bool, expected: str | None):
    import importlib.util

    from tests.support import REPO

    spec = importlib.util.spec_from_file_location("local_docker_engine", REPO / "library" / "local_docker_engine.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    why = module.refusal(said, is_root)
    assert (why is None) if expected is None else (expected in why)
