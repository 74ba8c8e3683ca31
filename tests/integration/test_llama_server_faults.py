"""Every fault a rollout can meet leaves the previous server answering, on a sandbox rig of its own
(container rigkit-sandbox-faults, tests/integration/inventories/faults: the sandbox-mtp profile) so that its bad
changes and killed runs go on beside the tests that read the kit's sandboxes: a refused drafter or context, a
flag the server rejects, a health check that never passes, a GPU rig served on the CPU, a server killed under
systemd, and a provision killed after each write of the rollout."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support import (
    REPO,
    Run,
    kit_env,
    own_cache,
    recap,
    remove_rig,
    role_defaults,
    run,
)

INVENTORY_DIR = REPO / "tests/integration/inventories/faults"
RIG = "sandbox-faults"
SETTINGS = yaml.safe_load((INVENTORY_DIR / "hosts.yml").read_text())["all"]["children"]["rigs"]["children"][
    "sandbox_rigs"
]["hosts"][RIG]
CONTAINER = SETTINGS["ansible_host"]
UNIT = "rigkit-llama-main.service"
URL = f"http://127.0.0.1:{SETTINGS['llama_server_port']}"


def rig_env(cache: Path) -> dict[str, str]:
    """The kit's inventory plus this rig's, and a controller cache of its own (own mirror pidfile and lock)."""
    return {
        "ANSIBLE_INVENTORY": f"{REPO / 'inventory/hosts.yml'},{INVENTORY_DIR}",
        "RIGKIT_CACHE_DIR": str(cache),
        "RIGKIT_LOCK_FILE": str(cache / "rigs.lock.json"),
    }


def in_rig(container: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "exec", container, *argv], capture_output=True, text=True, check=False)


def provision(env: dict[str, str], *extra: str, log: str) -> tuple[int, str]:
    result = provision_run(env, *extra, log=log)
    return result.returncode, result.output


def provision_run(env: dict[str, str], *extra: str, log: str) -> Run:
    """`make provision` of the rig in ``env`` (rig_env), with the rigkit_results JSON to match task outcomes in."""
    argv = ["make", "--no-print-directory", "provision", f"host={RIG}", f"ARGS={' '.join(extra)}"]
    return run(argv, log_name=log, results=True, **env)


@pytest.fixture(scope="module")
def faults_rig(llama_image, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The rig provisioned from nothing; yields its environment (rig_env) for every later run."""
    remove_rig(CONTAINER)
    env = rig_env(own_cache(tmp_path_factory, "faults-cache"))
    code, output = provision(env, log="provision-sandbox-faults-first")
    assert code == 0, output[-6000:]
    yield env
    remove_rig(CONTAINER)


def serving(container: str = CONTAINER, url: str = URL) -> dict:
    """What the rig's current server answers: health, and a completion's timings."""
    health = in_rig(container, "curl", "-sf", f"{url}/health")
    body = json.dumps({"prompt": "Hello", "n_predict": 8, "temperature": 0, "cache_prompt": False})
    answer = in_rig(container, "curl", "-sf", "-H", "Content-Type: application/json", "-d", body, f"{url}/completion")
    return {
        "health": health.stdout.strip(),
        "timings": json.loads(answer.stdout)["timings"] if answer.returncode == 0 else None,
    }


def unit_text(container: str = CONTAINER) -> str:
    return in_rig(container, "cat", f"/etc/systemd/system/{UNIT}").stdout


@pytest.fixture
def previous(faults_rig) -> dict:
    """The server as it answers before a bad change, and its unit file."""
    state = {"unit": unit_text(), "serving": serving()}
    assert state["serving"]["health"] == '{"status":"ok"}'
    return state


def still_serving(previous: dict) -> None:
    assert unit_text() == previous["unit"]
    now = serving()
    assert now["health"] == '{"status":"ok"}'
    assert now["timings"]["draft_n"] > 0


