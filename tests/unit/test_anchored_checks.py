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


# ------------------------------------------------------------------------------- the YAML checks and the API keys
# A Jinja `match`/`regex`/`search` test whose pattern ends in `$` lets a value ending in a newline through.
YAML_CHECK_RE = re.compile(r"""\b(?:match|regex|search)\(\s*(['"])(?P<pattern>.*?)\1""")
# Checks in files another change owns (their proof receipts hash them); each is a known, listed exception.
FROZEN = {
    "roles/cuda/tasks/plan.yml": ["^[0-9]+\\.[0-9]+$"],
}


def _unanchored_yaml_checks() -> dict[str, list[str]]:
    from rigkit import REPO

    found: dict[str, list[str]] = {}
    for path in sorted([*REPO.glob("roles/**/*.yml"), *REPO.glob("playbooks/**/*.yml")]):
        for match in YAML_CHECK_RE.finditer(path.read_text(encoding="utf-8")):
            # (?m): a search for one line of a command's output, where `$` is that line's end by design
            if match["pattern"].endswith("$") and not match["pattern"].startswith("(?m)"):
                found.setdefault(str(path.relative_to(REPO)), []).append(match["pattern"])
    return found


def test_no_yaml_check_ends_its_pattern_in_a_dollar() -> None:
    """Every match/regex/search check of the roles and playbooks ends in \\Z (or moved into the Python rules)."""
    assert _unanchored_yaml_checks() == FROZEN


def test_the_scan_finds_a_dollar_check() -> None:
    assert YAML_CHECK_RE.search("x is match('^[a-z]+$')")["pattern"] == "^[a-z]+$"
    assert YAML_CHECK_RE.search('x is regex("^[a-z]+\\Z")')["pattern"] == "^[a-z]+\\Z"


@pytest.mark.parametrize("key", ["k" * 32 + "\n", "k" * 32 + "\nclient", "k" * 15, "k" * 257, "two words " * 3])
def test_a_rig_api_key_of_another_shape_is_refused_without_showing_it(key: str) -> None:
    """A rig's key goes into its env file and the gateway's key map: 16 to 256 printable characters, nothing else."""
    report = _report()
    _check_rules(report, "rig", {"llama_server_api_key": key, "llama_server_host": "192.0.2.7"}, {})
    problems = [problem for problem in report.problems if "llama_server_api_key is" in problem]
    assert len(problems) == 1, report.problems
    assert key.strip() not in problems[0] and "16 to 256 printable" in problems[0]


def test_a_well_formed_rig_api_key_passes() -> None:
    report = _report()
    _check_rules(report, "rig", {"llama_server_api_key": "k" * 24 + "-_.~+/=!", "llama_server_host": "192.0.2.7"}, {})
    assert report.problems == []


@pytest.mark.parametrize("variable", ["llama_server_api_key", "fleet_gateway_api_key"])
def test_an_api_key_starting_with_a_hash_is_refused(variable: str) -> None:
    """The gateway's client key file is an HAProxy pattern file, where a line starting with # is a comment: such a
    key would be dropped from it without a word."""
    report = _report()
    _check_rules(report, "rig", {variable: "#" + "k" * 31, "llama_server_host": "192.0.2.7"}, {})
    assert any(f"{variable} is" in problem for problem in report.problems), report.problems
