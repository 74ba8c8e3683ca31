"""Proof, on the rig, that llama-server runs the pinned target with its drafter and reports acceptance."""

from __future__ import annotations

import json
import re
import time

from ansible.module_utils.gpu_offload import NO_DEVICE, check

from rigkit.fleet.gateway import alias_of
from tests.support import model_catalog, not_applicable, role_defaults

IMAGE_DEFAULTS = role_defaults("llamacpp_image")
CATALOG = model_catalog()

ACCEPTANCE_RE = re.compile(r"draft acceptance = ([0-9.]+) \(\s*(\d+) accepted /\s*(\d+) generated\)")


def test_unit_enabled_and_active(rig):
    service = rig.host.service(rig.unit)
    assert service.is_enabled
    assert service.is_running


def test_listens_on_the_configured_address_only(rig):
    port = rig.settings["llama_server_port"]
    listening = [s for s in rig.host.socket.get_listening_sockets() if s.endswith(f":{port}")]
    assert listening == [f"tcp://{rig.settings['llama_server_host']}:{port}"]


def test_health_ok(rig):
    assert rig.call("/health") == {"status": "ok"}


def test_web_pages_from_elsewhere_cannot_read_the_server(rig):
    """llama.cpp's CORS default lets any page a browser on the rig opens read a keyless loopback server."""
    origins = rig.settings["llama_server_cors_origins"]
    if origins == "*":
        assert rig.allowed_origin("https://evil.example") == "*"
        return
    assert rig.allowed_origin("https://evil.example") == "-"
    if origins == "localhost":
        assert rig.allowed_origin("http://localhost:3000") == "http://localhost:3000"


def needs_drafter(rig) -> None:
    """A rig served without speculative decoding has no drafter to check: say so in the results."""
    if rig.settings["llama_server_spec_type"] == "none":
        not_applicable(f"{rig.host.backend.hostname} serves without a drafter (llama_server_spec_type: none)")


def test_runs_the_pinned_target(rig):
    path = rig.arg("--model")
    digest = rig.host.check_output(f"sha256sum {path}").split()[0]
    assert digest == CATALOG[rig.hostvars["models_target"]]["sha256"], path


def test_runs_the_pinned_drafter(rig):
    needs_drafter(rig)
    path = rig.arg("--model-draft")
    digest = rig.host.check_output(f"sha256sum {path}").split()[0]
    assert digest == CATALOG[rig.hostvars["models_drafter"]]["sha256"], path


def test_journal_shows_the_drafter_loaded(rig):
    needs_drafter(rig)
    assert f"loading draft model '{rig.arg('--model-draft')}'" in rig.journal()


def test_the_server_answers_to_its_catalog_alias(rig):
    """/v1/models names the model as clients and the fleet gateway ask for it (the catalog's alias), not by path."""
    alias = alias_of(CATALOG, rig.hostvars["models_target"])
    assert rig.arg("--alias") == alias
    assert [model["id"] for model in rig.call("/v1/models")["data"]] == [alias]


def test_process_settings_equal_host_variables(rig):
    assert rig.arg("--ctx-size") == str(rig.settings["llama_server_ctx_size"])
    assert rig.arg("--spec-type") == rig.settings["llama_server_spec_type"]
    assert rig.arg("--spec-draft-n-max") == str(rig.settings["llama_server_spec_draft_n_max"])
    assert rig.arg("--parallel") == str(rig.settings["llama_server_parallel"])


def test_slots_report_speculative(rig):
    needs_drafter(rig)
    slots = rig.call("/slots")
    assert slots and all(slot["speculative"] for slot in slots)


def test_completion_drafts_and_the_journal_reports_acceptance(rig):
    needs_drafter(rig)
    before = len(ACCEPTANCE_RE.findall(rig.journal()))
    answer = rig.complete(f"Write a Python function that adds two numbers. ({time.time()})")
    timings = answer["timings"]
    assert timings["draft_n"] > 0
    assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
    for _ in range(20):  # journald may lag the response by a moment
        reported = ACCEPTANCE_RE.findall(rig.journal())
        if len(reported) > before:
            break
        time.sleep(0.5)
    assert len(reported) > before
    minimum = rig.hostvars.get("rig_expected_min_acceptance")
    if minimum is not None:
        assert timings["draft_n_accepted"] / timings["draft_n"] >= minimum, timings


