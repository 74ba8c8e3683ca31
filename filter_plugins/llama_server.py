"""Jinja filters for the llama_server role: the allow-list ruleset (logic in module_utils/nft_allowlist.py), the
preflight's memory budget and headroom as auto or MiB (module_utils/preflight/memory.py) and the line a run ends
with for each rig (the role's report.yml, and roles/rig_state's fast path from the record)."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

import rigkit  # noqa: F401  (first: it makes module_utils/ importable as ansible.module_utils)

# isort: split
from ansible.module_utils.llama_server.paths import (
    container_name,
    tls_cert_path,
    tls_dir,
    tls_key_path,
    unit_name,
    unit_path,
)
from ansible.module_utils.llama_server.settings import argv as server_argv
from ansible.module_utils.llama_server.settings import variables as server_variables
from ansible.module_utils.net_address import is_loopback, serves_tls
from ansible.module_utils.nft_allowlist import AllowListError, normalise_networks, render_ruleset
from ansible.module_utils.preflight.memory import BUDGET_VARIABLE, memory_budget_mib, memory_headroom_mib

from rigkit.fleet.gateway import alias_of
from rigkit.validation.rules import role_defaults, server_problems


def _server_argv(names: Any, values: Any) -> list[str]:
    """llama-server's argv from the settings table (module_utils/llama_server/settings.py): ``names`` are the
    variables ``llama_server_setting_variables`` lists, ``values`` their values in the same order."""
    return server_argv(dict(zip(names, values, strict=True)))


def _setting_variables(_: Any = None) -> list[str]:
    return server_variables()


# Read beside the role's own, "" when the play does not define them.
_BESIDE = ("rig_kind", "node_exporter_port")


def _rule_variables(_: Any = None) -> list[str]:
    """The variables the server's rules read: the role's own (its defaults), the rig's kind and the node
    exporter's port (its listener beside the server's)."""
    return [*sorted(role_defaults("llama_server")), *_BESIDE]


def _problems(names: Any, values: Any, host: str) -> list[str]:
    """The controller's rules for the server's settings (rigkit/validation/rules.py, server_problems), on the
    values the role runs with: ``names`` from llama_server_rule_variables, ``values`` in the same order."""
    given = {name: value for name, value in zip(names, values, strict=True) if not (name in _BESIDE and value == "")}
    return server_problems(str(host), given)


def _model_alias(catalog: Any, target: Any) -> str:
    """The name the server answers to (--alias, /v1/models): the target's catalog alias, or its catalog key, the
    same name the fleet gateway routes by; empty without a target."""
    return alias_of(catalog, str(target)) if target else ""


def _nft_allowlist(networks: Any, instance: str, port: Any) -> str:
    """The allow-list ruleset (nft -f) of one server instance; bad entries fail naming the variable."""
    try:
        return render_ruleset(str(instance), int(port), normalise_networks(networks))
    except (AllowListError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(str(exc)) from exc


def _memory_headroom(value: Any, on_gpu: Any) -> int:
    """llama_server_memory_headroom_mib in MiB (auto: the GPU or CPU rig's figure); a bad value fails naming it."""
    try:
        return memory_headroom_mib(value, on_gpu=bool(on_gpu))
    except ValueError as exc:
        raise AnsibleFilterError(f"{exc}: fix it in the rig's inventory file, or remove it for auto") from None


def _memory_budget(value: Any, on_gpu: Any, vram_mib: Any = None, ram_mib: Any = None) -> int:
    """llama_server_memory_budget_mib in MiB (auto: rig_gpu.vram_mib on a GPU rig, the facts' RAM on a CPU rig)."""
    try:
        budget = memory_budget_mib(value, on_gpu=bool(on_gpu), vram_mib=vram_mib, ram_mib=ram_mib)
    except ValueError as exc:
        raise AnsibleFilterError(f"{exc}: fix it in the rig's inventory file, or remove it for auto") from None
    if budget is not None:
        return budget
    missing = (
        f"rig_gpu.vram_mib is {vram_mib!r}: set rig_gpu in the rig's host_vars (make discover writes it)"
        if on_gpu
        else f"the rig's RAM (ansible_facts memtotal_mb) is {ram_mib!r}: gather facts before the role"
    )
    raise AnsibleFilterError(f"{BUDGET_VARIABLE} is auto but {missing}, or set {BUDGET_VARIABLE} to a number of MiB")


def _report_line(report: Any, rig: str, instance: str, url: str, spec_type: str, canary_tokens: Any) -> str:
    """Where the server answers and the figures of the canary it passed (``report``: llama_server_probe's result,
    or the fast path's figures of the unit's current run)."""
    figures = report if isinstance(report, dict) else {}
    drafted = int(figures.get("draft_n") or 0)
    if drafted > 0:
        drafting = (
            f"draft acceptance {float(figures.get('acceptance') or 0):.2f} "
            f"({int(figures.get('draft_n_accepted') or 0)} accepted / {drafted} drafted)"
        )
    else:
        drafting = "no drafting"
    speed = float(figures.get("predicted_per_second") or 0)
    return (
        f'llama-server "{instance}" on {rig} answers at {url} ({figures.get("build_info")}, {spec_type}): '
        f"{drafting}, {speed:.1f} tokens/s on a {canary_tokens}-token canary."
    )


def _answer(report: Any, rig: str, instance: str, url: str, spec_type: str, canary_tokens: Any, keyed: Any) -> dict:
    """What the run's closing summary (callback_plugins/rigkit.py) shows of one rig's server: its report line, where
    it answers, whether a client needs its key, and the certificate to verify it against (TLS)."""
    return {
        "rig": rig,
        "line": _report_line(report, rig, instance, url, spec_type, canary_tokens),
        "url": url,
        "keyed": bool(keyed),
        "tls_cert": tls_cert_path(instance) if str(url).startswith("https://") else "",
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "llama_server_memory_budget": _memory_budget,
            "llama_server_memory_headroom": _memory_headroom,
            "llama_server_nft_allowlist": _nft_allowlist,
            "llama_server_report_line": _report_line,
            "llama_server_answer": _answer,
            "llama_server_argv": _server_argv,
            "llama_server_setting_variables": _setting_variables,
            "llama_server_rule_variables": _rule_variables,
            "llama_server_problems": _problems,
            "rigkit_is_loopback": is_loopback,
            "rigkit_model_alias": _model_alias,
            "rigkit_serves_tls": serves_tls,
            "rigkit_server_tls_dir": tls_dir,
            "rigkit_server_container": container_name,
            "rigkit_server_unit": unit_name,
            "rigkit_server_unit_path": unit_path,
            "rigkit_server_tls_cert_path": tls_cert_path,
            "rigkit_server_tls_key_path": tls_key_path,
        }
