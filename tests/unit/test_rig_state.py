"""The no-op fast path's two digests: the rig's state (module_utils/rig_state.py and library/rig_converged.py, on
real files, with this machine's dpkg and systemd) and the controller's inputs (rigkit/rig_inputs.py); and that
every path a role writes on a rig lies under roles/rig_state's watched roots. The converges that take the fast
path, and the hand edits that leave it, are tests/integration/test_sandbox_provision.py and test_fleet.py."""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import rigkit  # noqa: F401  (first: it makes module_utils/ importable as ansible.module_utils)

# isort: split
from ansible.module_utils.llama_server.config import problem, serving
from ansible.module_utils.rig_state import (
    SMALL_FILE,
    compare,
    files,
    images,
    part_digests,
    read_state,
    server_container,
    units,
    write_record,
)

from rigkit.rig_inputs import code_digest, input_names, inputs_digest, lock_digest
from tests.support import REPO, run_module


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "etc"
    (root / "rigkit").mkdir(parents=True)
    (root / "rigkit" / "llama-main.env").write_text("LLAMA_ARG_PORT=18080\n")
    (root / "docker.json").write_text("{}\n")
    os.symlink("docker.json", root / "link")
    return root


def digest_of(root: Path, exclude: tuple[str, ...] = ()) -> str:
    return part_digests({"files": files([str(root)], exclude)})["files"]


def test_the_files_digest_follows_content_mode_links_and_presence(tree: Path) -> None:
    before = digest_of(tree)
    assert digest_of(tree) == before  # reading changes nothing
    env = tree / "rigkit" / "llama-main.env"
    env.write_text("LLAMA_ARG_PORT=18081\n")
    assert digest_of(tree) != before
    env.write_text("LLAMA_ARG_PORT=18080\n")
    assert digest_of(tree) == before  # the same content again: the same state (content, not mtime)
    env.chmod(0o600)
    assert digest_of(tree) != before
    env.chmod(0o644)
    os.utime(env, (1, 1))
    assert digest_of(tree) == before
    (tree / "link").unlink()
    os.symlink("rigkit", tree / "link")
    assert digest_of(tree) != before


def test_a_new_file_a_missing_root_and_the_excluded_paths(tree: Path, tmp_path: Path) -> None:
    before = digest_of(tree)
    (tree / "rigkit" / "main.canary.json").write_text("{}")
    assert digest_of(tree) != before
    assert digest_of(tree, ("*/rigkit/*.canary.json",)) == before
    absent = files([str(tmp_path / "nothing-here")])
    assert absent == [f"{tmp_path / 'nothing-here'} absent"]


def test_big_files_count_by_size_mtime_and_inode(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"\0" * (SMALL_FILE + 1))
    (line,) = [entry for entry in files([str(model)]) if entry.startswith(str(model))]
    stat = model.stat()
    assert line.endswith(f"file {stat.st_size} {stat.st_mtime_ns} {stat.st_ino}")


def test_compare_names_what_differs() -> None:
    parts = {"files": "a", "packages": "b", "units": "c"}
    assert compare(None, "in", parts)[0].startswith("no converge recorded")
    record = {"version": 1, "inputs": "in", "parts": dict(parts)}
    assert compare(record, "in", parts) == []
    assert compare(record, "other", parts) == ["the inputs changed (the kit's code or this rig's variables)"]
    assert compare(record, "in", {**parts, "packages": "x"}) == ["its packages changed"]
    recorded = {**record, "recorded_at": 1_000_000}
    assert compare(recorded, "in", parts, max_age=86400, now=1_000_000 + 3600) == []
    (old,) = compare(recorded, "in", parts, max_age=86400, now=1_000_000 + 2 * 86400)
    assert old == "the record is 48 h old, over rig_state_max_age_hours (24 h)"
    assert compare(recorded, "in", parts, max_age=0, now=1_000_000 + 400 * 86400) == []


def test_the_state_reads_this_machines_packages_units_and_kernel(tree: Path) -> None:
    state = read_state([str(tree)], [], ["no-such-unit.service"])
    assert any(line.startswith("dpkg ") or line.startswith("python3") for line in state["packages"].splitlines())
    assert state["kernel"][0] == f"running {os.uname().release}"
    assert any("no-such-unit.service" in line for line in state["units"]) or state["units"][0].startswith("<")