def test_metrics_count_drafted_tokens(rig):
    needs_drafter(rig)
    name = "llamacpp:spec_decode_num_draft_tokens_total"

    def drafted() -> float:
        for line in rig.call("/metrics", raw=True).splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"{name} missing from /metrics")

    first = drafted()
    rig.complete("List three prime numbers:")
    assert drafted() > first


def test_server_runs_where_the_inventory_says(rig):
    """A rig meant to serve from its GPU (llama_server_require_gpu) shows both models there in the load log of the
    server's current run and its process in nvidia-smi: the rollout's own check (module_utils/gpu_offload.py). A CPU
    rig's server is on the CPU, and the same check says so (its real log is what a CPU fallback prints)."""
    drafter = rig.settings["llama_server_spec_type"] != "none"
    log = rig.current_run_log()
    if not rig.require_gpu:
        verdict = check(log, drafter=drafter, gpu_layers="all", gpu_layers_draft="all")
        assert not verdict.on_gpu and verdict.cause == NO_DEVICE, verdict.message
        return
    apps = rig.host.run("nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits")
    assert apps.rc == 0, f"nvidia-smi failed on a GPU rig: {apps.stderr}"
    verdict = check(
        log,
        drafter=drafter,
        gpu_layers=rig.settings["llama_server_gpu_layers"],
        gpu_layers_draft=rig.settings["llama_server_gpu_layers_draft"],
        compute_apps=apps.stdout,
        pid=rig.container_pid(),
    )
    assert verdict.on_gpu, verdict.message


def test_container_runs_least_privileged(rig):
    inspect = json.loads(rig.host.check_output(f"docker inspect {rig.container}"))[0]
    config, host_config = inspect["Config"], inspect["HostConfig"]
    assert config["User"] == "10001:10001"
    assert host_config["ReadonlyRootfs"] is True
    assert host_config["CapDrop"] == ["ALL"]
    assert "no-new-privileges" in host_config["SecurityOpt"]
    assert host_config["Privileged"] is False
    mounts = {mount["Destination"]: mount for mount in inspect["Mounts"]}
    models = rig.settings["llama_server_models_dir"]
    models = models if "{{" not in models else rig.hostvars.get("models_dir", role_defaults("models")["models_dir"])
    assert mounts[models]["RW"] is False


def test_secrets_file_is_root_only(rig):
    env = rig.host.file(f"/etc/rigkit/llama-{rig.settings['llama_server_instance']}.env")
    assert (env.user, env.group, env.mode) == ("root", "root", 0o600)
    unit = rig.host.file(f"/etc/systemd/system/{rig.unit}").content_string
    assert "LLAMA_API_KEY" not in unit and "--api-key" not in unit


def test_image_reports_the_pinned_commit(rig):
    commit = rig.hostvars.get("llamacpp_image_commit", IMAGE_DEFAULTS["llamacpp_image_commit"])
    build = rig.hostvars.get("llamacpp_image_build_number", IMAGE_DEFAULTS["llamacpp_image_build_number"])
    assert rig.call("/props")["build_info"] == f"b{build}-{commit[:7]}"


def test_models_are_read_only_for_the_server(rig):
    path = rig.arg("--model")
    model = rig.host.file(path)
    assert model.user == "root" and model.mode & 0o022 == 0
    assert rig.host.file(path.rsplit("/", 1)[0]).mode & 0o022 == 0


def test_serves_tls_off_the_loopback_with_a_private_key(rig):
    """Off loopback the server speaks TLS (rig.call verifies it against the rig's certificate); the key is for the
    container's group only, and the unit passes file paths, never contents."""
    if not rig.tls:
        assert "--ssl-cert-file" not in rig.server_args()
        return
    assert rig.url.startswith("https://")
    key_path = rig.arg("--ssl-key-file")
    assert rig.arg("--ssl-cert-file") == rig.ca_file
    key = rig.host.file(key_path)
    assert (key.mode, key.user, key.gid) == (0o640, "root", 10001)
    assert "PRIVATE KEY" not in rig.host.file(f"/etc/systemd/system/{rig.unit}").content_string
