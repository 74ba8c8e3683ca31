"""The llama-server container's limits: --memory derived from the preflight's estimate (or
set, and then refused when below it), --pids-limit and rotated logs, from role-prefixed host variables, checked
on the controller and rendered into the unit's ExecStart. Real GGUF files throughout (the sandbox rigs' own
models), the real Ansible module, the role's real template."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.module_utils.gguf_metadata import read_gguf_metadata
from ansible.module_utils.preflight.memory import memory_headroom_mib
from ansible.module_utils.preflight.server import (
    MIB,
    check_container_memory,
    container_memory_limit_mib,
    estimate_memory,
    host_memory_estimate,
)

from rigkit.paths import cached_model_path
from tests import support
from tests.support import REPO, exec_start_argv, model_catalog, render_server_files, unavailable

HOST_VARS = REPO / "inventory" / "host_vars"


def sandbox_settings(host: str) -> dict[str, Any]:
    """The estimate_memory settings of one of the kit's sandbox rigs, from its host_vars and the role defaults."""
    values = yaml.safe_load((HOST_VARS / f"{host}.yml").read_text())
    return {
        "ctx_size": values["llama_server_ctx_size"],
        "flash_attn": values["llama_server_flash_attn"],
        "gpu_layers": values["llama_server_gpu_layers"],
        "gpu_layers_draft": values["llama_server_gpu_layers_draft"],
        "headroom_mib": memory_headroom_mib("auto", on_gpu=False),  # the role's default on a CPU rig (gpu_access none)
    }


# --- the derivation ---------------------------------------------------------------------------------------
def test_sandbox_rig_derived_limit_covers_its_estimate(gemma3_270m_gguf: Path) -> None:
    """The default sandbox rig (Gemma 3 270M drafting for itself, CPU, 2k context) gets a limit above its need."""
    meta = read_gguf_metadata(gemma3_270m_gguf)
    estimate = estimate_memory(meta, meta, **sandbox_settings("sandbox"))
    assert estimate.device == "host"
    limit = container_memory_limit_mib(estimate, margin_mib=1024, floor_mib=1024)
    need_mib = estimate.total / MIB
    print(f"sandbox: host estimate {need_mib:.0f} MiB ({estimate.breakdown}) -> --memory {limit}m")
    assert limit % 256 == 0
    assert need_mib + 1024 <= limit < need_mib + 1024 + 256
    assert check_container_memory(estimate, limit) == []
    # the weights alone (two copies of the 241 MiB file) are most of it: the limit is not a guess
    assert estimate.weights > 2 * 200 * MIB


def test_sandbox_mtp_rig_gets_the_floor(tiny_gemma4_pair: tuple[Path, Path]) -> None:
    target, drafter = (read_gguf_metadata(path) for path in tiny_gemma4_pair)
    estimate = estimate_memory(target, drafter, **sandbox_settings("sandbox-mtp"))
    derived = container_memory_limit_mib(estimate, margin_mib=0, floor_mib=1024)
    print(f"sandbox-mtp: host estimate {estimate.total / MIB:.1f} MiB -> --memory {derived}m")
    assert estimate.total < 512 * MIB and derived == 1024  # tiny: the floor decides
    assert container_memory_limit_mib(estimate, margin_mib=1024, floor_mib=1024) == 1536  # 269 + 1024, rounded up


def test_a_gpu_configuration_is_limited_by_its_host_side_upper_bound(gemma3_270m_gguf: Path) -> None:
    """On a GPU rig the estimate counts VRAM; the container's RAM limit uses the same model with nothing offloaded."""
    meta = read_gguf_metadata(gemma3_270m_gguf)
    gpu = estimate_memory(meta, None, ctx_size=2048, gpu_layers="all", headroom_mib=512, flash_attn="on")
    assert gpu.device == "gpu"
    host = host_memory_estimate(gpu)
    assert host.device == "host" and host.total >= gpu.total  # everything the GPU would hold, on the host
    partial = estimate_memory(meta, None, ctx_size=2048, gpu_layers=6, headroom_mib=512, flash_attn="on")
    assert host_memory_estimate(partial).total > partial.total  # what stayed on the host counts too
    limit = container_memory_limit_mib(gpu, margin_mib=2048, floor_mib=1024)
    assert limit * MIB >= host.total + 2048 * MIB


