"""Controller-side validation of one rig's description, before any rig is contacted.

Every variable of a rig (inventory, extra vars) is checked against the ``meta/argument_specs.yml`` of each role
entry point that will run on it (types and choices, with Ansible's own ArgumentSpecValidator, as
``ansible.builtin.validate_argument_spec`` does), plus the rules a spec cannot express (ranges, min <= max,
rig_gpu's fields, a driver version within its branch, a non-loopback bind without an API key, catalog names and
``pairs_with``). A variable that carries a role's prefix but that no spec (nor KIT_VARIABLES below) declares is
refused with a "did you mean" suggestion. Each problem names the file that set the variable, the variable, its
value and what is accepted; all problems of a rig are returned at once.

Once the controller's cache holds the rig's GGUFs, ``controller_preflight`` runs the pairing, context and memory
checks of server_preflight.py on their headers, with rig_gpu's VRAM as the budget, before any role changes a rig.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.model_catalog import CATALOG_PATH
from ansible.module_utils.nft_allowlist import AllowListError, normalise_networks
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.module_utils.server_preflight import PreflightError, check_container_memory, preflight

# Variable-name prefixes owned by the kit: such a variable must be declared somewhere.
PREFIXES = (
    "nvidia_container_toolkit_",
    "container_harness_",
    "llamacpp_image_",
    "nvidia_driver_",
    "llama_server_",
    "llama_bench_",
    "rig_lock_",
    "models_",
    "docker_",
    "cuda_",
    "rig_",
    # broader kit prefixes, so that a typo inside a role's prefix (nvidia_drvier_version) is caught too
    "nvidia_",
    "llama_",
)

# The role entry points that run on a rig of each kind (playbooks/provision.yml, bench.yml, status.yml).
COMMON_ENTRY_POINTS = (
    ("docker", "main"),
    ("llamacpp_image", "main"),
    ("models", "main"),
    ("models", "validate"),
    ("llama_server", "main"),
    ("rig_lock", "main"),
    ("llama_bench", "main"),
)
ENTRY_POINTS: dict[str, tuple[tuple[str, str], ...]] = {
    "gpu": (
        ("nvidia_driver", "main"),
        ("nvidia_container_toolkit", "main"),
        ("cuda", "main"),
        *COMMON_ENTRY_POINTS,
    ),
    "sandbox": (("container_harness", "main"), ("container_harness", "rig"), *COMMON_ENTRY_POINTS),
}

# Inventory keys of the kit itself and of the models play (playbooks/models.yml), which no role declares.
# Same shape as an argument spec's options (README, "Inventory keys").
KIT_VARIABLES: dict[str, dict[str, Any]] = {
    "rig_kind": {"type": "str", "choices": ["gpu", "sandbox"], "description": "What the rig is."},
    "rig_gpu": {"type": "dict", "description": "The GPU: name, vram_mib, compute_capability, headless."},
    "rig_wants_cuda": {"type": "bool", "description": "Install the host CUDA toolkit (role cuda)."},
    "rig_controller_cache_dir": {"type": "path", "description": "Controller cache (downloads, builds)."},
    "rig_expected_min_acceptance": {"type": "float", "description": "Canary acceptance the rig tests expect."},
    "rig_workload": {"type": "dict", "description": "{mix: {kind: weight}, concurrency: N} for make tune."},
    "models_upstream_base_url": {"type": "str", "description": "Where the controller downloads models from."},
    "models_upstream_allow_insecure_http": {"type": "bool", "description": "Accept a plain http:// upstream."},
    "models_mirror_port": {"type": "int", "description": "Port of the controller's model mirror."},
    "models_mirror_idle_timeout": {"type": "int", "description": "Seconds the idle mirror waits before stopping."},
    "models_mirror_max_age": {"type": "int", "description": "Seconds after which the mirror stops, busy or not."},
    "models_controller_address": {"type": "str", "description": "The controller's address as the rigs reach it."},
    "models_sandbox_hub_dir": {"type": "path", "description": "The sandbox's stand-in Hugging Face hub."},
    "models_sandbox_hub_port": {"type": "int", "description": "Port of the sandbox's stand-in hub."},
}

# Facts and registered results the kit's plays set at run time (never inventory keys, but present in later plays).
RUNTIME_VARIABLES = frozenset(
    {
        "rig_status_output",
        "rig_status_row",
        "rig_status_deployed",
        "rig_lock_deployed",
        "rig_lock_expected",
        "rig_lock_comparison",
        "rig_lock_result",
        "models_target_entry",
        "models_drafter_entry",
        "models_target_path",
        "models_drafter_path",
        "models_fetched",
        "models_found",
        "llamacpp_image_tag",
        "llamacpp_image_id",
        "llama_server_effective",
        "llama_server_preflight_result",
        "llama_server_canary",
        "llama_server_report",
        "container_harness_base_image",
        "container_harness_rig_image",
        "container_harness_engine",
        "container_harness_rig",
        "docker_server_version",
        "nvidia_driver_gpu",
    }
)
RUNTIME_PREFIXES = ("models_fleet_", "models_molecule_")

# rig_gpu's fields (a GPU rig's inventory).
RIG_GPU_FIELDS = ("name", "vram_mib", "compute_capability", "headless")
COMPUTE_CAPABILITY_RE = re.compile(r"^[0-9]+\.[0-9]$")
DRIVER_VERSION_RE = re.compile(r"^[0-9]+\.[0-9]+(\.[0-9]+)?$")
LOOPBACK_NAMES = ("localhost",)

# Integer ranges the specs' types cannot say: (lowest, highest or None, what is accepted).
PORT = (1, 65535, "a port 1-65535")
POSITIVE = (1, None, "a positive integer")
NON_NEGATIVE = (0, None, "an integer >= 0")
# llama.cpp takes any --spec-draft-n-max >= 1, but a draft longer than 16 tokens never pays off for these models
# (the kit's bench goes to llama_bench_draft_max, 4 by default): the kit accepts 1..16.
DRAFT_N_MAX = (1, 16, "a draft length 1-16")
RANGES: dict[str, tuple[int, int | None, str]] = {
    "llama_server_port": PORT,
    "llama_server_spec_draft_n_max": DRAFT_N_MAX,
    "llama_server_spec_draft_n_min": (0, 16, "a draft length 0-16"),
    "llama_server_ctx_size": POSITIVE,
    "llama_server_parallel": POSITIVE,
    "llama_server_batch_size": POSITIVE,
    "llama_server_ubatch_size": POSITIVE,
    "llama_server_threads": POSITIVE,
    "llama_server_threads_batch": POSITIVE,
    "llama_server_health_timeout": POSITIVE,
    "llama_server_canary_tokens": POSITIVE,
    "llama_server_restart_sec": NON_NEGATIVE,
    "llama_server_stop_timeout": POSITIVE,
    "llama_server_memory_budget_mib": POSITIVE,
    "llama_server_memory_headroom_mib": NON_NEGATIVE,
    "llama_server_container_memory_margin_mib": NON_NEGATIVE,
    "llama_server_container_memory_floor_mib": NON_NEGATIVE,
    "llama_server_container_pids_limit": (
        64,
        None,
        "64 or more (llama-server runs a thread per core and its HTTP workers)",
    ),
    "llama_server_container_log_max_file": (1, 999, "1-999 rotated files"),
    "models_fetch_retries": NON_NEGATIVE,
    "models_mirror_port": PORT,
    "models_sandbox_hub_port": PORT,
    "models_mirror_idle_timeout": POSITIVE,
    "models_mirror_max_age": POSITIVE,
    "nvidia_driver_reboot_timeout": POSITIVE,
    "nvidia_driver_vram_tolerance_mib": NON_NEGATIVE,
    "llamacpp_image_build_number": POSITIVE,
    "llamacpp_image_build_timeout": POSITIVE,
    "llama_bench_draft_max": DRAFT_N_MAX,
    "llama_bench_concurrency_max": POSITIVE,
    "llama_bench_n_predict": POSITIVE,
    "llama_bench_warmup": NON_NEGATIVE,
    "llama_bench_repeats": POSITIVE,
    "llama_bench_passes": POSITIVE,
    "llama_bench_request_timeout": POSITIVE,
    "container_harness_rig_boot_timeout": POSITIVE,
}
GPU_LAYER_VARIABLES = ("llama_server_gpu_layers", "llama_server_gpu_layers_draft")
# docker's --log-opt max-size: a number and a unit (k, m, g).
LOG_SIZE_RE = re.compile(r"^[1-9][0-9]{0,5}[kmg]$")
MIN_CONTAINER_MEMORY_MIB = 256

Specs = dict[str, dict[str, dict[str, Any]]]
# Values never shown in a message: no_log options and anything named like a secret.
SECRET_NAME_RE = re.compile(r"(tok|api_key|password|secret)", re.IGNORECASE)
HIDDEN = "<hidden>"


class Unresolved:
    """A variable whose value cannot be templated on the controller yet (it depends on a fact or a role)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