def test_a_timer_firing_is_no_change_of_its_unit() -> None:
    """The GPU collector's timer reads SubState=running while its service runs: the fast path must not converge."""
    from ansible.module_utils.rig_state import unit_lines

    def shown(timer_sub: str) -> str:
        return (
            "Id=prometheus-node-exporter.service\nActiveState=active\nSubState=running\nUnitFileState=enabled\n\n"
            f"Id=rigkit-gpu-metrics.timer\nActiveState=active\nSubState={timer_sub}\nUnitFileState=enabled\n"
        )

    assert unit_lines(shown("waiting")) == unit_lines(shown("running"))
    assert "SubState=running" in unit_lines(shown("waiting"))  # a service's SubState still counts
    assert unit_lines(shown("waiting")) != unit_lines(
        shown("waiting").replace("ActiveState=active\nSubState=w", "ActiveState=inactive\nSubState=w")
    )


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """A Docker engine API on a unix socket: GET of a path in ``routes`` answers its JSON, any other 404."""
    import socketserver

    routes: dict[str, Any] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path in routes
            body = json.dumps(routes[self.path] if found else {"message": "No such object"}).encode()
            self.send_response(200 if found else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def address_string(self) -> str:  # a unix socket has no peer address
            return "engine"

        def log_message(self, *args: object) -> None:
            pass

    class Engine(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    path = str(tmp_path / "docker.sock")
    server = Engine(path, Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield path, routes
    finally:
        server.shutdown()
        server.server_close()


def test_the_images_are_read_from_the_engines_api_on_its_socket(
    engine: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    """The state's images come from GET /images/json on the engine's unix socket (no docker CLI started): one line
    per tag, untagged images as <none>:<none>, sorted; an engine that does not answer reads as a marker."""
    path, routes = engine
    routes["/images/json"] = [
        {"Id": "sha256:b", "RepoTags": ["rigkit/llama-server:b1-abc", "rigkit/llama-server:latest"]},
        {"Id": "sha256:a", "RepoTags": None},
    ]
    assert images([path]) == (
        "<none>:<none> sha256:a\nrigkit/llama-server:b1-abc sha256:b\nrigkit/llama-server:latest sha256:b"
    )
    (tmp_path / "dead.sock").touch()
    assert images([str(tmp_path / "dead.sock")]).startswith("<docker engine unreadable")  # nobody listens
    assert images([str(tmp_path / "absent.sock")]) == "<no docker engine>"


def test_what_the_server_container_runs_is_read_from_the_engine_and_its_proven_file(
    engine: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    """The server's state: running, image ID and whether the configuration in its environment is the one whose
    canary passed; the API key beside it in the environment is never part of what is returned."""
    path, routes = engine
    proven = tmp_path / "main.proven"
    proven.write_text("digest-new\n")
    inspected = {
        "Image": "sha256:img",
        "State": {"Running": True},
        "Config": {"Env": ["LLAMA_API_KEY=secret-key", "RIGKIT_SERVER_CONFIG=digest-new", "PATH=/usr/bin"]},
    }
    routes["/containers/rigkit-llama-main/json"] = inspected
    assert server_container("rigkit-llama-main", str(proven), [path]) == {
        "running": True,
        "image_id": "sha256:img",
        "proven": True,
    }
    assert problem(serving(inspected, str(proven)), "sha256:img") is None
    assert "secret-key" not in json.dumps(serving(inspected, str(proven)))
    # a run killed after the restart and before the canary: the container runs a digest never proven
    proven.write_text("digest-old\n")
    assert server_container("rigkit-llama-main", str(proven), [path])["proven"] is False
    assert "canary never passed" in str(problem(serving(inspected, str(proven))))
    assert "not the tag's sha256:other" in str(problem(serving(inspected, "/absent"), "sha256:other"))
    # a stopped (or removed) container
    assert server_container("rigkit-llama-other", str(proven), [path]) == {
        "running": False,
        "image_id": None,
        "proven": False,
    }
    assert problem(serving(None, str(proven))) == "the server's container is not running"
    with pytest.raises(ValueError, match="not a container name"):
        server_container("../images", str(proven), [path])


def test_the_module_records_then_finds_the_rig_in_sync_until_a_file_changes(tree: Path, tmp_path: Path) -> None:
    args = {"inputs": "abc", "watch": [str(tree)], "path": str(tmp_path / "state" / "converged.json")}
    checked, printed = run_module("rig_converged", args)
    assert checked["in_sync"] is False and "no converge recorded" in checked["reasons"][0], printed
    recorded, printed = run_module("rig_converged", {**args, "state": "record"})
    assert recorded["changed"] is False, printed
    assert oct((tmp_path / "state" / "converged.json").stat().st_mode & 0o777) == "0o600"
    again, printed = run_module("rig_converged", args)
    assert again["in_sync"] is True and again["reasons"] == [], printed
    other_inputs, _ = run_module("rig_converged", {**args, "inputs": "abd"})
    assert other_inputs["in_sync"] is False
    (tree / "rigkit" / "llama-main.env").write_text("EDITED=1\n")
    edited, _ = run_module("rig_converged", args)
    assert edited["in_sync"] is False and edited["reasons"] == ["its files changed"]


@pytest.fixture
def health_server():
    """A real HTTP server on loopback answering /health 200 to the right bearer token (401 otherwise)."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            ok = self.path == "/health" and self.headers.get("Authorization") == "Bearer k3y"
            body = b'{"status":"ok"}' if ok else b"{}"
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def test_a_rig_that_matches_is_asked_for_health_in_the_same_run(tree: Path, tmp_path: Path, health_server) -> None:
    """The fast path's one module run also polls /health of the server the record names (with the API key as a
    bearer token, never printed nor recorded); a matching rig whose server does not answer fails the module, marked
    for check.yml; a rig that does not match is not asked. Without systemd here the unit has no invocation ID, so
    no canary record counts (a canary is owed)."""
    url, seen = health_server
    args = {"inputs": "abc", "watch": [str(tree)], "path": str(tmp_path / "converged.json")}
    server = {"url": url, "unit": "rigkit-llama-main.service", "record": str(tmp_path / "main.canary.json")}
    run_module("rig_converged", {**args, "state": "record", "units": ["docker.service"], "server": server})
    record = json.loads((tmp_path / "converged.json").read_text())
    assert {key: value for key, value in record["server"].items() if value is not None} == server
    assert record["units"] == ["docker.service"]

    # Nothing names the server nor the units: the check reads both from the record.
    serving, printed = run_module("rig_converged", {**args, "api_key": "k3y", "health_timeout": 5})
    assert serving["in_sync"] is True and serving["server"]["from_record"] is False, printed
    assert serving["server"]["url"] == url
    assert seen == ["Bearer k3y"] and "k3y" not in printed and "k3y" not in json.dumps(record)

    # The recorded units are the ones read (units named in the check would be read instead).
    assert serving["parts"]["units"] == part_digests({"units": units(["docker.service"])})["units"]
    others, _ = run_module("rig_converged", {**args, "units": ["ssh.service"], "api_key": "k3y", "health_timeout": 5})
    assert others["parts"]["units"] == part_digests({"units": units(["ssh.service"])})["units"]

    silent = {**server, "url": "http://127.0.0.1:9"}
    gone, printed = run_module("rig_converged", {**args, "server": silent, "health_timeout": 2})
    assert gone.get("failed") is True and gone["server_unanswered"] is True, printed
    assert "its server does not answer" in gone["msg"]
    other, printed = run_module("rig_converged", {**args, "inputs": "other", "server": silent, "health_timeout": 2})
    assert other["in_sync"] is False and "server" not in other, printed


def test_a_record_without_a_server_asks_none(tree: Path, tmp_path: Path) -> None:
    """A record of the previous version (no units, no server) never matches: the next run converges and records
    again; a record without a server (a state recorded with none) is checked without a /health poll."""
    path = tmp_path / "converged.json"
    args = {"inputs": "abc", "watch": [str(tree)], "path": str(path)}
    run_module("rig_converged", {**args, "state": "record"})
    checked, printed = run_module("rig_converged", args)
    assert checked["in_sync"] is True and "server" not in checked, printed
    old = json.loads(path.read_text())
    old["version"] = 1
    path.write_text(json.dumps(old))
    stale, _ = run_module("rig_converged", args)
    assert stale["in_sync"] is False and "no converge recorded" in stale["reasons"][0]


def test_record_in_check_mode_writes_nothing(tree: Path, tmp_path: Path) -> None:
    args = {"inputs": "abc", "watch": [str(tree)], "path": str(tmp_path / "converged.json"), "state": "record"}
    result, printed = run_module("rig_converged", args, "--check")
    assert result["changed"] is False, printed
    assert not (tmp_path / "converged.json").exists()


def test_write_record_leaves_no_scratch(tmp_path: Path) -> None:
    write_record("x", {"files": "y"}, str(tmp_path / "r.json"))
    assert not (tmp_path / "r.json.tmp").exists()


# ----------------------------------------------------------------------------------------- inputs
def test_the_code_digest_follows_the_kit_but_not_its_documentation(tmp_path: Path) -> None:
    kit = tmp_path / "kit"
    for name in ("roles", "library", "playbooks"):
        shutil.copytree(REPO / name, kit / name, ignore=shutil.ignore_patterns("molecule", "__pycache__"))
    for name in ("ansible.cfg", "requirements.txt"):
        shutil.copy(REPO / name, kit / name)
    before = code_digest(str(kit))
    (kit / "roles" / "docker" / "README.md").write_text("a new README\n")
    code_digest.cache_clear()
    assert code_digest(str(kit)) == before
    defaults = kit / "roles" / "llama_server" / "defaults" / "main.yml"
    defaults.write_text(defaults.read_text() + "\n# an edit\n")
    code_digest.cache_clear()
    assert code_digest(str(kit)) != before


def test_the_inputs_are_the_role_variables_not_the_runs_own_results() -> None:
    names = [
        "llama_server_ctx_size",
        "models_target",
        "rig_kind",
        "model_catalog",
        "ansible_host",
        "groups",
        "playbook_dir",
        "__llama_server_report",
        "rig_state_check",
        "__rig_lock_deployed",
        "models_missing",
        "rig_state_inputs",
        "inventory_hostname",
    ]
    assert input_names(names) == ["ansible_host", "llama_server_ctx_size", "model_catalog", "models_target", "rig_kind"]
    values = {"llama_server_ctx_size": 2048, "models_target": "tiny", "rig_kind": "sandbox"}
    before = inputs_digest(values, values.__getitem__)
    assert inputs_digest(values, values.__getitem__) == before
    assert (
        inputs_digest({**values, "llama_server_ctx_size": 4096}, {**values, "llama_server_ctx_size": 4096}.__getitem__)
        != before
    )
    assert (
        inputs_digest({**values, "__llama_server_report": {"x": 1}}, {**values, "__llama_server_report": 1}.__getitem__)
        == before
    )
    # What roles/rig_context names is derived from the inputs: the fast path digests before naming anything, the
    # record keeps that digest, and a digest taken after naming is the same.
    named = {
        **values,
        "llama_server_effective": {"url": "http://127.0.0.1:1"},
        "models_target_path": "/x",
        "rig_context_ready": True,
    }
    assert inputs_digest(named, named.__getitem__) == before
    assert lock_digest({"unit_sha256": "a"}) != lock_digest({"unit_sha256": "b"}) != lock_digest(None)


# ----------------------------------------------------------------------------------------- coverage
WATCH = yaml.safe_load((REPO / "roles" / "rig_state" / "defaults" / "main.yml").read_text())["rig_state_watch"]
# Paths roles name that are not the rig's configuration: the kernel's own files, programs and packaged files
# (the packages part covers those), the rig's scratch for image archives (removed in the same run), the engine's
# data (the images part), and the directories models_prune refuses to treat as its own.
NOT_ON_THE_RIG = (
    "/sys/",
    "/proc/",
    "/boot/",
    "/lib/systemd/systemd",
    "/usr/local/bin/dockerd",
    "/usr/local/cuda-",
    "/var/cache/rigkit",
    "/usr/sbin/",
    "/usr/bin/",
    "/usr/share/",
    "/lib/modules/",
    "/var/lib/docker",
)
NOT_PATHS = {"/var/lib", "/srv", "/opt", "/home", "/usr", "/etc"}


def role_paths() -> set[str]:
    """Every absolute path written in a rig role's tasks, defaults or vars (up to its first template); the fleet
    services' roles (fleet_*) run on the fleet_services host, which has no fast path."""
    found: set[str] = set()
    for folder in ("tasks", "defaults", "vars", "handlers"):
        for path in (REPO / "roles").glob(f"*/{folder}/*.yml"):
            if path.parts[-3].startswith("fleet_"):
                continue
            for match in re.finditer(r"(?<![\w.{])(/(?:etc|usr|var|opt|lib)/[A-Za-z0-9_./-]*)", path.read_text()):
                found.add(match.group(1).rstrip("."))
    return found


def test_every_path_a_role_writes_lies_under_a_watched_root() -> None:
    paths = {path for path in role_paths() if not path.startswith(NOT_ON_THE_RIG) and path not in NOT_PATHS}
    assert "/etc/docker/daemon.json" in paths and "/etc/apt/keyrings/docker.asc" in paths  # the scan works
    outside = sorted(p for p in paths if not any(p == root or p.startswith(root.rstrip("/") + "/") for root in WATCH))
    assert outside == [], f"add these to rig_state_watch (roles/rig_state/defaults/main.yml): {outside}"


def test_the_report_line_reads_the_canary_figures() -> None:
    """The line a run ends with (llama_server's report.yml, and the fast path's report from the record): the same
    filter for both."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("llama_server_filters", REPO / "filter_plugins" / "llama_server.py")
    assert spec and spec.loader
    filters = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(filters)
    line = filters.FilterModule().filters()["llama_server_report_line"]
    figures = {
        "build_info": "b1-abc",
        "draft_n": 24,
        "draft_n_accepted": 18,
        "acceptance": 0.75,
        "predicted_per_second": 31.44,
    }
    assert line(figures, "rig", "main", "http://127.0.0.1:1", "draft-mtp", 32) == (
        'llama-server "main" on rig answers at http://127.0.0.1:1 (b1-abc, draft-mtp): draft acceptance 0.75 '
        "(18 accepted / 24 drafted), 31.4 tokens/s on a 32-token canary."
    )
    plain = line({"build_info": "b1-abc", "draft_n": 0, "predicted_per_second": 9}, "rig", "main", "u", "none", 8)
    assert plain.endswith("(b1-abc, none): no drafting, 9.0 tokens/s on a 8-token canary.")


def test_the_fast_path_sorts_the_rigs_once_and_later_plays_exclude_the_rigs_in_sync() -> None:
    """provision.yml sorts the rigs with group_by right after the check; every later play of provision.yml and
    models.yml runs on a pattern that excludes rigs_in_sync, and no task anywhere else guards on in_sync."""
    provision = yaml.safe_load((REPO / "playbooks/provision.yml").read_text())
    plays = [play for play in provision if "hosts" in play]
    check = next(i for i, play in enumerate(plays) if "last converge" in play["name"])
    sort = [task for task in plays[check]["tasks"] if "ansible.builtin.group_by" in task]
    assert len(sort) == 1 and "rigs_in_sync" in sort[0]["ansible.builtin.group_by"]["key"]
    later = plays[check + 1 :] + [play for play in yaml.safe_load((REPO / "playbooks/models.yml").read_text())]
    assert later and all(play["hosts"].endswith(":!rigs_in_sync") for play in later), [p["hosts"] for p in later]
    inventory = yaml.safe_load((REPO / "inventory/hosts.yml").read_text())
    assert "rigs_in_sync" in inventory["all"]["children"], "declare the group, so the pattern never warns"
    guards = [
        str(path.relative_to(REPO))
        for top in ("playbooks", "roles")
        for path in sorted((REPO / top).rglob("*.yml"))
        if "rig_state" not in path.parts and re.search(r"when:[^\n]*\.in_sync\b|meta: end_host", path.read_text())
    ]
    assert guards == [], f"guards on in_sync outside roles/rig_state: {guards}"