def test_a_limit_below_the_estimate_is_refused_with_the_numbers(gemma3_270m_gguf: Path) -> None:
    meta = read_gguf_metadata(gemma3_270m_gguf)
    estimate = estimate_memory(meta, meta, **sandbox_settings("sandbox"))
    (problem,) = check_container_memory(estimate, 300)
    assert problem.startswith("llama_server_container_memory_mib is 300 MiB but the server may hold about ")
    assert "target weights" in problem and "set it to auto" in problem


# --- the on-rig module ------------------------------------------------------------------------------------
def run_preflight(args: dict[str, Any]) -> dict[str, Any]:
    return support.run_module("llama_server_preflight", args)[0]


def test_module_derives_the_limit_and_refuses_one_too_small(tiny_gemma4_pair: tuple[Path, Path]) -> None:
    target, drafter = tiny_gemma4_pair
    base = {
        "target": str(target),
        "drafter": str(drafter),
        "spec_type": "draft-mtp",
        "ctx_size": 1024,
        "gpu_layers": 0,
        "gpu_layers_draft": 0,
        "flash_attn": "off",
        "memory_budget_mib": 8192,
        "headroom_mib": 256,
    }
    derived = run_preflight(base)
    assert not derived.get("failed"), derived.get("msg")
    assert derived["container_memory_mib"] == 1536 and 256 < derived["host_memory_mib"] < 512
    explicit = run_preflight({**base, "container_memory_mib": 4096})
    assert explicit["container_memory_mib"] == 4096
    small = run_preflight({**base, "container_memory_mib": 200})
    assert small["failed"] and "llama_server_container_memory_mib is 200 MiB" in small["msg"]
    word = run_preflight({**base, "container_memory_mib": "lots"})
    assert word["failed"] and "llama_server_container_memory_mib is 'lots'" in word["msg"]


# --- controller validation --------------------------------------------------------------------------------
BAD_LIMITS: list[tuple[dict[str, Any], str]] = [
    ({"llama_server_container_memory_mib": "lots"}, 'llama_server_container_memory_mib is "lots"; expected auto'),
    ({"llama_server_container_memory_mib": 100}, "llama_server_container_memory_mib is 100; expected auto"),
    ({"llama_server_container_pids_limit": 10}, "llama_server_container_pids_limit is 10; expected 64 or more"),
    ({"llama_server_container_log_driver": "syslog"}, 'llama_server_container_log_driver is "syslog"; expected one of'),
    ({"llama_server_container_log_max_size": "10 MB"}, 'llama_server_container_log_max_size is "10 MB"; expected a'),
    ({"llama_server_container_log_max_file": 0}, "llama_server_container_log_max_file is 0; expected 1-999"),
    ({"llama_server_container_memory_margin_mib": -1}, "llama_server_container_memory_margin_mib is -1; expected an"),
]


@pytest.mark.parametrize(
    ("extra", "expected"), BAD_LIMITS, ids=[f"{next(iter(e))}-{i}" for i, (e, _) in enumerate(BAD_LIMITS)]
)
def test_controller_refuses_bad_limits_naming_file_variable_and_value(
    extra: dict[str, Any], expected: str, tmp_path: Path
) -> None:
    from rigkit.inventory_files import Sources
    from rigkit.validation.rules import load_specs, rig_problems

    values = {"rig_kind": "sandbox", **yaml.safe_load((HOST_VARS / "sandbox-mtp.yml").read_text())}
    host_file = tmp_path / "host_vars" / "limits.yml"
    host_file.parent.mkdir()
    host_file.write_text(yaml.safe_dump({**values, **extra}))
    sources = Sources(str(tmp_path), "limits", ["sandbox_rigs", "rigs"])
    specs = load_specs(str(REPO / "roles"))
    assert rig_problems("limits", values, specs=specs, sources=sources, catalog={}) == []
    problems = rig_problems("limits", {**values, **extra}, specs=specs, sources=sources, catalog={})
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{host_file}: {expected}"), problems


def test_controller_preflight_refuses_a_limit_below_the_estimate(gemma3_270m_gguf: Path, tmp_path: Path) -> None:
    from rigkit.inventory_files import Sources
    from rigkit.validation.preflight import controller_preflight

    catalog = model_catalog()
    entry = catalog["gemma-3-270m-it-q4_k_m"]
    cached = Path(str(cached_model_path(tmp_path, entry)))
    cached.parent.mkdir(parents=True)
    cached.symlink_to(gemma3_270m_gguf)
    values = {"rig_kind": "sandbox", "llama_server_gpu_access": "none"}
    values.update(yaml.safe_load((HOST_VARS / "sandbox.yml").read_text()))
    sources = Sources(str(REPO / "inventory"), "sandbox", ["sandbox_rigs", "rigs"])
    run = {"sources": sources, "catalog": catalog, "cache_dir": str(tmp_path)}
    assert controller_preflight("sandbox", values, **run) == []
    problems = controller_preflight("sandbox", {**values, "llama_server_container_memory_mib": 512}, **run)
    assert len(problems) == 1 and "llama_server_container_memory_mib is 512 MiB" in problems[0], problems
    assert problems[0].startswith("--extra-vars or a role default: ")  # set in no inventory file: said so


