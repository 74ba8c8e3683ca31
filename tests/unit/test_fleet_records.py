"""The lock file's entries and updates, and the status table's rows, from rig_deployed answers shaped like the
real ones (tests/integration/test_fleet.py reads them back from real rigs)."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest
from ansible.module_utils.rig_deployed import server_settings
from ansible.module_utils.rig_lock import LockError, differences, entry_from_deployed, read_lock, update_lock

from rigkit.fleet.status import render, rows

REPO = Path(__file__).resolve().parents[2]
SHA = "ab" * 32
# llama-server's argv in a container the kit started (roles/llama_server/vars/main.yml's order)
RUNNING_ARGV = [
    "--model", "/m/t.gguf", "--ctx-size", "1024", "--parallel", "1", "--host", "127.0.0.1", "--port", "8080",
    "--model-draft", "/m/d.gguf", "--spec-type", "draft-mtp", "--spec-draft-n-max", "3", "--spec-draft-n-min", "0",
]  # fmt: skip


def deployed(**changes) -> dict:
    answer = {
        "packages": {"docker.io": {"version": "20.10.24+dfsg1-1+deb12u1+b6", "held": True}},
        "gpu": None,
        "image": {
            "tag": "rigkit/llama-server:b11312-0c1e570-cpu-4bdc9a9447ec",
            "id": "sha256:" + "0" * 64,
            "llamacpp_commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f",
            "llamacpp_build_number": "11312",
            "source_sha256": SHA,
            "cuda": "OFF",
            "cuda_architectures": "",
            "build_base_image": "rigkit/debian:bookworm-15984584e4be",
            "runtime_base_image": "rigkit/debian:bookworm-15984584e4be",
        },
        "container": {
            "image_id": "sha256:" + "0" * 64,
            "image": "x",
            "running": True,
            "proven": True,
            "health": "healthy",
            "settings": server_settings(RUNNING_ARGV),
        },
        "unit": {"active": "active", "sub": "running", "uptime_s": 3725.0, "path": "/etc/x", "sha256": SHA},
        "models": {
            "target": {"name": "tiny-gemma4-target", "path": "/m/t.gguf", "sha256": SHA, "verified": True},
            "drafter": {"name": "tiny-gemma4-assistant", "path": "/m/d.gguf", "sha256": SHA, "verified": True},
        },
        "server": {
            "answers": True,
            "build_info": "b11312-0c1e570",
            "slots": 1,
            "ctx_per_slot": 1024,
            "speculative": True,
            "spec_types": "none,draft-mtp",
            "tokens_predicted": 100,
            "decode_tps": 41.5,
            "drafted_tokens": 90,
            "accepted_tokens": 9,
            "acceptance": 0.1,
        },
    }
    answer.update(changes)
    return answer


# ---------------------------------------------------------------------------------------------- lock
def test_entry_holds_the_pinned_inputs_only():
    entry = entry_from_deployed(deployed())
    assert sorted(entry) == ["gpu", "image", "models", "packages", "unit_sha256"]
    assert entry["packages"] == {"docker.io": "20.10.24+dfsg1-1+deb12u1+b6"}
    assert entry["models"]["target"] == {"name": "tiny-gemma4-target", "sha256": SHA}
    assert "uptime" not in json.dumps(entry) and "build_info" not in json.dumps(entry)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"image": None}, "image is not on the rig"),
        ({"unit": {"sha256": None}}, "unit file is missing"),
        ({"container": None}, "container is not running"),
        ({"container": {"running": False, "image_id": "sha256:" + "0" * 64, "proven": True}}, "is not running"),
        (
            {"container": {"running": True, "image_id": "sha256:" + "1" * 64, "proven": True}},
            "runs image sha256:1+, not the tag's sha256:0+",
        ),
        (
            {"container": {"running": True, "image_id": "sha256:" + "0" * 64, "proven": False}},
            "runs a configuration whose canary never passed: provision the rig again",
        ),
        (
            {"models": {"target": {"name": "t", "path": "/m", "sha256": SHA, "verified": False}}},
            "target model t on the rig is not the verified file",
        ),
    ],
)
def test_entry_refuses_a_rig_that_is_not_provisioned(change, message):
    with pytest.raises(LockError, match=message):
        entry_from_deployed(deployed(**change))


def test_differences_keep_the_image_id_informational():
    before = entry_from_deployed(deployed())
    rebuilt = deployed()
    rebuilt["image"] = {**rebuilt["image"], "id": "sha256:" + "1" * 64}
    rebuilt["container"] = {**rebuilt["container"], "image_id": "sha256:" + "1" * 64}
    lines, info = differences(before, entry_from_deployed(rebuilt))
    assert lines == [] and info == [f"image.id: sha256:{'0' * 64} -> sha256:{'1' * 64}"]
    upgraded = deployed(packages={"docker.io": {"version": "20.10.25", "held": True}})
    lines, _ = differences(before, entry_from_deployed(upgraded))
    assert lines == ["packages.docker.io: 20.10.24+dfsg1-1+deb12u1+b6 -> 20.10.25"]


def test_update_records_replaces_and_reports_the_previous_entry(tmp_path):
    lock = tmp_path / "rigs.lock.json"
    entry = entry_from_deployed(deployed())
    assert update_lock(str(lock), "a", entry) is None
    assert update_lock(str(lock), "a", entry) == entry
    text = lock.read_text()
    assert json.loads(text)["rigs"] == {"a": entry}
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"  # stable, reviewable bytes


def test_check_mode_writes_nothing(tmp_path):
    lock = tmp_path / "rigs.lock.json"
    update_lock(str(lock), "a", entry_from_deployed(deployed()), check_mode=True)
    assert not lock.exists()


def _write(path: str, host: str) -> None:
    from ansible.module_utils.rig_lock import update_lock as write

    write(path, host, {"n": host})


def test_parallel_writers_lose_no_entry(tmp_path):
    lock = str(tmp_path / "rigs.lock.json")
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_write, args=(lock, f"rig{index}")) for index in range(12)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    assert sorted(read_lock(lock)) == sorted(f"rig{index}" for index in range(12))


def test_a_foreign_file_is_refused(tmp_path):
    lock = tmp_path / "rigs.lock.json"
    lock.write_text("[1, 2]")
    with pytest.raises(LockError, match="not a rigkit lock file"):
        read_lock(str(lock))


# ---------------------------------------------------------------------------------------------- status
def status(**deployed_changes) -> dict:
    return {
        "reachable": True,
        "error": "",
        "kind": "sandbox",
        "expected": {
            "image": "rigkit/llama-server:b11312-0c1e570-cpu-4bdc9a9447ec",
            "spec_type": "draft-mtp",
            "draft_n_max": 3,
            "ctx_size": 1024,
            "parallel": 1,
            "gpu": {},
            "url": "http://127.0.0.1:8080",
        },
        "deployed": deployed(**deployed_changes),
    }


def test_status_row_for_a_healthy_rig():
    (row,) = rows({"sandbox-mtp": status()})
    cells = row["cells"]
    assert cells["target"] == "tiny-gemma4-target (verified)"
    assert cells["llama.cpp"] == "b11312-0c1e570"
    assert cells["service"] == "active 1h02m (healthy)"
    assert cells["draft/ctx"] == "3/1024x1"
    assert cells["acceptance"] == "0.10 (9/90)"
    assert cells["decode t/s"] == "41.5"
    assert cells["state"] == "serving 1h02m" and cells["model"] == "tiny-gemma4-target" and cells["accept"] == "0.10"
    assert "!" not in render([row]) and "!" not in render([row], wide=True)


def test_status_is_compact_by_default_and_wide_on_request():
    """The default shows what a person reads (state, model, URL, figures); wide=1 every column."""
    (row,) = rows({"sandbox-mtp": status()})
    compact, wide = render([row]).splitlines(), render([row], wide=True).splitlines()
    assert compact[0].split() == ["RIG", "STATE", "MODEL", "URL", "ACCEPT", "TOK/S"]
    assert compact[1].split() == [
        "sandbox-mtp",
        "serving",
        "1h02m",
        "tiny-gemma4-target",
        "http://127.0.0.1:8080",
        "0.10",
        "41.5",
    ]
    assert max(len(line) for line in compact) <= 100, compact
    assert "KERNEL" in wide[0] and "b11312-0c1e570" in wide[1] and "(healthy)" in wide[1]


def test_status_marks_what_differs_from_the_inventory():
    off = status(server={**deployed()["server"], "speculative": False, "spec_types": "none"})
    unverified = status(models={"target": {"name": "t", "path": "/m", "sha256": SHA, "verified": False}})
    table = render(rows({"a": off, "b": unverified}), wide=True)
    assert "off/1024x1 !" in table
    assert "t (UNVERIFIED!)" in table
    assert "differs from what the inventory says" in table
    compact = render(rows({"a": off, "b": unverified}))
    assert "serving 1h02m !" in compact and " off " in compact and "t (UNVERIFIED!)" in compact
    assert "`make status wide=1` shows where" in compact


def test_status_shows_the_draft_length_the_server_runs_not_the_inventorys():
    """The inventory says 3; the container was started with 2 (a hand-edited unit, a converge that did not
    restart the server): the table shows 2 and marks it."""
    argv = [arg if arg != "3" else "2" for arg in RUNNING_ARGV]
    container = {**deployed()["container"], "settings": server_settings(argv)}
    (row,) = rows({"sandbox-mtp": status(container=container)})
    assert row["cells"]["draft/ctx"] == "2/1024x1 !"
    assert row["cells"]["state"].endswith(" !")
    assert "differs from what the inventory says" in render([row])
    other_ctx = server_settings([*RUNNING_ARGV, "--ctx-size=2048"])  # the last flag wins, as in llama.cpp
    (row,) = rows({"sandbox-mtp": status(container={**deployed()["container"], "settings": other_ctx})})
    assert row["cells"]["draft/ctx"] == "3/1024x1 !"


def test_server_settings_reads_both_spellings():
    assert server_settings(
        ["-m", "/m", "-c", "4096", "-np", "2", "--spec-type=draft-mtp", "--spec-draft-n-max", "4"]
    ) == {
        "ctx_size": 4096,
        "parallel": 2,
        "spec_type": "draft-mtp",
        "draft_n_max": 4,
    }


def test_status_keeps_unreachable_rigs_with_the_reason():
    down = rows({"far": {"reachable": False, "error": "ssh: no route to host", "expected": {}}})
    _header, line, _, note, *_ = render(down, wide=True).splitlines()
    assert line.split()[:3] == ["far", "no", "unreachable"]
    assert note == "far: ssh: no route to host"
    _header, line, _, note, *_ = render(down).splitlines()
    assert line.split() == ["far", "unreachable", "-", "-", "-", "-"] and note == "far: ssh: no route to host"
