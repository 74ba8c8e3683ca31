"""Render and input checks match the whole value: ``re.match`` with a pattern ending in ``$``
accepts a trailing newline ("$" matches before it), which then lands in a file, a unit or an argv."""

from __future__ import annotations

import re
from typing import Any

import pytest
from ansible.module_utils import nvidia_compat
from ansible.module_utils.model_catalog import REPO_RE, REVISION_RE, catalog_problems, entry_problems
from ansible.module_utils.nft_allowlist import AllowListError, table_name

from rigkit.cli import discover
from rigkit.mirror.files import url_parts
from rigkit.pinning import hf_api
from rigkit.validation import variables as rig_variables
from rigkit.validation.rules import Report, _check_container_limits, _check_image_inputs, _check_rig_gpu, _check_rules

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SHA = "ab" * 32


class _Sources:
    def file_of(self, variable: str, value: Any = None) -> str:
        return "inventory/host_vars/rig.yml"


def _report() -> Report:
    return Report(_Sources())


@pytest.mark.parametrize(
    "pattern",
    [
        rig_variables.COMPUTE_CAPABILITY_RE,
        rig_variables.COMMIT_RE,
        rig_variables.SHA256_RE,
        rig_variables.CUDA_ARCHITECTURES_RE,
        nvidia_compat.DRIVER_VERSION_RE,
        rig_variables.LOG_SIZE_RE,
        hf_api.SHA256_RE,
        REVISION_RE,
        REPO_RE,
        discover.HOST_NAME_RE,
        discover.ADDRESS_RE,
    ],
)
def test_no_whole_value_pattern_lets_a_trailing_newline_through(pattern: re.Pattern[str]) -> None:
    """Even a caller that uses .match gets the whole value: the patterns end in \\Z, not $."""
    assert not pattern.pattern.endswith("$"), pattern.pattern


@pytest.mark.parametrize(
    ("values", "variable"),
    [
        ({"llamacpp_image_commit": COMMIT + "\n"}, "llamacpp_image_commit"),
        (
            {"llamacpp_image_source": "tarball", "llamacpp_image_source_sha256": SHA + "\n"},
            "llamacpp_image_source_sha256",
        ),
        ({"llamacpp_image_cuda_architectures": "86-real\n"}, "llamacpp_image_cuda_architectures"),
    ],
)
def test_image_inputs_with_a_trailing_newline_are_refused(values: dict[str, Any], variable: str) -> None:
    report = _report()
    _check_image_inputs(report, values)
    assert any(variable in problem for problem in report.problems), report.problems


def test_a_compute_capability_with_a_trailing_newline_is_refused() -> None:
    report = _report()
    _check_rig_gpu(report, {"vram_mib": 8192, "compute_capability": "8.6\n"})
    assert any("compute_capability" in problem for problem in report.problems)


def test_a_log_size_with_a_trailing_newline_is_refused() -> None:
    report = _report()
    _check_container_limits(report, {"llama_server_container_log_max_size": "10m\n"})
    assert any("llama_server_container_log_max_size" in problem for problem in report.problems)


def test_a_driver_version_with_a_trailing_newline_is_refused() -> None:
    report = _report()
    _check_rules(report, "rig", {"nvidia_driver_version": "535.261.03\n"}, {})
    assert any("nvidia_driver_version" in problem for problem in report.problems)


def test_the_well_formed_values_still_pass() -> None:
    report = _report()
    _check_image_inputs(report, {"llamacpp_image_commit": COMMIT, "llamacpp_image_cuda_architectures": "86-real"})
    _check_rig_gpu(report, {"vram_mib": 8192, "compute_capability": "8.6"})
    _check_container_limits(report, {"llama_server_container_log_max_size": "10m"})
    assert report.problems == []


@pytest.mark.parametrize(
    ("field", "value"), [("repo", "owner/name\n"), ("sha256", SHA + "\n"), ("revision", COMMIT + "\n")]
)
def test_catalog_fields_with_a_trailing_newline_are_refused(field: str, value: str) -> None:
    entry = {"repo": "owner/name", "filename": "m.gguf", "role": "target", "architecture": "gemma3"}
    entry[field] = value
    assert any(field in problem for problem in entry_problems("m", entry))


def test_a_catalog_name_with_a_trailing_newline_is_refused() -> None:
    problems = catalog_problems({"m\n": {"repo": "owner/name", "filename": "m.gguf"}})
    assert any("entry names use" in problem for problem in problems)


def test_an_instance_name_with_a_trailing_newline_makes_no_nft_table() -> None:
    assert table_name("default") == "rigkit_llama_default"
    with pytest.raises(AllowListError):
        table_name("default\n")


def test_the_mirror_refuses_a_path_with_a_trailing_newline() -> None:
    assert url_parts("/owner/repo/resolve/main/x.gguf") is not None
    assert url_parts("/owner/repo/resolve/main/x.gguf\n") is None
    assert url_parts("/owner/repo/resolve/main/x.gguf%0A") is None


@pytest.mark.parametrize("name", ["rig\n", "rig\nx"])
def test_discover_refuses_a_host_name_with_a_newline(name: str) -> None:
    assert discover.HOST_NAME_RE.match(name) is None and discover.HOST_NAME_RE.fullmatch(name) is None
