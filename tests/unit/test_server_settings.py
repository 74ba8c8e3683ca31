"""The settings table (module_utils/llama_server/settings.py) is the one home of every llama-server setting: the
role's default, spec and README follow it, and the argv, the managed flags, the read-back, the preflight and the
validation ranges all come from it."""

from __future__ import annotations

import re

import yaml
from ansible.module_utils.llama_server import settings
from ansible.module_utils.llama_server.settings import SETTINGS, argv, extra_args_problems, status_flags
from ansible.module_utils.rig_deployed import server_settings

from rigkit.validation.server_options import known_options, unknown_flags
from rigkit.validation.variables import RANGES
from tests import support

ROLE = support.REPO / "roles/llama_server"
PUBLIC = [s for s in SETTINGS if s.variable.startswith("llama_server_")]


def test_every_setting_has_its_default_spec_and_readme_row() -> None:
    """A new row needs exactly these three beside it (and a memory line if it changes memory use)."""
    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    spec = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    readme = (ROLE / "README.md").read_text()
    for s in PUBLIC:
        assert s.variable in defaults, f"{s.variable}: no default in roles/llama_server/defaults/main.yml"
        assert s.variable in spec, f"{s.variable}: not in roles/llama_server/meta/argument_specs.yml"
        rows = [line for line in readme.splitlines() if line.startswith("|") and f"`{s.variable}`" in line]
        assert rows, f"{s.variable}: no row in roles/llama_server/README.md"
        row = rows[0]
        if not s.env:
            assert f"`{s.flag}" in row or s.kind == "const", f"{s.variable}: its README row does not name {s.flag}"


def test_the_environment_file_carries_exactly_the_env_rows() -> None:
    template = (ROLE / "templates/llama-server.env.j2").read_text()
    written = {name: variable for name, variable in re.findall(r"^(LLAMA_[A-Z_]+)=\{\{ (\w+) \}\}", template, re.M)}
    assert written == {s.env: s.variable for s in SETTINGS if s.env}


def test_the_roles_preflight_passes_the_tables_inputs() -> None:
    tasks = yaml.safe_load((ROLE / "tasks/preflight.yml").read_text())
    args = next(t["llama_server_preflight"] for t in tasks if "llama_server_preflight" in t)
    for s in SETTINGS:
        if s.preflight:
            assert s.variable in str(args.get(s.preflight)), (s.preflight, args.get(s.preflight))


def test_argv_follows_the_variables() -> None:
    values = {s.variable: None for s in SETTINGS if s.variable}
    values.update(
        llama_server_target_path="/m/t.gguf",
        llama_server_drafter_path="/m/d.gguf",
        llama_server_ctx_size=4096,
        llama_server_parallel=1,
        llama_server_gpu_layers="all",
        llama_server_gpu_layers_draft=0,
        llama_server_flash_attn="on",
        llama_server_cache_type_k="f16",
        llama_server_cache_type_v="q8_0",
        llama_server_spec_type="draft-mtp",
        llama_server_spec_draft_n_max=3,
        llama_server_spec_draft_n_min=0,
        llama_server_swa_full="false",
        llama_server_kv_unified=True,
        llama_server_ubatch_size=512,
        llama_server_mlock=False,
        llama_server_metrics=True,
        llama_server_cors_origins="localhost",
        __llama_server_alias="",
        __llama_server_drafts=False,
        __llama_server_require_gpu=True,
        __llama_server_tls=False,
    )
    plain = argv(values)
    assert plain[:2] == ["--model", "/m/t.gguf"] and "--alias" not in plain
    assert "--model-draft" not in plain and "--spec-type" not in plain  # no drafting: no drafter flags
    assert plain[plain.index("--ubatch-size") + 1] == "512" and "--batch-size" not in plain
    assert "--kv-unified" in plain and "--swa-full" not in plain and "--mlock" not in plain
    assert plain[plain.index("--fit") + 1] == "off"  # the kit's preflight is the one memory authority
    assert plain[plain.index("--verbosity") + 1] == "4" and "--ssl-key-file" not in plain
    assert "--host" not in plain and "--api-key" not in plain  # the environment file's, never argv
    drafting = argv({**values, "__llama_server_drafts": True, "__llama_server_alias": "gemma"})
    assert drafting[drafting.index("--spec-draft-n-max") + 1] == "3"
    assert drafting[drafting.index("--alias") + 1] == "gemma"
    # the read-back of the running argv finds what the argv set, under every spelling llama.cpp takes
    assert server_settings(drafting) == {
        "ctx_size": 4096,
        "parallel": 1,
        "spec_type": "draft-mtp",
        "draft_n_max": 3,
        "draft_n_min": 0,
    }
    assert status_flags()["-np"] == "parallel"


def test_every_flag_and_spelling_is_managed() -> None:
    for s in SETTINGS:
        for name in (s.flag, *s.spellings):
            assert extra_args_problems([name, "1"]) == [name], name
    assert extra_args_problems(["--fit-target", "512", "--jinja", "--props"]) == ["--fit-target"]


def test_the_ranges_of_the_servers_settings_come_from_the_table() -> None:
    for s in SETTINGS:
        if s.range:
            assert RANGES[s.variable] == s.range, s.variable
    assert settings.ranges()["llama_server_port"] == settings.PORT


def test_extra_flags_are_checked_against_the_recorded_options_of_the_same_commit_only() -> None:
    commit, names = known_options()
    assert "--jinja" in names and "--load-mode" in names and "--mlock" not in names
    assert unknown_flags(["--no-numa", "-1", "--jinja", "--temp=0.2"], commit) == ["--no-numa"]
    # a rig on another llama.cpp commit: its options are not recorded here, so nothing is refused for it
    assert unknown_flags(["--no-numa"], "0" * 40) == []
