"""Controller-side validation of one rig's description, before any rig is contacted.

Every variable of a rig (inventory, extra vars) is checked against the ``meta/argument_specs.yml`` of each role
entry point that will run on it (types and choices, with Ansible's own ArgumentSpecValidator, as
``ansible.builtin.validate_argument_spec`` does), plus the rules a spec cannot express (ranges, min <= max,
rig_gpu's fields, a driver version within its branch, a non-loopback bind without an API key, catalog names and
``pairs_with``). A variable that carries a role's prefix but that no spec (nor KIT_VARIABLES below) declares is
refused with a "did you mean" suggestion. Each problem names the file that set the variable, the variable, its
value and what is accepted; all problems of a rig are returned at once.

Which file set a variable is rigkit/inventory_files.py's job; the checks on cached GGUF headers are
rigkit/validation/preflight.py's.
"""

from __future__ import annotations

import difflib
import functools
import ipaddress
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.docker_daemon_config import exposure_problems
from ansible.module_utils.llama_server.settings import extra_args_problems
from ansible.module_utils.model_catalog import CATALOG_PATH, CatalogError, deployable_entry, host_pin_refusal
from ansible.module_utils.net_address import is_loopback, serves_tls
from ansible.module_utils.nft_allowlist import AllowListError, normalise_networks
from ansible.module_utils.nvidia_compat import driver_version_problem, pci_device_id
from ansible.module_utils.preflight.memory import MEMORY_SETTINGS, MemorySettingError, auto_or_mib

import rigkit
from rigkit.fleet.monitor import node_exporter_port
from rigkit.inventory_files import Sources, show
from rigkit.validation.compat import ROLES as COMPAT_ROLES
from rigkit.validation.compat import Lookup, archive_findings, compat_findings
from rigkit.validation.known_issues import known_issue_problems
from rigkit.validation.server_options import OPTIONS_FILE, unknown_flags
from rigkit.validation.variables import (
    API_KEY_RE,
    API_KEY_SHAPE,
    COMMIT_RE,
    COMPUTE_CAPABILITY_RE,
    CUDA_ARCHITECTURES_RE,
    ENTRY_POINTS,
    GPU_LAYER_VARIABLES,
    KIT_VARIABLES,
    LOG_SIZE_RE,
    MIN_CONTAINER_MEMORY_MIB,
    PREFIXES,
    RANGES,
    RIG_GPU_FIELDS,
    RUNTIME_PREFIXES,
    RUNTIME_VARIABLES,
    SHA256_RE,
)

Specs = dict[str, dict[str, dict[str, Any]]]
# Values never shown in a message: no_log options and anything named like a secret.
SECRET_NAME_RE = re.compile(r"(tok|api_key|password|secret)", re.IGNORECASE)
HIDDEN = "<hidden>"


class Unresolved:
    """A variable whose value cannot be templated on the controller yet (it depends on a fact or a role)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


# libyaml's parser where PyYAML has it (the validation play parses every role's argument specs for every rig).
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# ------------------------------------------------------------------------------------------ specs
def load_specs(roles_dir: str) -> Specs:
    """{role: {entry point: options}} from every role's meta/argument_specs.yml."""
    specs: Specs = {}
    for role in sorted(os.listdir(roles_dir)):
        path = os.path.join(roles_dir, role, "meta", "argument_specs.yml")
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as handle:
            data = yaml.load(handle, Loader=SAFE_LOADER) or {}  # noqa: S506 - a safe loader
        specs[role] = {
            entry: dict((body or {}).get("options") or {}) for entry, body in (data.get("argument_specs") or {}).items()
        }
    return specs


def plain_defaults(roles_dir: str, role: str) -> dict[str, Any]:
    """A role's defaults that need no templating (the controller preflight's fallbacks: the role's own values)."""
    path = os.path.join(roles_dir, role, "defaults", "main.yml")
    with open(path, encoding="utf-8") as handle:
        data = yaml.load(handle, Loader=SAFE_LOADER) or {}  # noqa: S506 - a safe loader
    return {name: value for name, value in data.items() if not (isinstance(value, str) and "{{" in value)}