# --- rendering ----------------------------------------------------------------------------------------------
HOSTS: dict[str, dict[str, Any]] = {
    "derived": {"llama_server_gpu_access": "none"},
    "explicit": {
        "llama_server_gpu_access": "none",
        "llama_server_container_memory_mib": 6144,
        "llama_server_container_pids_limit": 512,
        "llama_server_container_log_driver": "journald",
    },
    "pids_text": {"llama_server_gpu_access": "none", "llama_server_container_pids_limit": "1024\nUser=root"},
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory, tiny_gemma4_pair: tuple[Path, Path]) -> tuple[Path, dict]:
    target, drafter = tiny_gemma4_pair
    extra = {
        "render_preflight": True,
        "render_target_path": str(target),
        "render_drafter_path": str(drafter),
        "llama_server_ctx_size": 1024,
        "llama_server_flash_attn": "off",
        "llama_server_memory_budget_mib": 8192,
        "llama_server_models_dir": str(target.parent),
    }
    return render_server_files(tmp_path_factory.mktemp("render-limits"), HOSTS, extra)


def option(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == name]


def test_derived_limits_in_the_unit(rendered: tuple[Path, dict]) -> None:
    out, _ = rendered
    argv = exec_start_argv((out / "derived.service").read_text())
    assert argv[:4] == ["/usr/bin/docker", "run", "--rm", "--name"]
    assert option(argv, "--memory") == ["1536m"]  # the tiny pair's estimate (269 MiB) + 1024, rounded up (CPU rig)
    assert option(argv, "--pids-limit") == ["1024"]
    assert option(argv, "--log-driver") == ["json-file"]
    assert option(argv, "--log-opt") == ["max-size=10m", "max-file=3"]
    image = argv.index("rigkit/llama-server:example")
    assert argv.index("--memory") < image  # docker's options, not llama-server's


def test_explicit_limits_and_journald_in_the_unit(rendered: tuple[Path, dict]) -> None:
    out, _ = rendered
    argv = exec_start_argv((out / "explicit.service").read_text())
    assert option(argv, "--memory") == ["6144m"]
    assert option(argv, "--pids-limit") == ["512"]
    assert option(argv, "--log-driver") == ["journald"] and option(argv, "--log-opt") == []


def test_a_malformed_limit_is_refused_before_rendering(rendered: tuple[Path, dict]) -> None:
    out, result = rendered
    messages = [
        outcome.get("msg", "")
        for task in result["plays"][0]["tasks"]
        for host, outcome in task["hosts"].items()
        if host == "pids_text" and outcome.get("failed")
    ]
    assert messages and "llama_server_container_pids_limit" in messages[0]
    assert not (out / "pids_text.service").exists()


HARDENING = {
    "RestrictAddressFamilies": "AF_UNIX",
    "CapabilityBoundingSet": "",
    "PrivateDevices": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectClock": "yes",
    "SystemCallFilter": "@system-service",
    "LockPersonality": "yes",
    "RestrictNamespaces": "yes",
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
}


def test_the_unit_confines_the_docker_cli_and_systemd_accepts_it(rendered: tuple[Path, dict], tmp_path: Path) -> None:
    out, _ = rendered
    unit = (out / "derived.service").read_text()
    settings = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith(("#", " ")))
    for key, value in HARDENING.items():
        assert settings.get(key) == value, key
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        unavailable("systemd-analyze is not installed (apt-get install systemd)")
    # systemd-analyze verify checks every setting's syntax and that the executables exist (/usr/bin/docker).
    if not Path("/usr/bin/docker").exists():
        unavailable("/usr/bin/docker is not on this machine: systemd-analyze verify would only report that")
    path = tmp_path / "rigkit-llama-main.service"
    path.write_text(unit.replace("Requires=docker.service", "").replace("After=docker.service", "After="))
    done = subprocess.run(
        [analyze, "verify", "--man=no", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    problems = [line for line in done.stderr.splitlines() if "rigkit-llama-main.service" in line]
    assert done.returncode == 0 and not problems, done.stderr
