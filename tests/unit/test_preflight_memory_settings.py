"""The preflight's memory budget and headroom: auto or MiB, one rule (module_utils/preflight/memory.py) that the
llama_server role's filters, the controller preflight, the validation and make discover all apply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible.module_utils.preflight.memory import (
    AUTO_HEADROOM_MIB,
    BUDGET_VARIABLE,
    HEADROOM_VARIABLE,
    MemorySettingError,
    memory_budget_mib,
    memory_headroom_mib,
)
from ansible.module_utils.preflight.server import MIB, PreflightError, preflight

from rigkit.discovery.facts import DiscoverError, parse_gather
from rigkit.discovery.profile import plan_profile, render_host_vars
from rigkit.inventory_files import Sources
from rigkit.validation.preflight import controller_preflight
from tests.fixtures.discovery_facts import RTX3050
from tests.support import REPO, model_catalog

CATALOG = model_catalog()
LLAMA_DEFAULTS = (REPO / "roles/llama_server/defaults/main.yml").read_text()

ROLE = REPO / "roles/llama_server"
BAD = ["autoo", -5, "-5", "", None, True, 1.5, "1,536", "١٢"]  # the last: Arabic-Indic digits, which int() takes


def _filters() -> dict[str, Any]:
    from filter_plugins.llama_server import FilterModule

    return FilterModule().filters()


# ------------------------------------------------------------------------------------------ the rule
def test_auto_headroom_is_todays_figure_for_a_gpu_and_a_cpu_rig() -> None:
    assert memory_headroom_mib("auto", on_gpu=True) == 1536
    assert memory_headroom_mib("auto", on_gpu=False) == 256
    assert memory_headroom_mib(" AUTO ", on_gpu=True) == 1536  # as the container memory limit's auto is read
    assert AUTO_HEADROOM_MIB == {"gpu": 1536, "cpu": 256}


@pytest.mark.parametrize("on_gpu", [True, False])
def test_a_number_of_mib_is_kept(on_gpu: bool) -> None:
    assert memory_headroom_mib(700, on_gpu=on_gpu) == 700
    assert memory_headroom_mib(0, on_gpu=on_gpu) == 0
    assert memory_headroom_mib("2048", on_gpu=on_gpu) == 2048  # --extra-vars arrive as text
    assert memory_budget_mib(6000, on_gpu=on_gpu, vram_mib=8192, ram_mib=32000) == 6000
    assert memory_budget_mib("1", on_gpu=on_gpu) == 1


def test_auto_budget_is_the_vram_on_a_gpu_rig_and_the_ram_on_a_cpu_rig() -> None:
    assert memory_budget_mib("auto", on_gpu=True, vram_mib=8192, ram_mib=32000) == 8192
    assert memory_budget_mib("auto", on_gpu=False, vram_mib=8192, ram_mib=32000) == 32000
    assert memory_budget_mib("auto", on_gpu=True, vram_mib=None, ram_mib=32000) is None  # not known: the caller says
    assert memory_budget_mib("auto", on_gpu=False, vram_mib=8192, ram_mib=None) is None
    assert memory_budget_mib("auto", on_gpu=True, vram_mib=0) is None


@pytest.mark.parametrize("value", BAD, ids=repr)
def test_a_bad_headroom_is_refused_naming_the_variable_the_value_and_what_is_accepted(value: Any) -> None:
    with pytest.raises(MemorySettingError) as caught:
        memory_headroom_mib(value, on_gpu=True)
    assert isinstance(caught.value, ValueError)
    assert str(caught.value) == (
        f"{HEADROOM_VARIABLE} is {value!r}; expected auto (1536 MiB on a GPU rig, 256 MiB on a CPU rig) or a number "
        "of MiB >= 0"
    )


@pytest.mark.parametrize("value", [*BAD, 0], ids=repr)
def test_a_bad_budget_is_refused_naming_the_variable_the_value_and_what_is_accepted(value: Any) -> None:
    with pytest.raises(
        MemorySettingError, match=rf"^{BUDGET_VARIABLE} is .*; expected auto \(the GPU's VRAM"
    ) as caught:
        memory_budget_mib(value, on_gpu=True, vram_mib=8192)
    assert repr(value) in str(caught.value) and "or a number of MiB >= 1" in str(caught.value)


# ------------------------------------------------------------------------------------------ the role
def test_the_role_defaults_are_auto_and_the_spec_documents_what_auto_is() -> None:
    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    assert defaults[BUDGET_VARIABLE] == "auto" and defaults[HEADROOM_VARIABLE] == "auto"
    options = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert options[BUDGET_VARIABLE]["type"] == options[HEADROOM_VARIABLE]["type"] == "raw"
    headroom = " ".join(options[HEADROOM_VARIABLE]["description"].split())
    assert (
        f"auto is {AUTO_HEADROOM_MIB['gpu']} MiB on a GPU rig and {AUTO_HEADROOM_MIB['cpu']} MiB on a CPU" in headroom
    )
    assert "rig_gpu.vram_mib" in options[BUDGET_VARIABLE]["description"]
    readme = (ROLE / "README.md").read_text()
    assert (
        f"`auto`: `{AUTO_HEADROOM_MIB['gpu']}` on a GPU" in readme and f"`{AUTO_HEADROOM_MIB['cpu']}` on CPU" in readme
    )


def test_the_preflight_without_a_headroom_adds_the_auto_figure_of_its_device(
    gemma3_270m_gguf: Path,
) -> None:
    """preflight() has no headroom figure of its own: left out, it is auto, resolved by the one rule."""
    settings = {"ctx_size": 2048, "flash_attn": "on"}
    for gpu_layers, device in ((0, "cpu"), ("all", "gpu")):
        result = preflight(gemma3_270m_gguf, None, {**settings, "gpu_layers": gpu_layers}, 65536)
        assert result.ok, result.problems
        assert result.estimate is not None and result.estimate.headroom == AUTO_HEADROOM_MIB[device] * MIB
    with pytest.raises(PreflightError, match=rf"{HEADROOM_VARIABLE} is 'autoo'; expected auto"):
        preflight(gemma3_270m_gguf, None, {**settings, "headroom_mib": "autoo"}, 65536)


def test_the_roles_preflight_gets_both_through_the_filters() -> None:
    role_vars = yaml.safe_load((ROLE / "vars/main.yml").read_text())
    assert "| llama_server_memory_budget(" in role_vars["__llama_server_memory_budget_mib"]
    assert "| llama_server_memory_headroom(" in role_vars["__llama_server_memory_headroom_mib"]
    (task,) = [t for t in yaml.safe_load((ROLE / "tasks/preflight.yml").read_text()) if "llama_server_preflight" in t]
    args = task["llama_server_preflight"]
    assert args["memory_budget_mib"] == "{{ __llama_server_memory_budget_mib }}"
    assert args["headroom_mib"] == "{{ __llama_server_memory_headroom_mib }}"


def test_the_filters_resolve_as_the_rule_and_fail_naming_the_value() -> None:
    filters = _filters()
    headroom, budget = filters["llama_server_memory_headroom"], filters["llama_server_memory_budget"]
    assert headroom("auto", True) == 1536 and headroom("auto", False) == 256 and headroom("900", True) == 900
    assert budget("auto", True, 8192, None) == 8192 and budget("auto", False, None, 15000) == 15000
    assert budget(4096, True, None, None) == 4096
    with pytest.raises(AnsibleFilterError, match=r"llama_server_memory_headroom_mib is 'autoo'; expected auto \("):
        headroom("autoo", True)
    with pytest.raises(AnsibleFilterError, match=r"auto but rig_gpu.vram_mib is None: set rig_gpu"):
        budget("auto", True, None, 15000)
    with pytest.raises(AnsibleFilterError, match=r"auto but the rig's RAM \(ansible_facts memtotal_mb\) is None"):
        budget("auto", False, 8192, None)


# ------------------------------------------------------------------------------------------ the controller
def _desktop(**variables: Any) -> list[str]:
    """The controller preflight of the seed's desktop3050 on a 2,800 MiB card (no GGUF cached: catalog shapes)."""
    values = yaml.safe_load((REPO / "inventory/host_vars/desktop3050.yml").read_text())
    values.update(rig_kind="gpu", rig_gpu={**values["rig_gpu"], "vram_mib": 2800}, **variables)
    sources = Sources(str(REPO / "inventory"), "desktop3050", ["gpu_rigs", "rigs"])
    return controller_preflight("desktop3050", values, sources=sources, catalog=CATALOG, cache_dir="/nonexistent")