@functools.cache
def role_defaults(*roles: str) -> dict[str, Any]:
    """The plain defaults of these roles of the kit, merged in order (what a rule falls back to)."""
    merged: dict[str, Any] = {}
    for role in roles:
        merged.update(plain_defaults(str(rigkit.REPO / "roles"), role))
    return merged


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


# --------------------------------------------------------------------------------------- problems
def suggestion(name: str, known: Iterable[str], cutoff: float = 0.75) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=cutoff)
    return f"; did you mean {' or '.join(close)}?" if close else ""


class Report:
    """All problems of one rig, each prefixed with the file that set the variable."""

    def __init__(self, sources: Sources, *, models_needed: bool = True) -> None:
        self.sources = sources
        self.problems: list[str] = []
        # Models not pinned yet stop a deploy, not an image build (make image: models_needed False).
        self.models_needed = models_needed
        # False once a value itself is wrong: the memory preflight would read it. Missing pins leave it True.
        self.values_sound = True

    def add(self, variable: str, value: Any, expected: str, *, field: str | None = None, shown: Any = None) -> None:
        """``shown``: what the message prints instead of ``value`` (a copy with its secrets hidden)."""
        label = f"{variable}.{field}" if field else variable
        whole = None if field or value == HIDDEN else value
        printed = show(value if shown is None else shown)
        self.problems.append(f"{self.sources.file_of(variable, whole)}: {label} is {printed}; {expected}")
        self.values_sound = False

    def note(self, variable: str, text: str) -> None:
        self.problems.append(f"{self.sources.file_of(variable)}: {text}")
        self.values_sound = False

    def unpinned(self, text: str) -> None:
        """Models not pinned yet: a problem, but every value is sound, so the memory preflight can still run."""
        if self.models_needed:
            self.problems.append(text)