def test_mismatched_drafter_is_refused_before_the_server_is_touched(faults_rig, previous, tmp_path):
    from rigkit.sandbox.tiny_gemma4 import write_pair

    _target, drafter = write_pair(tmp_path / "t.gguf", tmp_path / "wide-assistant.gguf", embedding_length_out=128)
    mismatch = f"{role_defaults('models')['models_dir']}/mismatch"
    assert in_rig(CONTAINER, "mkdir", "-p", mismatch).returncode == 0
    copied = subprocess.run(["docker", "cp", str(drafter), f"{CONTAINER}:{mismatch}/wide-assistant.gguf"], check=False)
    assert copied.returncode == 0
    done = provision_run(
        faults_rig,
        "-e",
        f"llama_server_drafter_path={mismatch}/wide-assistant.gguf",
        log="fault-mismatch",
    )
    assert done.returncode != 0
    (refused,) = done.tasks(RIG, "Check that the drafter pairs with the target and that the configuration fits")
    assert refused["status"] == "failed"
    assert "models_drafter" in refused["msg"] and "128" in refused["msg"] and "64" in refused["msg"]
    assert done.tasks(RIG, "Restart the server") == []
    still_serving(previous)


def test_context_that_cannot_fit_is_refused(faults_rig, previous):
    code, output = provision(faults_rig, "-e", "llama_server_memory_budget_mib=1", log="fault-memory")
    assert code != 0
    assert "llama_server_ctx_size" in output and "MiB" in output
    still_serving(previous)
    code, output = provision(faults_rig, "-e", "llama_server_ctx_size=1048576", log="fault-context")
    assert code != 0 and "llama_server_ctx_size" in output
    still_serving(previous)


def test_a_value_the_server_refuses_rolls_back_with_the_servers_own_words(faults_rig, previous):
    """An option the pinned server knows (so the controller lets it pass; an unknown one is refused before
    contact) with a value it refuses at start: the server's own words, and the last good unit serves again."""
    extra = '\'{"llama_server_extra_args": ["--reasoning-format", "bogus"]}\''
    code, output = provision(faults_rig, "-e", extra, log="fault-flag")
    assert code != 0
    assert "Unknown reasoning format: bogus" in output and "last working unit was restored" in output
    still_serving(previous)


def test_health_check_that_never_passes_rolls_back(faults_rig, previous):
    """A server that runs but never answers /health (every route moved under --api-prefix): rolled back."""
    extra = '\'{"llama_server_extra_args": ["--api-prefix", "/elsewhere"], "llama_server_health_timeout": 15}\''
    code, output = provision(faults_rig, "-e", extra, log="fault-health")
    assert code != 0
    assert "did not answer 200 within 15 s" in output and "last working unit was restored" in output
    still_serving(previous)
    assert in_rig(CONTAINER, "curl", "-sf", f"{URL}/elsewhere/health").returncode != 0


def test_gpu_rig_whose_server_runs_on_the_cpu_is_refused_and_rolled_back(faults_rig, previous):
    """The rig declared a GPU rig (llama_server_require_gpu, every layer asked of the GPU): its CPU build starts,
    answers /health and drafts, exactly what a CUDA build does when CUDA fails; the offload check refuses it naming the
    cause, and the last good unit serves again."""
    declared = {
        "llama_server_require_gpu": True,
        "llama_server_gpu_layers": "all",
        "llama_server_gpu_layers_draft": "all",
    }
    done = provision_run(faults_rig, "-e", f"'{json.dumps(declared)}'", log="fault-cpu-fallback")
    assert done.returncode != 0, done.tail(80)
    # the new server passes health and a drafting canary (load lines on: --verbosity 4); only the GPU check refuses it
    assert done.statuses(RIG, "Wait for health and a canary that drafts") == ["ok"]
    (refused,) = done.tasks(RIG, "Prove that both models run on the GPU")
    assert refused["status"] == "failed"
    assert "no CUDA device in the container" in refused["msg"], refused["msg"]
    assert "warning: no usable GPU found, --gpu-layers option will be ignored" in refused["msg"]
    assert "drafting on the GPU, so the last working unit was restored (serving again)" in done.output
    assert done.statuses(RIG, "Keep this unit as the last one that worked") == []
    still_serving(previous)


def test_killed_server_is_restarted_by_systemd(previous):
    def restarts() -> int:
        out = in_rig(CONTAINER, "systemctl", "show", UNIT, "--property=NRestarts").stdout
        return int(out.strip().split("=")[1])

    before = restarts()
    killed = in_rig(CONTAINER, "pkill", "--signal", "KILL", "--full", "/app/llama-server")
    assert killed.returncode == 0
    start = time.monotonic()
    while time.monotonic() - start < 10:
        if restarts() > before and serving()["health"] == '{"status":"ok"}':
            break
        time.sleep(0.5)
    elapsed = time.monotonic() - start
    assert restarts() > before
    assert serving()["health"] == '{"status":"ok"}', f"not serving {elapsed:.1f} s after the kill"
    assert elapsed < 10