def test_the_controller_preflight_resolves_auto_with_the_same_rule() -> None:
    """E2B + drafter at 8k is 2,887 MiB with the GPU's auto headroom: over 2,800 MiB; under it with 1,024."""
    (refusal,) = _desktop()
    assert "headroom 1,536 MiB = 2,887 MiB" in refusal and "is 2,800 MiB" in refusal, refusal
    assert _desktop(llama_server_memory_headroom_mib="auto") == [refusal]
    assert _desktop(llama_server_memory_headroom_mib=1024) == []
    assert _desktop(llama_server_memory_budget_mib=4096) == [] and _desktop(llama_server_memory_budget_mib="4096") == []
    assert _desktop(llama_server_memory_budget_mib="auto") == [refusal]
    # a malformed value counts as auto here: the validation refuses it, naming its file (test_validation_rules.py)
    assert _desktop(llama_server_memory_headroom_mib="autoo") == [refusal]
    assert _desktop(llama_server_gpu_access="none") == []  # a CPU rig's RAM is only known on the rig


def test_an_entry_without_shape_facts_is_refused_not_skipped() -> None:
    """Google's E4B at 32k on the 4 GB laptop: its entry has no shape: and nothing is cached, so the fit is unknown;
    before, nothing was said and the rig was contacted."""
    values = yaml.safe_load((REPO / "inventory/host_vars/laptop1650ti.yml").read_text())
    values.update(
        rig_kind="gpu",
        models_target="gemma-4-E4B-it-qat-q4_0-google",
        models_drafter="gemma-4-E4B-it-qat-assistant-q4_0-exact",
        llama_server_ctx_size=32768,
    )
    sources = Sources(str(REPO / "inventory"), "laptop1650ti", ["gpu_rigs", "rigs"])
    (refusal,) = controller_preflight(
        "laptop1650ti", values, sources=sources, catalog=CATALOG, cache_dir="/nonexistent"
    )
    assert ": memory fit unknown for gemma-4-E4B-it-qat-q4_0-google on laptop1650ti: no shape: facts" in refusal
    assert "; make pin host=laptop1650ti reads the GGUF's header from the Hub and records them" in refusal
    # with the facts make pin records, the same rig is checked, and 32k does not fit 4 GB
    measured = {**CATALOG["gemma-4-E4B-it-qat-q4_0-google"], "shape": CATALOG["gemma-4-E4B-it-qat-q4_0-exact"]["shape"]}
    catalog = {**CATALOG, "gemma-4-E4B-it-qat-q4_0-google": measured}
    (refusal,) = controller_preflight(
        "laptop1650ti", values, sources=sources, catalog=catalog, cache_dir="/nonexistent"
    )
    assert "is 4,096 MiB" in refusal and "catalog's shape facts" in refusal, refusal


# ------------------------------------------------------------------------------------------ make discover
def _discover(defaults_text: str) -> str:
    profile = plan_profile(
        parse_gather(RTX3050), CATALOG, host="d", address="d.local", user=None, kind="gpu", llama_defaults=defaults_text
    )
    return render_host_vars(profile).replace("\n# ", " ")


def test_discover_uses_the_role_default_through_the_same_rule() -> None:
    assert "1536 MiB headroom" in _discover(LLAMA_DEFAULTS)
    assert "1024 MiB headroom" in _discover(
        LLAMA_DEFAULTS.replace(f"{HEADROOM_VARIABLE}: auto", f"{HEADROOM_VARIABLE}: 1024")
    )
    with pytest.raises(DiscoverError, match=rf"defaults/main.yml: {HEADROOM_VARIABLE} is 'autoo'; expected auto"):
        _discover(LLAMA_DEFAULTS.replace(f"{HEADROOM_VARIABLE}: auto", f"{HEADROOM_VARIABLE}: autoo"))