def _plain_copy(value: Any) -> Any:
    """Plain dicts and lists in place of Ansible's lazily templated containers: the validator deep-copies what it
    checks, and a deep copy of a lazy container templates it again (most of the validation's time, measured)."""
    if isinstance(value, Mapping):
        return {key: _plain_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain_copy(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain_copy(item) for item in value)
    return value


def _check_type(name: str, option: Mapping[str, Any], value: Any) -> tuple[Any, str | None]:
    """(converted value, problem) with Ansible's ArgumentSpecValidator, as validate_argument_spec checks it."""
    spec = {key: option[key] for key in ("type", "choices", "elements", "no_log") if key in option}
    if isinstance(value, bool) and option.get("type", "str") == "str":
        return value, _bare_boolean(value, option)
    result = ArgumentSpecValidator({name: spec}).validate({name: _plain_copy(value)})
    if result.error_messages:
        text = result.error_messages[0]
        if "choices" in option:
            return value, f"expected one of {', '.join(str(c) for c in option['choices'])}"
        return value, f"expected {option.get('type', 'str')} ({text})"
    return result.validated_parameters.get(name, value), None


# YAML 1.1 (Ansible's) reads these bare words as booleans; a string setting needs them quoted.
BARE_BOOLEANS = {True: ("on", "yes", "true", "y"), False: ("off", "no", "false", "n")}


def _bare_boolean(value: bool, option: Mapping[str, Any]) -> str:
    """The problem of a boolean given to a string setting: most often a bare on/off/yes/no that YAML read as one."""
    choices = [str(choice) for choice in option.get("choices", [])]
    word = next((w for w in BARE_BOOLEANS[value] if w in choices), None)
    accepted = f"expected one of {', '.join(choices)}" if choices else "expected a string"
    if word:
        return f'{accepted}; YAML reads a bare {word} as the boolean {str(value).lower()}: quote it: "{word}"'
    return f"{accepted}; YAML read a bare word as the boolean {str(value).lower()}: quote the value"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_range(report: Report, name: str, value: Any) -> None:
    low, high, what = RANGES[name]
    if value is None or not _is_int(value):
        return
    if value < low or (high is not None and value > high):
        report.add(name, value, f"expected {what}")


def _check_memory_settings(report: Report, values: Mapping[str, Any]) -> None:
    """The preflight's budget and headroom: auto or MiB in range, by the rule the role's filters apply."""
    for name in MEMORY_SETTINGS:
        if name in values:
            try:
                auto_or_mib(name, values[name])
            except MemorySettingError as exc:
                report.add(name, values[name], f"expected {exc.accepted}")


def _check_gpu_layers(report: Report, name: str, value: Any) -> None:
    text = str(value).strip().lower()
    if isinstance(value, bool) or not (text in ("all", "auto") or re.fullmatch(r"[0-9]+", text)):
        report.add(name, value, 'expected "all", "auto" or a number of layers >= 0')


def _check_container_limits(report: Report, values: Mapping[str, Any]) -> None:
    memory = values.get("llama_server_container_memory_mib")
    if memory is not None and str(memory).strip().lower() != "auto":
        number = memory if _is_int(memory) else (int(memory) if re.fullmatch(r"[0-9]+", str(memory).strip()) else None)
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
            if isinstance(host, str) and is_loopback(host):
                report.add(
                    "llama_server_allowed_networks",
                    networks,
                    f"llama_server_host is {host}, so no other machine can connect: set llama_server_host to the "
                    "rig's LAN address (with llama_server_api_key), or leave the allow-list empty",
                )
    size = values.get("llama_server_container_log_max_size")
    if size is not None and not LOG_SIZE_RE.fullmatch(str(size)):
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
    if not isinstance(capability, str) or not COMPUTE_CAPABILITY_RE.fullmatch(capability):
        report.add(
            "rig_gpu",
            capability,
            'expected MAJOR.MINOR such as "8.6" (quoted: a YAML number loses the digits)',
            field="compute_capability",
        )
    if "pci_device_id" in rig_gpu and pci_device_id(rig_gpu["pci_device_id"]) is None:
        report.add(
            "rig_gpu",
            rig_gpu["pci_device_id"],
            'expected the PCI device id as lspci -nn or nvidia-smi print it, such as "0x1f95"',
            field="pci_device_id",
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


def _check_pins(report: Report, rig: str, values: Mapping[str, Any], catalog: Mapping[str, Any]) -> None:
    """Every model the rig needs that is not pinned yet, with the one command that pins them (the kit never
    deploys an unverified file), and, when the rig prunes, every kept model that cannot be resolved."""
    refusal = host_pin_refusal(rig, dict(catalog), [values.get("models_target"), values.get("models_drafter")])
    if refusal:
        report.unpinned(refusal)
    keep = values.get("models_keep")
    if values.get("models_prune") is True and isinstance(keep, list):
        for name in keep:
            try:
                deployable_entry(dict(catalog), str(name))
            except CatalogError as exc:
                report.add("models_keep", keep, f"names {name}, which cannot be resolved: {exc}")


# llama-server flags whose value is a secret: a refusal names the flag, never its value.
SECRET_FLAGS = ("--api-key", "--hf-token", "-hft")


def _secrets_hidden(argv: list[Any]) -> list[Any]:
    """``argv`` with the value of every SECRET_FLAGS flag (``--flag VALUE`` or ``--flag=VALUE``) replaced by HIDDEN."""
    hidden: list[Any] = []
    after_secret = False
    for item in argv:
        text = str(item)
        if after_secret:
            hidden.append(HIDDEN)
        elif "=" in text and text.split("=", 1)[0] in SECRET_FLAGS:
            hidden.append(f"{text.split('=', 1)[0]}={HIDDEN}")
        else:
            hidden.append(item)
        after_secret = not after_secret and text in SECRET_FLAGS
    return hidden


def _check_extra_args(report: Report, values: Mapping[str, Any]) -> None:
    extra = values.get("llama_server_extra_args")
    if not isinstance(extra, list):
        return
    for flag in extra_args_problems(extra):
        report.add(
            "llama_server_extra_args",
            extra,
            f"sets {flag}, which the kit manages (llama-server takes the last one: it would override the kit's own, "
            "or put a secret into the unit's argv); set the kit's variable for it instead (llama_server_host, "
            "llama_server_port, llama_server_api_key, llama_server_tls, models_*, llama_server_spec_*, "
            "llama_server_ctx_size, …; roles/llama_server/README.md)",
            shown=_secrets_hidden(extra),
        )
    commit = values.get("llamacpp_image_commit") or role_defaults("llamacpp_image")["llamacpp_image_commit"]
    for flag in unknown_flags(extra, str(commit)):
        report.add(
            "llama_server_extra_args",
            extra,
            f"names {flag}, which the pinned llama-server does not accept: it would stop at start with "
            f'"error: invalid argument: {flag}"; remove it (the options it accepts: '
            f"{OPTIONS_FILE.relative_to(rigkit.REPO)})",
            shown=_secrets_hidden(extra),
        )


def _check_models(report: Report, rig: str, values: Mapping[str, Any], catalog: Any) -> None:
    if not isinstance(catalog, Mapping) or not catalog:
        return  # the catalog's own check (catalog_problems) reports it
    _check_pins(report, rig, values, catalog)
    target = values.get("models_target")
    if target in (None, ""):
        report.note("models_target", "models_target is not set; name the catalog entry to serve (a target)")
    else:
        _catalog_name(report, catalog, "models_target", target, "target")
    drafter = values.get("models_drafter")
    if drafter in (None, ""):
        return
    # A classic draft model (draft-simple) may be any model with the target's vocabulary, itself included; MTP
    # drafting needs an assistant, a catalog drafter.
    simple = values.get("llama_server_spec_type") == "draft-simple"
    entry = _catalog_name(report, catalog, "models_drafter", drafter, None if simple else "drafter")
    pairs_with = entry.get("pairs_with") if isinstance(entry, Mapping) else None
    if pairs_with and target in catalog and pairs_with != target:
        report.add(
            "models_drafter",
            drafter,
            f"that drafter pairs with {pairs_with} (its catalog pairs_with), not with models_target {target}: "
            f"set models_target: {pairs_with}, or a drafter whose pairs_with is {target}",
        )


def _check_image_inputs(report: Report, values: Mapping[str, Any]) -> None:
    """The llama.cpp image's inputs the inventory sets (the roles' own defaults are pinned in the repo)."""
    commit = values.get("llamacpp_image_commit")
    if isinstance(commit, str) and not COMMIT_RE.fullmatch(commit):
        report.add("llamacpp_image_commit", commit, "expected a full 40-character llama.cpp commit (lowercase hex)")
    tarball = values.get("llamacpp_image_source") == "tarball"
    sha256 = values.get("llamacpp_image_source_sha256")
    if tarball and isinstance(sha256, str) and not SHA256_RE.fullmatch(sha256):
        report.add("llamacpp_image_source_sha256", sha256, "expected the tarball's sha256 (64 lowercase hex digits)")
    if tarball and values.get("llamacpp_image_source_url") == "":
        report.add("llamacpp_image_source_url", "", "a tarball source needs the tarball's URL")
    architectures = values.get("llamacpp_image_cuda_architectures")
    if isinstance(architectures, str) and not CUDA_ARCHITECTURES_RE.fullmatch(architectures):
        report.add(
            "llamacpp_image_cuda_architectures",
            architectures,
            'expected CMAKE_CUDA_ARCHITECTURES such as "86" or "75-real;86-real" (or set rig_gpu.compute_capability)',
        )


def _check_server(report: Report, values: Mapping[str, Any]) -> None:
    """The server's own settings, each rule once: the controller's validation and the llama_server role's check on
    the rig (server_problems, filter llama_server_problems) both run these."""
    for name in RANGES:
        if name in values and name.startswith("llama_server_"):
            _check_range(report, name, values[name])
    _check_container_limits(report, values)
    _check_ports(report, values)
    n_min, n_max = values.get("llama_server_spec_draft_n_min"), values.get("llama_server_spec_draft_n_max")
    if _is_int(n_min) and _is_int(n_max) and n_min > n_max:
        report.add("llama_server_spec_draft_n_min", n_min, f"expected at most llama_server_spec_draft_n_max ({n_max})")
    host = values.get("llama_server_host")
    if isinstance(host, str) and not is_loopback(host) and not values.get("llama_server_api_key"):
        report.add(
            "llama_server_host",
            host,
            "a non-loopback bind needs llama_server_api_key (ansible-vault encrypt_string --name "
            "llama_server_api_key), or bind 127.0.0.1",
        )
    _check_tls(report, values)
    _check_api_keys(report, values, ("llama_server_api_key",))
    _check_cors(report, values.get("llama_server_cors_origins"))
    _check_extra_args(report, values)


class _TheRig:
    """Where a problem found on the rig side is said to come from: the rig (the controller names the file)."""

    def __init__(self, host: str) -> None:
        self.host = host

    def file_of(self, variable: str, value: Any = None) -> str:
        return self.host

    def raw(self, variable: str) -> Any:
        return None


@functools.cache
def _server_options() -> dict[str, dict[str, Any]]:
    return load_specs(str(rigkit.REPO / "roles"))["llama_server"]["main"]


def server_problems(host: str, values: Mapping[str, Any]) -> list[str]:
    """The server's rules for the llama_server role's own check, as the controller runs them: each value first
    against the role's argument spec (types and choices), then _check_server; the controller's sentences, each
    prefixed with the rig's name."""
    report = Report(_TheRig(host))  # type: ignore[arg-type]
    options, checked = _server_options(), dict(values)
    for name, value in values.items():
        if name not in options:
            continue
        converted, problem = _check_type(name, options[name], value)
        if problem:
            report.add(name, HIDDEN if _secret(name, options) else value, problem)
            checked.pop(name)
        else:
            checked[name] = converted
    _check_server(report, checked)
    return report.problems


def _check_rules(report: Report, rig: str, values: Mapping[str, Any], catalog: Any) -> None:
    for name in RANGES:
        if name in values and not name.startswith("llama_server_"):
            _check_range(report, name, values[name])
    for name in GPU_LAYER_VARIABLES:
        if name in values:
            _check_gpu_layers(report, name, values[name])
    _check_memory_settings(report, values)
    _check_server(report, values)
    if values.get("rig_kind") == "gpu" and "rig_gpu" in values:
        _check_rig_gpu(report, values["rig_gpu"])
    version = values.get("nvidia_driver_version")
    if isinstance(version, str) and (
        why := driver_version_problem(
            values.get("nvidia_driver_source", role_defaults("nvidia_driver")["nvidia_driver_source"]),
            values.get("nvidia_driver_branch"),
            version,
        )
    ):
        report.add("nvidia_driver_version", version, why)
    _check_api_keys(report, values, ("fleet_gateway_api_key",))
    for variable, value, why in node_exporter_problems(values):
        report.add(variable, HIDDEN if variable == "node_exporter_password" else value, why)
    for problem in exposure_problems(values.get("docker_daemon_options")):
        report.note("docker_daemon_options", f"docker_daemon_options.{problem}")
    with_defaults = {**role_defaults(*COMPAT_ROLES), **values}
    for variable, value, why in [*compat_findings(with_defaults), *known_issue_problems(with_defaults)]:
        report.add(variable, value, why)
    _check_image_inputs(report, values)
    _check_models(report, rig, values, catalog)
    _check_trained_context(report, values, catalog)


# ------------------------------------------------------------------------------------------------- ports
# Both listeners run unprivileged in the rig's own network namespace (llama-server as uid 10001 with no capabilities,
# Debian's node exporter as the prometheus user), where the kernel keeps ports below this for root.
UNPRIVILEGED_PORT_START = 1024
_LISTENERS = {
    "llama_server_port": "llama-server runs as uid 10001 with no capabilities",
    "node_exporter_port": "the node exporter runs as the prometheus user",
}


def _check_ports(report: Report, values: Mapping[str, Any]) -> None:
    """Ports a listener cannot bind on the rig: below the unprivileged range, or the one the other kit service holds."""
    server = values.get("llama_server_port", role_defaults("llama_server")["llama_server_port"])
    exporter = values.get("node_exporter_port")
    if exporter is None and _is_int(server):
        exporter = node_exporter_port(values.get("rig_kind", "gpu"), server)
    for variable, port in (("llama_server_port", server), ("node_exporter_port", exporter)):
        if _is_int(port) and 0 < port < UNPRIVILEGED_PORT_START:
            report.add(
                variable,
                port,
                f"expected {UNPRIVILEGED_PORT_START}-65535: {_LISTENERS[variable]} in the rig's own network, where the "
                f"kernel keeps ports below {UNPRIVILEGED_PORT_START} for root (it would fail with Permission denied)",
            )
    if _is_int(server) and server == exporter:
        variable = "node_exporter_port" if "node_exporter_port" in values else "llama_server_port"
        report.add(
            variable,
            server,
            f"llama-server and the node exporter would both listen on port {server} of the rig: whichever starts "
            "second cannot bind it; give node_exporter_port another port (9100 unless set)",
        )


# A host name as SSH and getaddrinfo take it: dot-separated labels of letters, digits, - and _ (mDNS and /etc/hosts
# names carry _), none longer than 63, 253 in all.
_HOST_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
HOST_NAME_RE = re.compile(rf"^(?=.{{1,253}}\Z){_HOST_LABEL}(?:\.{_HOST_LABEL})*\.?\Z")


def connection_host_problem(value: str) -> str | None:
    """Why ``ansible_host`` is neither a host name nor an address (SSH would fail to resolve it), or None."""
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        pass
    if HOST_NAME_RE.match(value):
        return None
    if not value:
        hint = "empty: remove it (the rig's inventory name is used) or give the rig's name or address"
    elif "://" in value:
        hint = "a URL: give the host name or address alone"
    elif "@" in value:
        hint = "user@host: put the user in ansible_user and the host alone here"
    elif re.search(r":[0-9]+\Z", value):
        hint = "host:port: put the port in ansible_port and the host alone here"
    elif any(len(label) > 63 for label in value.split(".")) or len(value) > 253:
        hint = "longer than a host name can be (63 characters a label, 253 in all)"
    else:
        hint = "spaces or characters no host name has"
    return f"expected a host name (desktop3050.local) or an address (192.168.1.20); this is {hint}"


# ------------------------------------------------------------------------------------------------- API keys
API_KEYS = ("llama_server_api_key", "fleet_gateway_api_key")


def api_key_problem(variable: str, value: Any) -> str | None:
    """Why ``value`` cannot be the API key ``variable`` (never showing it), or None. The rigs' rule (validation
    play) and the gateway's (roles/fleet_gateway/tasks/validate.yml, filter fleet_api_key_problem) alike."""
    if isinstance(value, str) and API_KEY_RE.match(value):
        return None
    kind = "a string" if isinstance(value, str) else type(value).__name__
    ends = " ending in a newline" if isinstance(value, str) and value.endswith("\n") else ""
    return (
        f"expected {API_KEY_SHAPE} (got {kind}{ends}, {len(str(value))} characters); generate one with "
        f"`openssl rand -hex 32 | tr -d '\\n' | ansible-vault encrypt_string --stdin-name {variable}`"
    )


def _check_api_keys(report: Report, values: Mapping[str, Any], variables: Iterable[str] = API_KEYS) -> None:
    """A key that is set has the one shape every key file, env file and header carries whole (empty: no key)."""
    for variable in variables:
        value = values.get(variable)
        if value not in (None, "") and (why := api_key_problem(variable, value)):
            report.add(variable, HIDDEN, why)


CORS_ORIGIN_RE = re.compile(r"https?://[A-Za-z0-9.-]+(?::[0-9]{1,5})?|https?://\[[0-9A-Fa-f:.]+\](?::[0-9]{1,5})?")


def _check_cors(report: Report, value: Any) -> None:
    if value is None or value in ("*", "localhost"):
        return
    origins = str(value).split(",")
    if not all(CORS_ORIGIN_RE.fullmatch(origin.strip()) for origin in origins):
        report.add(
            "llama_server_cors_origins",
            value,
            'expected "localhost", "*" or comma-separated origins such as "https://chat.example.lan:3000"',
        )


def _tls_off(value: Any) -> bool:
    return value is False or (isinstance(value, str) and value.strip().lower() in ("false", "no", "off"))


def _check_tls(report: Report, values: Mapping[str, Any]) -> None:
    """A non-loopback server serves TLS, unless plaintext on the LAN is chosen explicitly; a given certificate
    comes with its key."""
    host, tls = values.get("llama_server_host"), values.get("llama_server_tls")
    if (
        isinstance(host, str)
        and not is_loopback(host)
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


# The node exporter's password travels in a basic-auth header: long enough, printable, no whitespace.
NODE_EXPORTER_PASSWORD_RE = re.compile(r"[\x21-\x7e]{16,256}")


def node_exporter_problems(values: Mapping[str, Any]) -> list[tuple[str, Any, str]]:
    """(variable, value, why) for a node exporter that would answer anyone on the network: off loopback it serves
    TLS, and with TLS only to node_exporter_username with a password from Vault. The controller's validation and the
    node_exporter role (filter node_exporter_problems) both ask this."""
    host = values.get("node_exporter_host", "127.0.0.1")
    tls = values.get("node_exporter_tls", "auto")
    problems: list[tuple[str, Any, str]] = []
    if not is_loopback(host) and not serves_tls(tls, host):
        problems.append(
            (
                "node_exporter_tls",
                tls,
                f"node_exporter_host is {host} (not loopback), so every rig fact would cross the network in clear to "
                "anyone who asks: remove node_exporter_tls (auto serves TLS) or keep node_exporter_host on 127.0.0.1",
            )
        )
    elif serves_tls(tls, host) and not NODE_EXPORTER_PASSWORD_RE.fullmatch(
        str(values.get("node_exporter_password") or "")
    ):
        problems.append(
            (
                "node_exporter_password",
                values.get("node_exporter_password"),
                "with TLS the node exporter answers only node_exporter_username with this password: 16 to 256 "
                "printable characters without spaces, from Vault (ansible-vault encrypt_string --name "
                "node_exporter_password)",
            )
        )
    return problems


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
    # A declared name is what it is; only an unknown one may be a typo of a secret's name.
    names = [name] if name in declared else [name, *difflib.get_close_matches(name, sorted(declared), n=3, cutoff=0.75)]
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
    return rig_report(host, values, specs=specs, sources=sources, catalog=catalog).problems


def rig_report(
    host: str,
    values: Mapping[str, Any],
    *,
    specs: Specs,
    sources: Sources,
    catalog: Any,
    models_needed: bool = True,
) -> Report:
    """rig_problems' Report: its problems and whether the values are sound enough for the memory preflight.
    ``models_needed`` False (an image build) leaves models not pinned yet out of the problems."""
    report = Report(sources, models_needed=models_needed)
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
    _check_rules(report, host, checked, catalog)
    if isinstance(values.get("ansible_host"), str) and (why := connection_host_problem(values["ansible_host"])):
        report.add("ansible_host", values["ansible_host"], why)
    return report


def archive_problems(host: str, values: Mapping[str, Any], *, sources: Sources, lookup: Lookup) -> list[str]:
    """A pinned driver Debian's archive no longer carries (compat_plan.archive_findings over ``lookup``, the
    controller's cached indexes), as the validation play refuses it: file, variable, value, the version to move to."""
    report = Report(sources)
    for variable, value, why in archive_findings(host, {**role_defaults(*COMPAT_ROLES), **values}, lookup):
        report.add(variable, value, why)
    return report.problems


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
