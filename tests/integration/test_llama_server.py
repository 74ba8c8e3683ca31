"""The server on both sandbox profiles: the rig suite passes, a second converge changes nothing, and every
fault leaves the previous server answering."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from tests.support import Run, recap, rig_suite, run

MTP_RIG = "sandbox-mtp"
MTP_CONTAINER = "rigkit-sandbox-mtp"
MTP_UNIT = "rigkit-llama-main.service"
MTP_URL = "http://127.0.0.1:18081"


def in_rig(container: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "exec", container, *argv], capture_output=True, text=True, check=False)


def provision(host: str, *extra: str, log: str) -> tuple[int, str]:
    result = provision_run(host, *extra, log=log)
    return result.returncode, result.output


def provision_run(host: str, *extra: str, log: str) -> Run:
    """`make provision`, with the rigkit_results JSON to match task outcomes in."""
    argv = ["make", "--no-print-directory", "provision", f"host={host}", f"ARGS={' '.join(extra)}"]
    return run(argv, log_name=log, results=True)


@pytest.fixture(scope="module")
def mtp_rig(mtp_provisioned) -> str:
    return mtp_provisioned


def serving(container: str = MTP_CONTAINER, url: str = MTP_URL) -> dict:
    """What the rig's current server answers: health, and a completion's timings."""
    health = in_rig(container, "curl", "-sf", f"{url}/health")
    body = json.dumps({"prompt": "Hello", "n_predict": 8, "temperature": 0, "cache_prompt": False})
    answer = in_rig(container, "curl", "-sf", "-H", "Content-Type: application/json", "-d", body, f"{url}/completion")
    return {
        "health": health.stdout.strip(),
        "timings": json.loads(answer.stdout)["timings"] if answer.returncode == 0 else None,
    }


def unit_text(container: str = MTP_CONTAINER) -> str:
    return in_rig(container, "cat", f"/etc/systemd/system/{MTP_UNIT}").stdout


def test_gemma3_self_draft_profile_passes_the_rig_suite(sandbox_provisioned):
    assert "draft acceptance" in sandbox_provisioned
    suite = rig_suite("sandbox", log_name="rig-suite-sandbox")
    assert "test_llama_server::test_journal_shows_the_drafter_loaded" in suite.passed


def test_mtp_profile_passes_the_rig_suite(mtp_rig):
    assert "draft-mtp" in mtp_rig
    suite = rig_suite(MTP_RIG, log_name=f"rig-suite-{MTP_RIG}")
    assert "test_llama_server::test_completion_drafts_and_the_journal_reports_acceptance" in suite.passed


def test_mtp_profile_second_converge_changes_nothing(mtp_rig):
    code, output = provision(MTP_RIG, log="provision-sandbox-mtp-second")
    assert code == 0, output[-6000:]
    assert recap(output)[MTP_RIG]["changed"] == 0, output[-6000:]


@pytest.fixture
def previous(mtp_rig) -> dict:
    """The server as it answers before a bad change, and its unit file."""
    state = {"unit": unit_text(), "serving": serving()}
    assert state["serving"]["health"] == '{"status":"ok"}'
    return state


def still_serving(previous: dict) -> None:
    assert unit_text() == previous["unit"]
    now = serving()
    assert now["health"] == '{"status":"ok"}'
    assert now["timings"]["draft_n"] > 0


def test_mismatched_drafter_is_refused_before_the_server_is_touched(previous, tmp_path):
    from rigkit.sandbox.tiny_gemma4 import write_pair

    _target, drafter = write_pair(tmp_path / "t.gguf", tmp_path / "wide-assistant.gguf", embedding_length_out=128)
    assert in_rig(MTP_CONTAINER, "mkdir", "-p", "/var/lib/rigkit/models/mismatch").returncode == 0
    copied = subprocess.run(
        ["docker", "cp", str(drafter), f"{MTP_CONTAINER}:/var/lib/rigkit/models/mismatch/wide-assistant.gguf"],
        check=False,
    )
    assert copied.returncode == 0
    done = provision_run(
        MTP_RIG,
        "-e",
        "llama_server_drafter_path=/var/lib/rigkit/models/mismatch/wide-assistant.gguf",
        log="fault-mismatch",
    )
    assert done.returncode != 0
    (refused,) = done.tasks(MTP_RIG, "Check that the drafter pairs with the target and that the configuration fits")
    assert refused["status"] == "failed"
    assert "models_drafter" in refused["msg"] and "128" in refused["msg"] and "64" in refused["msg"]
    assert done.tasks(MTP_RIG, "Restart the server") == []
    still_serving(previous)


def test_context_that_cannot_fit_is_refused(previous):
    code, output = provision(MTP_RIG, "-e", "llama_server_memory_budget_mib=1", log="fault-memory")
    assert code != 0
    assert "llama_server_ctx_size" in output and "MiB" in output
    still_serving(previous)
    code, output = provision(MTP_RIG, "-e", "llama_server_ctx_size=1048576", log="fault-context")
    assert code != 0 and "llama_server_ctx_size" in output
    still_serving(previous)


def test_unknown_flag_rolls_back_with_the_servers_own_words(previous):
    code, output = provision(MTP_RIG, "-e", '\'{"llama_server_extra_args": ["--no-such-flag"]}\'', log="fault-flag")
    assert code != 0
    assert "--no-such-flag" in output and "last working unit was restored" in output
    still_serving(previous)


def test_health_check_that_never_passes_rolls_back(previous):
    """A server that runs but never answers /health (every route moved under --api-prefix): rolled back."""
    extra = '\'{"llama_server_extra_args": ["--api-prefix", "/elsewhere"], "llama_server_health_timeout": 15}\''
    code, output = provision(MTP_RIG, "-e", extra, log="fault-health")
    assert code != 0
    assert "did not answer 200 within 15 s" in output and "last working unit was restored" in output
    still_serving(previous)
    assert in_rig(MTP_CONTAINER, "curl", "-sf", f"{MTP_URL}/elsewhere/health").returncode != 0


def test_gpu_rig_whose_server_runs_on_the_cpu_is_refused_and_rolled_back(previous):
    """sandbox-mtp declared a GPU rig (llama_server_require_gpu, every layer asked of the GPU): its CPU build starts,
    answers /health and drafts, exactly what a CUDA build does when CUDA fails; the offload check refuses it naming the
    cause, and the last good unit serves again."""
    declared = {
        "llama_server_require_gpu": True,
        "llama_server_gpu_layers": "all",
        "llama_server_gpu_layers_draft": "all",
    }
    done = provision_run(MTP_RIG, "-e", f"'{json.dumps(declared)}'", log="fault-cpu-fallback")
    assert done.returncode != 0, done.tail(80)
    # the new server passes health and a drafting canary (load lines on: --verbosity 4); only the GPU check refuses it
    assert done.statuses(MTP_RIG, "Wait for health and a canary that drafts") == ["ok"]
    (refused,) = done.tasks(MTP_RIG, "Prove that both models run on the GPU")
    assert refused["status"] == "failed"
    assert "no CUDA device in the container" in refused["msg"], refused["msg"]
    assert "warning: no usable GPU found, --gpu-layers option will be ignored" in refused["msg"]
    assert "drafting on the GPU, so the last working unit was restored (serving again)" in done.output
    assert done.statuses(MTP_RIG, "Keep this unit as the last one that worked") == []
    still_serving(previous)


def test_killed_server_is_restarted_by_systemd(previous):
    def restarts() -> int:
        out = in_rig(MTP_CONTAINER, "systemctl", "show", MTP_UNIT, "--property=NRestarts").stdout
        return int(out.strip().split("=")[1])

    before = restarts()
    killed = in_rig(MTP_CONTAINER, "pkill", "--signal", "KILL", "--full", "/app/llama-server")
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


def running_argv(container: str = MTP_CONTAINER) -> list[str]:
    """What the rig's server container runs now (its arguments), read from the rig's engine."""
    done = in_rig(container, "docker", "inspect", "--format", "{{json .Args}}", "rigkit-llama-main")
    return json.loads(done.stdout) if done.returncode == 0 else []


def draft_n_max(argv: list[str]) -> str | None:
    return argv[argv.index("--spec-draft-n-max") + 1] if "--spec-draft-n-max" in argv else None


def provision_killed_after(host: str, task: str, *extra: str) -> str:
    """`make provision` killed with SIGKILL (the whole process group) right after `task` printed its result."""
    argv = ["make", "--no-print-directory", "provision", f"host={host}", f"ARGS={' '.join(extra)}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "ANSIBLE_FORCE_COLOR": "0"}
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
def test_a_provision_killed_mid_rollout_is_followed_by_one_that_converges_the_running_server(mtp_rig, task):
    """Level-triggered: the next run compares what runs (the container's configuration, systemd's loaded unit, the
    configuration whose canary passed) with what should run, so a run killed after any write of the rollout (the
    server still runs the old setting, or runs the new one that no recorded canary proved) is followed by one that
    restarts and proves the server, and a third run changes nothing."""
    before = draft_n_max(running_argv())
    wanted = "2" if before != "2" else "1"
    change = f"-e llama_server_spec_draft_n_max={wanted}"
    killed = provision_killed_after(MTP_RIG, task, change)
    if task in ROLLOUT_WRITES[:2]:
        assert draft_n_max(running_argv()) == before, killed[-3000:]  # killed before the restart
    if task == "Write the unit":
        words = " ".join(unit_text().replace('"', "").replace("\\\n", " ").split())
        assert f"--spec-draft-n-max {wanted} " in words, words
    try:
        code, output = provision(MTP_RIG, change, log=f"after-kill-{_slug(task)}")
        assert code == 0, output[-6000:]
        assert draft_n_max(running_argv()) == wanted, output[-6000:]
        assert "Wait for health and a canary that drafts" in output
        code, output = provision(MTP_RIG, change, log=f"after-kill-noop-{_slug(task)}")
        assert code == 0 and recap(output)[MTP_RIG]["changed"] == 0, output[-6000:]
    finally:
        code, output = provision(MTP_RIG, log=f"after-kill-restore-{_slug(task)}")
        assert code == 0, output[-6000:]
    assert draft_n_max(running_argv()) == before