def running_argv(container: str = CONTAINER) -> list[str]:
    """What the rig's server container runs now (its arguments), read from the rig's engine."""
    done = in_rig(container, "docker", "inspect", "--format", "{{json .Args}}", "rigkit-llama-main")
    return json.loads(done.stdout) if done.returncode == 0 else []


def draft_n_max(argv: list[str]) -> str | None:
    return argv[argv.index("--spec-draft-n-max") + 1] if "--spec-draft-n-max" in argv else None


def provision_killed_after(rig_env: dict[str, str], task: str, *extra: str) -> str:
    """`make provision` killed with SIGKILL (the whole process group) right after `task` printed its result."""
    argv = ["make", "--no-print-directory", "provision", f"host={RIG}", f"ARGS={' '.join(extra)}"]
    env = kit_env(**rig_env, PYTHONUNBUFFERED="1", ANSIBLE_FORCE_COLOR="0")
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    ) as proc:
        assert proc.stdout is not None
        seen, lines = False, []
        deadline = time.monotonic() + 900
        for line in proc.stdout:
            lines.append(line)
            if f"TASK [llama_server : {task}" in line:
                seen = True
            elif seen and line.startswith(("changed:", "ok:")):
                os.killpg(proc.pid, signal.SIGKILL)
                break
            if time.monotonic() > deadline:
                break
        else:
            pytest.fail(f"the run ended before {task!r} printed its result:\n{''.join(lines[-80:])}")
        proc.wait(timeout=60)
    return "".join(lines)


def _slug(task: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", task.lower()).strip("-")


# Right after each write of the rollout: the environment file (its configuration digest changes with the unit),
# the unit, the restart (no canary yet), and the first copy of the last-good pair (canary passed, nothing recorded).
ROLLOUT_WRITES = [
    "Write the environment file (root-only, may hold the API key)",
    "Write the unit",
    "Restart the server",
    "Keep this unit as the last one that worked",
]


@pytest.mark.parametrize("task", ROLLOUT_WRITES)
def test_a_provision_killed_mid_rollout_is_followed_by_one_that_converges_the_running_server(faults_rig, task):
    """Level-triggered: the next run compares what runs (the container's configuration, systemd's loaded unit, the
    configuration whose canary passed) with what should run, so a run killed after any write of the rollout (the
    server still runs the old setting, or runs the new one that no recorded canary proved) is followed by one that
    restarts and proves the server, and a third run changes nothing."""
    before = draft_n_max(running_argv())
    wanted = "2" if before != "2" else "1"
    change = f"-e llama_server_spec_draft_n_max={wanted}"
    killed = provision_killed_after(faults_rig, task, change)
    if task in ROLLOUT_WRITES[:2]:
        assert draft_n_max(running_argv()) == before, killed[-3000:]  # killed before the restart
    if task == "Write the unit":
        words = " ".join(unit_text().replace('"', "").replace("\\\n", " ").split())
        assert f"--spec-draft-n-max {wanted} " in words, words
    code, output = provision(faults_rig, change, log=f"after-kill-{_slug(task)}")
    assert code == 0, output[-6000:]
    assert draft_n_max(running_argv()) == wanted, output[-6000:]
    assert "Wait for health and a canary that drafts" in output
    code, output = provision(faults_rig, change, log=f"after-kill-noop-{_slug(task)}")
    assert code == 0 and recap(output)[RIG]["changed"] == 0, output[-6000:]


def test_after_the_killed_rollouts_the_inventorys_setting_converges_back(faults_rig):
    """Each killed rollout above left the rig on the other draft length it asked for; without -e the inventory's
    comes back and serves."""
    code, output = provision(faults_rig, log="after-kill-restore")
    assert code == 0, output[-6000:]
    assert draft_n_max(running_argv()) == str(SETTINGS["llama_server_spec_draft_n_max"])
    assert serving()["health"] == '{"status":"ok"}'