# ------------------------------------------------------------------------------------------ specs
def load_specs(roles_dir: str) -> Specs:
    """{role: {entry point: options}} from every role's meta/argument_specs.yml."""
    specs: Specs = {}
    for role in sorted(os.listdir(roles_dir)):
        path = os.path.join(roles_dir, role, "meta", "argument_specs.yml")
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle) or {}
        specs[role] = {
            entry: dict((body or {}).get("options") or {}) for entry, body in (data.get("argument_specs") or {}).items()
        }
    return specs


def plain_defaults(roles_dir: str, role: str) -> dict[str, Any]:
    """A role's defaults that need no templating (the controller preflight's fallbacks: the role's own values)."""
    path = os.path.join(roles_dir, role, "defaults", "main.yml")
    with open(path, encoding="utf-8") as handle:
        data = yaml.safe_load(handle) or {}
    return {name: value for name, value in data.items() if not (isinstance(value, str) and "{{" in value)}


def declared_variables(specs: Specs) -> dict[str, dict[str, Any]]:
    """Every variable any role or the kit declares, with its option spec."""
    declared: dict[str, dict[str, Any]] = {}
    for entries in specs.values():
        for options in entries.values():
            for name, option in options.items():
                declared.setdefault(name, option)
    declared.update(KIT_VARIABLES)
    return declared


