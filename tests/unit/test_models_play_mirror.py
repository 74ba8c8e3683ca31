"""playbooks/models.yml with the hardened mirror, on two "rigs" that are this machine
(local connection, models_dir in a temporary directory): the mirror listens on the rigs' controller address
only and accepts only the rigs' addresses (their network facts), every rig URL carries the per-run secret
(never printed, never logged, removed afterwards), only this run's files are allowed, and rigs that reach the
controller at different addresses get one listener each."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.model_catalog import rig_model_path

from rigkit.mirror.models import ModelMirror
from tests.support import free_port, model_catalog

CATALOG = model_catalog()

REPO = Path(__file__).resolve().parents[2]
TARGET, DRAFTER = "tiny-gemma4-target", "tiny-gemma4-assistant"


def this_machines_addresses() -> set[str]:
    """The rigs' (this machine's) addresses as their network facts list them (from `ip`): all but 127.x and ::1;
    with none, the play passes no --client and the loopback mirror takes any source."""
    ip = shutil.which("ip")
    shown = subprocess.run([ip, "-j", "addr", "show"], capture_output=True, text=True, timeout=30) if ip else None
    links = json.loads(shown.stdout) if shown and shown.returncode == 0 else []
    found = {info["local"] for link in links for info in link.get("addr_info", []) if "local" in info}
    found = {address for address in found if not address.startswith("127.") and address != "::1"}
    return found or {"any (loopback only)"}


@pytest.fixture(scope="module")
def upstream(tiny_gemma4_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The rigs' "Hugging Face": the tiny pair in the resolve/ layout, served on loopback."""
    root = tmp_path_factory.mktemp("upstream")
    for name, source in ((TARGET, tiny_gemma4_pair[0]), (DRAFTER, tiny_gemma4_pair[1])):
        entry = CATALOG[name]
        assert hashlib.sha256(source.read_bytes()).hexdigest() == entry["sha256"], f"{name}: fixture drifted"
        dest = root / entry["repo"] / "resolve" / entry["revision"] / entry["filename"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest)
    with ModelMirror(root) as server:
        yield server


def play(
    tmp_path: Path, upstream: ModelMirror, addresses: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], Path]:
    cache = tmp_path / "cache"
    rigs = {
        name: {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "models_target": TARGET,
            "models_drafter": DRAFTER,
            "models_dir": str(tmp_path / name / "models"),
            "models_controller_address": address,
        }
        for name, address in addresses.items()
    }
    inventory = {
        "all": {
            "children": {"rigs": {"children": {"hardening_rigs": {"hosts": rigs}}}},
        }
    }
    (tmp_path / "hosts.json").write_text(json.dumps(inventory))
    extra = {
        "models_upstream_base_url": upstream.url,
        "models_upstream_allow_insecure_http": True,
        "models_mirror_port": free_port(*sorted(set(addresses.values()))),
    }
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "RIGKIT_CACHE_DIR": str(cache)}
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(REPO / "inventory/hosts.yml")]
    cmd += ["-i", str(tmp_path / "hosts.json"), "--limit", "hardening_rigs", "-e", json.dumps(extra)]
    cmd += ["-e", f"ansible_python_interpreter={sys.executable}", str(REPO / "playbooks/models.yml")]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    return done, cache / "run"


def test_the_fleet_mirror_is_bound_secret_and_gone_afterwards(upstream: ModelMirror, tmp_path: Path) -> None:
    done, run_dir = play(tmp_path, upstream, {"hrig1": "127.0.0.1", "hrig2": "127.0.0.1"})
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed[-6000:]
    for rig in ("hrig1", "hrig2"):
        for name in (TARGET, DRAFTER):
            entry = CATALOG[name]
            path = Path(rig_model_path(str(tmp_path / rig / "models"), entry))
            assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]
    log = (run_dir / "mirror.log").read_text()
    assert re.search(r"serving \S+ on 127\.0\.0\.1:\d+", log)
    clients = re.search(r"serving .*; clients: (.*)", log)
    assert clients and set(clients[1].split(", ")) == this_machines_addresses(), log  # the rigs' facts
    assert "refused" not in log
    requests = re.findall(r'"(?:GET|HEAD) (/\S*) HTTP', log)
    assert requests and all(path.startswith("/<secret>/rigkit-sandbox/") for path in requests), requests
    assert not (run_dir / "mirror.secret").exists()  # forgotten at the end of the play
    assert not (run_dir / "mirror.pid").exists()
    stats = json.loads((run_dir / "mirror.stats.json").read_text())
    assert stats["credentialed_requests"] == 0 and stats["url"].startswith("http://127.0.0.1:")
    assert set(stats["files"]) == {
        f"/{CATALOG[n]['repo']}/resolve/{CATALOG[n]['revision']}/{CATALOG[n]['filename']}" for n in (TARGET, DRAFTER)
    }
    # No 32-character URL-safe secret in any URL Ansible printed.
    assert not re.search(r"http://127\.0\.0\.1:\d+/[A-Za-z0-9_-]{32}", printed)


def test_rigs_that_reach_the_controller_at_different_addresses_get_one_listener_each(
    upstream: ModelMirror, tmp_path: Path
) -> None:
    """Sandboxes on loopback and rigs on the LAN in one run: each address is bound, never 0.0.0.0."""
    done, run_dir = play(tmp_path, upstream, {"hrig1": "127.0.0.1", "hrig2": "127.0.0.2"})
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    log = (run_dir / "mirror.log").read_text()
    assert re.search(r"serving \S+ on 127\.0\.0\.1, 127\.0\.0\.2:\d+", log), log
    entry = CATALOG[TARGET]  # hrig2's base URL names 127.0.0.2 only: its files came through that listener
    assert Path(rig_model_path(str(tmp_path / "hrig2" / "models"), entry)).is_file()
