"""daemon.json is shared by several owners: merging must keep theirs and write only on change."""

from __future__ import annotations

import json
import os

import pytest
from ansible.module_utils.docker_daemon_config import (
    DaemonConfigError,
    deep_merge,
    exposure_problems,
    merge_into_file,
    plan_merge,
)

from tests.support import run


def test_deep_merge_keeps_other_owners_keys():
    base = {"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}, "log-opts": {"max-file": "5"}}
    overlay = {"log-opts": {"max-size": "10m"}, "bridge": "none"}
    assert deep_merge(base, overlay) == {
        "runtimes": {"nvidia": {"path": "nvidia-container-runtime"}},
        "log-opts": {"max-file": "5", "max-size": "10m"},
        "bridge": "none",
    }


def test_scalar_replaces_and_remove_drops(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text(json.dumps({"debug": True, "old-key": 1}))
    result = plan_merge(str(path), {"debug": False}, remove=["old-key"])
    assert result.after == {"debug": False}
    assert result.changed


def test_writes_only_when_changed(tmp_path):
    path = tmp_path / "daemon.json"
    first = merge_into_file(str(path), {"bridge": "none"})
    assert first.changed
    stamp = os.stat(path).st_mtime_ns
    second = merge_into_file(str(path), {"bridge": "none"})
    assert not second.changed
    assert os.stat(path).st_mtime_ns == stamp


def test_missing_file_with_nothing_to_set_stays_missing(tmp_path):
    path = tmp_path / "daemon.json"
    assert not merge_into_file(str(path), {}).changed
    assert not path.exists()


def test_broken_json_is_an_error_and_left_alone(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text('{"bridge": ')
    with pytest.raises(DaemonConfigError, match="not valid JSON"):
        merge_into_file(str(path), {"bridge": "none"})
    assert path.read_text() == '{"bridge": '


def test_non_object_is_an_error(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text("[1, 2]")
    with pytest.raises(DaemonConfigError, match="JSON object"):
        plan_merge(str(path), {})


def _module(path, settings: dict, *extra: str):
    return run(
        [
            "ansible",
            "localhost",
            "-m",
            "docker_daemon_config",
            "-a",
            json.dumps({"path": str(path), "settings": settings}),
            *extra,
        ]
    )


def test_module_merges_reports_changed_and_honours_check_mode(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text(json.dumps({"max-concurrent-downloads": 4}))

    checked = _module(path, {"bridge": "none"}, "--check", "--diff")
    assert checked.returncode == 0, checked.tail()
    assert "CHANGED" in checked.output
    assert json.loads(path.read_text()) == {"max-concurrent-downloads": 4}

    applied = _module(path, {"bridge": "none"})
    assert applied.returncode == 0, applied.tail()
    assert "CHANGED" in applied.output
    assert json.loads(path.read_text()) == {"max-concurrent-downloads": 4, "bridge": "none"}

    again = _module(path, {"bridge": "none"})
    assert again.returncode == 0, again.tail()
    assert "SUCCESS" in again.output and "CHANGED" not in again.output


def test_module_fails_clearly_on_broken_file(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text("{nope")
    result = _module(path, {"bridge": "none"})
    assert result.returncode != 0
    assert "not valid JSON" in result.output
    assert path.read_text() == "{nope"


@pytest.mark.parametrize(
    "hosts",
    [
        ["tcp://0.0.0.0:2375"],
        ["unix:///run/docker.sock", "tcp://192.168.1.20:2376"],
        ["tcp://:2375"],
        ["[::]:2375"],
        "tcp://10.0.0.2:2375",
        ["tcp://127.0.0.1:2375"],
        ["localhost:2375", "unix:///run/docker.sock"],
        ["tcp://[::1]:2375"],
    ],
)
def test_the_docker_api_on_the_network_without_client_certificates_is_refused(hosts):
    problems = exposure_problems({"hosts": hosts})
    assert len(problems) == 1 and "is root on the rig for anyone who reaches it" in problems[0], problems
    # TLS without verifying the client is no authentication
    assert exposure_problems({"hosts": hosts, "tls": True, "tlscert": "c", "tlskey": "k"})


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"hosts": ["unix:///run/docker.sock", "fd://"]},
        {"hosts": ["tcp://0.0.0.0:2376"], "tlsverify": True, "tlscacert": "ca", "tlscert": "c", "tlskey": "k"},
        {"bridge": "none", "log-driver": "journald"},
    ],
)
def test_local_or_client_verified_api_is_accepted(settings):
    assert exposure_problems(settings) == []


def test_module_refuses_to_expose_the_api_and_leaves_the_file(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text(json.dumps({"bridge": "none"}))
    result = _module(path, {"hosts": ["tcp://0.0.0.0:2375"]})
    assert result.returncode != 0
    assert "docker daemon settings refused: hosts has 'tcp://0.0.0.0:2375'" in result.output, result.tail()
    assert json.loads(path.read_text()) == {"bridge": "none"}