def rig_options(specs: Specs, rig_kind: str) -> dict[str, dict[str, Any]]:
    """The options of the entry points that run on a rig of this kind (plus the kit's own keys)."""
    options: dict[str, dict[str, Any]] = {}
    for role, entry in ENTRY_POINTS.get(rig_kind, ENTRY_POINTS["gpu"]):
        options.update(specs.get(role, {}).get(entry, {}))
    options.update(KIT_VARIABLES)
    return options


# -------------------------------------------------------------------------------- where it was set
class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader that keeps Ansible's tagged values (!vault, !unsafe) as plain strings."""


def _tagged(loader: yaml.SafeLoader, _suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    return loader.construct_mapping(node)  # type: ignore[arg-type]


_Loader.add_multi_constructor("!", _tagged)


def load_yaml_file(path: str) -> Any:
    """Parse one inventory file; a syntax error says file:line:column (yaml.MarkedYAMLError's mark, 1-based)."""
    with open(path, encoding="utf-8") as handle:
        return yaml.load(handle, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def yaml_error_message(path: str, exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    detail = f"{context}, {problem}" if context else problem
    return f"{where}: YAML syntax error: {detail}. Fix that line (indentation, quotes, a missing ':')."


def inventory_yaml_errors(paths: Iterable[str]) -> list[str]:
    """file:line:column of every YAML syntax error in these inventory files and directories."""
    errors: list[str] = []
    for top in paths:
        files = [top] if os.path.isfile(top) else []
        if os.path.isdir(top):
            for root, dirs, names in os.walk(top):
                dirs.sort()
                files += [os.path.join(root, n) for n in sorted(names) if n.endswith((".yml", ".yaml"))]
        for path in files:
            try:
                load_yaml_file(path)
            except yaml.YAMLError as exc:
                errors.append(yaml_error_message(display_path(path), exc))
    return errors


def display_path(path: str) -> str:
    """A path relative to the working directory when it lies below it, else absolute."""
    absolute = os.path.abspath(path)
    relative = os.path.relpath(absolute)
    return absolute if relative.startswith("..") else relative


def _candidate_files(inventory_dir: str, kind: str, name: str) -> list[str]:
    base = os.path.join(inventory_dir, kind)
    files = [os.path.join(base, name + ext) for ext in ("", ".yml", ".yaml")]
    folder = os.path.join(base, name)
    if os.path.isdir(folder):
        files += [os.path.join(folder, n) for n in sorted(os.listdir(folder)) if n.endswith((".yml", ".yaml"))]
    return [path for path in files if os.path.isfile(path)]


def _inline_hosts(node: Any, host: str) -> dict[str, Any] | None:
    """The variables written under ``host`` in a YAML inventory tree (all: children: ... hosts: host: {...})."""
    if not isinstance(node, dict):
        return None
    hosts = node.get("hosts")
    if isinstance(hosts, dict) and isinstance(hosts.get(host), dict):
        return hosts[host]
    for child in (node.get("children") or {}).values() if isinstance(node.get("children"), dict) else ():
        found = _inline_hosts(child, host)
        if found is not None:
            return found
    return None


def _inline_host_vars(inventory_dir: str, host: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for name in sorted(os.listdir(inventory_dir)) if os.path.isdir(inventory_dir) else []:
        path = os.path.join(inventory_dir, name)
        if not (name.endswith((".yml", ".yaml")) and os.path.isfile(path)):
            continue
        try:
            data = load_yaml_file(path)
        except (OSError, yaml.YAMLError):
            continue
        variables = _inline_hosts(data.get("all") if isinstance(data, dict) else None, host)
        if variables:
            found.append((display_path(path), variables))
    return found


class Sources:
    """Which inventory file sets a variable for one host: host_vars first, then its groups', then group all."""

    def __init__(self, inventory: str | Iterable[str], host: str, groups: Iterable[str]) -> None:
        # Every inventory source (a file: its directory), the last one first: later sources override earlier ones.
        sources = [inventory] if isinstance(inventory, str) else list(inventory)
        dirs = list(dict.fromkeys(s if os.path.isdir(s) else os.path.dirname(s) for s in reversed(sources)))
        ordered = [("host_vars", host)] + [("group_vars", g) for g in groups if g != "all"] + [("group_vars", "all")]
        self._files: list[tuple[str, dict[str, Any]]] = []
        for kind, name in ordered:
            for inventory_dir in dirs:
                for path in _candidate_files(inventory_dir, kind, name):
                    try:
                        data = load_yaml_file(path)
                    except (OSError, yaml.YAMLError):
                        continue
                    if isinstance(data, dict):
                        self._files.append((display_path(path), data))
                if kind == "host_vars":  # variables written inline under the host in an inventory file
                    self._files += _inline_host_vars(inventory_dir, host)

    def file_of(self, variable: str, value: Any = None) -> str:
        """The file that sets ``variable``; with its ``value``, --extra-vars when that overrides the file's."""
        for path, data in self._files:
            if variable in data:
                raw = data[variable]
                templated = isinstance(raw, str) and "{{" in raw
                if value is None or templated or str(raw) == str(value) or show(raw) == show(value):
                    return path
                return f"--extra-vars (overriding {path})"
        return "--extra-vars or a role default"

    def raw(self, variable: str) -> Any:
        for _path, data in self._files:
            if variable in data:
                return data[variable]
        return None


# --------------------------------------------------------------------------------------- problems
def show(value: Any) -> str:
    """A value as the person wrote it: strings quoted, the rest as JSON."""
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return repr(value)


def suggestion(name: str, known: Iterable[str], cutoff: float = 0.75) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=cutoff)
    return f"; did you mean {' or '.join(close)}?" if close else ""


class Report:
    """All problems of one rig, each prefixed with the file that set the variable."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources
        self.problems: list[str] = []

    def add(self, variable: str, value: Any, expected: str, *, field: str | None = None) -> None:
        label = f"{variable}.{field}" if field else variable
        whole = None if field or value == HIDDEN else value
        self.problems.append(f"{self.sources.file_of(variable, whole)}: {label} is {show(value)}; {expected}")

    def note(self, variable: str, text: str) -> None:
        self.problems.append(f"{self.sources.file_of(variable)}: {text}")


def _check_type(name: str, option: Mapping[str, Any], value: Any) -> tuple[Any, str | None]:
    """(converted value, problem) with Ansible's ArgumentSpecValidator, as validate_argument_spec checks it."""
    spec = {key: option[key] for key in ("type", "choices", "elements", "no_log") if key in option}
    result = ArgumentSpecValidator({name: spec}).validate({name: value})
    if result.error_messages:
        text = result.error_messages[0]
        if "choices" in option:
            return value, f"expected one of {', '.join(str(c) for c in option['choices'])}"
        return value, f"expected {option.get('type', 'str')} ({text})"
    return result.validated_parameters.get(name, value), None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_range(report: Report, name: str, value: Any) -> None:
    low, high, what = RANGES[name]
    if value is None or not _is_int(value):
        return
    if value < low or (high is not None and value > high):
        report.add(name, value, f"expected {what}")


def _check_gpu_layers(report: Report, name: str, value: Any) -> None:
    text = str(value).strip().lower()
    if isinstance(value, bool) or not (text in ("all", "auto") or (text.isdigit())):
        report.add(name, value, 'expected "all", "auto" or a number of layers >= 0')


def _check_container_limits(report: Report, values: Mapping[str, Any]) -> None:
    memory = values.get("llama_server_container_memory_mib")
    if memory is not None and str(memory).strip().lower() != "auto":
        number = memory if _is_int(memory) else (int(memory) if str(memory).strip().isdigit() else None)
        if number is None or number < MIN_CONTAINER_MEMORY_MIB:
            report.add(
                "llama_server_container_memory_mib",
                memory,
                f"expected auto (derived from the preflight estimate) or MiB >= {MIN_CONTAINER_MEMORY_MIB}",
            )
    networks = values.get("llama_server_allowed_networks")
    if networks:
        try:
            normalise_networks(networks)
        except AllowListError as exc:
            detail = str(exc).removeprefix("llama_server_allowed_networks: ")
            report.add("llama_server_allowed_networks", networks, f"{detail} (each entry a network in CIDR form)")
        else:
            host = values.get("llama_server_host")
            if isinstance(host, str) and _is_loopback(host):
                report.add(
                    "llama_server_allowed_networks",
                    networks,
                    f"llama_server_host is {host}, so no other machine can connect: set llama_server_host to the "
                    "rig's LAN address (with llama_server_api_key), or leave the allow-list empty",
                )
    size = values.get("llama_server_container_log_max_size")
    if size is not None and not LOG_SIZE_RE.match(str(size)):
        report.add(
            "llama_server_container_log_max_size", size, "expected a size such as 10m (a number, then k, m or g)"
        )


def _check_rig_gpu(report: Report, rig_gpu: Any) -> None:
    if not isinstance(rig_gpu, Mapping):
        report.add("rig_gpu", rig_gpu, f"expected a mapping with {', '.join(RIG_GPU_FIELDS)}")
        return
    vram = rig_gpu.get("vram_mib")
    if not _is_int(vram) or vram <= 0:
        report.add(
            "rig_gpu", vram, "expected the GPU's memory in MiB, a positive integer such as 8192", field="vram_mib"
        )
    capability = rig_gpu.get("compute_capability")
    if not isinstance(capability, str) or not COMPUTE_CAPABILITY_RE.match(capability):
        report.add(
            "rig_gpu",
            capability,
            'expected MAJOR.MINOR such as "8.6" (quoted: a YAML number loses the digits)',
            field="compute_capability",
        )
    if "headless" in rig_gpu and not isinstance(rig_gpu["headless"], bool):
        report.add("rig_gpu", rig_gpu["headless"], "expected true or false", field="headless")
    for key in sorted(set(rig_gpu) - set(RIG_GPU_FIELDS)):
        report.add(
            "rig_gpu",
            rig_gpu[key],
            f"unknown field{suggestion(key, RIG_GPU_FIELDS, 0.6)} (known: {', '.join(RIG_GPU_FIELDS)})",
            field=key,
        )


def _is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _catalog_name(report: Report, catalog: Mapping[str, Any], variable: str, name: Any, role: str | None) -> Any:
    """The catalog entry ``name`` (in the ``role`` slot), or None after reporting why not."""
    if not isinstance(name, str) or name not in catalog:
        close = difflib.get_close_matches(str(name), sorted(catalog), n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(close)}?" if close else f"known: {', '.join(sorted(catalog))}"
        report.add(variable, name, f"expected a model of the catalog ({CATALOG_PATH}); {hint}")
        return None
    entry = catalog[name]
    if role is not None and isinstance(entry, Mapping) and entry.get("role") != role:
        report.add(variable, name, f"expected a {role} of the catalog, but that entry is a {entry.get('role')}")
        return None
    return entry


def _check_models(report: Report, values: Mapping[str, Any], catalog: Any) -> None:
    if not isinstance(catalog, Mapping) or not catalog:
        return  # the catalog's own check (catalog_problems) reports it
    target = values.get("models_target")
    if target in (None, ""):
        report.note("models_target", "models_target is not set; name the catalog entry to serve (a target)")
    else:
        _catalog_name(report, catalog, "models_target", target, "target")
    drafter = values.get("models_drafter")
    if drafter in (None, ""):
        return
    entry = _catalog_name(report, catalog, "models_drafter", drafter, None)
    pairs_with = entry.get("pairs_with") if isinstance(entry, Mapping) else None
    if pairs_with and target in catalog and pairs_with != target:
        report.add(
            "models_drafter",
            drafter,
            f"that drafter pairs with {pairs_with} (its catalog pairs_with), not with models_target {target}: "
            f"set models_target: {pairs_with}, or a drafter whose pairs_with is {target}",
        )


def _check_rules(report: Report, values: Mapping[str, Any], catalog: Any) -> None:
    for name in RANGES:
        if name in values:
            _check_range(report, name, values[name])
    for name in GPU_LAYER_VARIABLES:
        if name in values:
            _check_gpu_layers(report, name, values[name])
    _check_container_limits(report, values)
    n_min, n_max = values.get("llama_server_spec_draft_n_min"), values.get("llama_server_spec_draft_n_max")
    if _is_int(n_min) and _is_int(n_max) and n_min > n_max:
        report.add("llama_server_spec_draft_n_min", n_min, f"expected at most llama_server_spec_draft_n_max ({n_max})")
    if values.get("rig_kind") == "gpu" and "rig_gpu" in values:
        _check_rig_gpu(report, values["rig_gpu"])
    branch, version = values.get("nvidia_driver_branch"), values.get("nvidia_driver_version")
    if isinstance(version, str) and not DRIVER_VERSION_RE.match(version):
        report.add("nvidia_driver_version", version, "expected an exact driver version such as 535.261.03")
    elif isinstance(version, str) and isinstance(branch, str) and version.split(".")[0] != branch:
        report.add(
            "nvidia_driver_version",
            version,
            f"expected a version of nvidia_driver_branch {branch} ({branch}.x.y); change one of the two",
        )
    host = values.get("llama_server_host")
    if isinstance(host, str) and not _is_loopback(host) and not values.get("llama_server_api_key"):
        report.add(
            "llama_server_host",
            host,
            "a non-loopback bind needs llama_server_api_key (ansible-vault encrypt_string --name "
            "llama_server_api_key), or bind 127.0.0.1",
        )
    _check_tls(report, values)
    _check_models(report, values, catalog)
    _check_trained_context(report, values, catalog)


def _tls_off(value: Any) -> bool:
    return value is False or (isinstance(value, str) and value.strip().lower() in ("false", "no", "off"))


def _check_tls(report: Report, values: Mapping[str, Any]) -> None:
    """A non-loopback server serves TLS, unless plaintext on the LAN is chosen explicitly; a given certificate
    comes with its key."""
    host, tls = values.get("llama_server_host"), values.get("llama_server_tls")
    if (
        isinstance(host, str)
        and not _is_loopback(host)
        and _tls_off(tls)
        and values.get("llama_server_allow_plaintext_lan") is not True
    ):
        report.add(
            "llama_server_tls",
            tls,
            f"llama_server_host is {host} (not loopback), so the API key and every prompt would cross the network "
            "in clear: remove llama_server_tls (auto serves TLS with a certificate the rig makes) or set it to "
            "auto/true; bind 127.0.0.1; or, only on a network you trust end to end, also set "
            "llama_server_allow_plaintext_lan: true",
        )
    cert, key = values.get("llama_server_tls_cert"), values.get("llama_server_tls_key")
    if bool(cert) != bool(key):
        given, missing = (
            ("llama_server_tls_cert", "llama_server_tls_key")
            if cert
            else ("llama_server_tls_key", "llama_server_tls_cert")
        )
        report.note(
            given,
            f"{given} is set but {missing} is not: give both (PEM contents, the key from Ansible Vault), "
            "or neither for the certificate the rig makes for itself",
        )
    if isinstance(cert, str) and cert and "-----BEGIN CERTIFICATE-----" not in cert:
        report.note(
            "llama_server_tls_cert", "llama_server_tls_cert is not a PEM certificate (no BEGIN CERTIFICATE line)"
        )
    if isinstance(key, str) and key and "PRIVATE KEY-----" not in key:
        report.note(
            "llama_server_tls_key", "llama_server_tls_key is not a PEM private key (no BEGIN ... PRIVATE KEY line)"
        )


def _check_trained_context(report: Report, values: Mapping[str, Any], catalog: Any) -> None:
    """ctx_size within the target's trained context, from the catalog's shape (``make discover``) when it has one;
    the cached GGUF header says the same in the controller preflight."""
    ctx, target = values.get("llama_server_ctx_size"), values.get("models_target")
    entry = catalog.get(target) if isinstance(catalog, Mapping) and isinstance(target, str) else None
    shape = entry.get("shape") if isinstance(entry, Mapping) else None
    limit = shape.get("context_length") if isinstance(shape, Mapping) else None
    if _is_int(ctx) and _is_int(limit) and 0 < limit < ctx:
        report.add(
            "llama_server_ctx_size",
            ctx,
            f"expected at most {limit}, the context {target} was trained for (its catalog shape.context_length)",
        )


def _secret(name: str, declared: Mapping[str, Any]) -> bool:
    """Whether a value must not be shown: a no_log option, a secret-like name, or a typo of one."""
    names = [name, *difflib.get_close_matches(name, sorted(declared), n=3, cutoff=0.75)]
    return any(SECRET_NAME_RE.search(n) or declared.get(n, {}).get("no_log") for n in names)


def _unknown(name: str, declared: Mapping[str, Any]) -> bool:
    if name.startswith("__") or not name.startswith(PREFIXES) or name in declared:
        return False
    return name not in RUNTIME_VARIABLES and not name.startswith(RUNTIME_PREFIXES)


def rig_problems(
    host: str,
    values: Mapping[str, Any],
    *,
    specs: Specs,
    sources: Sources,
    catalog: Any,
) -> list[str]:
    """Every problem of one rig's variables (``values``: templated where possible, Unresolved otherwise)."""
    report = Report(sources)
    declared = declared_variables(specs)
    rig_kind = values.get("rig_kind")
    if rig_kind not in KIT_VARIABLES["rig_kind"]["choices"]:
        report.add("rig_kind", rig_kind, "expected gpu or sandbox (set by the rig's group in inventory/hosts.yml)")
        rig_kind = "gpu"
    options = rig_options(specs, str(rig_kind))
    checked: dict[str, Any] = {}
    for name in sorted(values):
        value = values[name]
        secret = _secret(name, declared)
        if _unknown(name, declared):
            shown = sources.raw(name) if isinstance(value, Unresolved) else value
            report.add(name, HIDDEN if secret else shown, f"no role declares this variable{suggestion(name, declared)}")
            continue
        if name not in options or isinstance(value, Unresolved):
            continue
        converted, problem = _check_type(name, options[name], value)
        if problem:
            report.add(name, HIDDEN if secret else value, problem)
            continue
        checked[name] = converted
    _check_rules(report, checked, catalog)
    return report.problems


# ---------------------------------------------------------------------------- controller preflight
def cached_model_path(cache_dir: str, entry: Mapping[str, Any]) -> str | None:
    """Where the models play caches a pinned entry on the controller (<cache>/models/<repo>/resolve/<rev>/<file>)."""
    if not all(entry.get(key) for key in ("repo", "revision", "filename")):
        return None
    return os.path.join(
        cache_dir, "models", str(entry["repo"]), "resolve", str(entry["revision"]), str(entry["filename"])
    )


def _int_or(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def controller_preflight(
    host: str, values: Mapping[str, Any], *, sources: Sources, catalog: Any, cache_dir: str
) -> list[str]:
    """Pairing, context and memory fit from the cached GGUF headers and rig_gpu, or [] when not cached yet.

    The budget is rig_gpu.vram_mib on a rig that serves from its GPU (llama_server_memory_budget_mib when the
    inventory sets a number); a CPU rig's RAM is only known on the rig, so there only pairing and context are
    checked here (the on-rig preflight checks the fit).
    """
    if not isinstance(catalog, Mapping):
        return []
    target = catalog.get(values.get("models_target"))
    drafter_name = values.get("models_drafter") or None
    drafter = catalog.get(drafter_name) if drafter_name else None
    if not isinstance(target, Mapping) or (drafter_name and not isinstance(drafter, Mapping)):
        return []
    target_path = cached_model_path(cache_dir, target)
    drafter_path = cached_model_path(cache_dir, drafter) if isinstance(drafter, Mapping) else None
    if not target_path or not os.path.isfile(target_path):
        return []
    if drafter_name and (not drafter_path or not os.path.isfile(drafter_path)):
        return []
    gpu_access = values.get("llama_server_gpu_access", "cdi")
    on_gpu = gpu_access != "none"
    rig_gpu = values.get("rig_gpu") if isinstance(values.get("rig_gpu"), Mapping) else {}
    budget = _int_or(values.get("llama_server_memory_budget_mib"), 0) or _int_or(rig_gpu.get("vram_mib"), 0)
    if not on_gpu or budget <= 0:
        budget = 1 << 30  # the rig's RAM is not known here: only pairing and context are checked
    spec_type = values.get("llama_server_spec_type", "draft-mtp")
    settings = {
        "spec_type": spec_type,
        "ctx_size": _int_or(values.get("llama_server_ctx_size"), 8192),
        "parallel": values.get("llama_server_parallel", 1),
        "cache_type_k": values.get("llama_server_cache_type_k", "f16"),
        "cache_type_v": values.get("llama_server_cache_type_v", "f16"),
        "swa_full": boolean(values.get("llama_server_swa_full", False), strict=False),
        "kv_unified": boolean(values.get("llama_server_kv_unified", False), strict=False),
        "gpu_layers": values.get("llama_server_gpu_layers", "all") if on_gpu else 0,
        "gpu_layers_draft": values.get("llama_server_gpu_layers_draft", "all") if on_gpu else 0,
        "flash_attn": values.get("llama_server_flash_attn", "on"),
        "ubatch_size": values.get("llama_server_ubatch_size") or None,
        "memory_kind": f"VRAM of {rig_gpu.get('name') or 'the GPU'} (rig_gpu.vram_mib) on {host}" if on_gpu else "RAM",
        "headroom_mib": _int_or(values.get("llama_server_memory_headroom_mib"), 1536 if on_gpu else 256),
    }
    try:
        result = preflight(target_path, drafter_path if spec_type != "none" else None, settings, budget)
    except PreflightError as exc:
        return [f"{sources.file_of('models_target')}: cannot run the controller preflight: {exc}"]
    where = (
        sources.file_of("llama_server_ctx_size")
        if "llama_server_ctx_size" in values
        else sources.file_of("models_target")
    )
    problems = [f"{where}: {problem} (controller preflight on the cached GGUF headers)" for problem in result.problems]
    memory = values.get("llama_server_container_memory_mib")
    if result.estimate is not None and memory is not None and str(memory).strip().isdigit():
        problems += [
            f"{sources.file_of('llama_server_container_memory_mib', memory)}: {problem} (controller preflight on the "
            "cached GGUF headers)"
            for problem in check_container_memory(result.estimate, int(str(memory).strip()))
        ]
    return problems


ValueGetter = Callable[[str], Any]


def resolve_values(names: Iterable[str], get: ValueGetter) -> dict[str, Any]:
    """Template each variable through ``get``; one that cannot be templated yet becomes Unresolved."""
    values: dict[str, Any] = {}
    for name in names:
        try:
            values[name] = get(name)
        except Exception as exc:
            values[name] = Unresolved(str(exc))
    return values
