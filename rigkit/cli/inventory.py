"""`rigkit hosts` and `rigkit check-host`: which rigs the inventory names (make's host= guard)."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Any

from rigkit.paths import inventory_sources


def known_rigs(pattern: str = "rigs") -> list[str]:
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    manager = InventoryManager(loader=DataLoader(), sources=inventory_sources())
    return sorted(host.name for host in manager.get_hosts(pattern))


# Groups make's host= may name besides single hosts.
KNOWN_GROUPS = ("rigs", "gpu_rigs", "sandbox_rigs", "fleet_services")


@functools.cache
def _load_plugins() -> None:
    """Ansible's plugins, once per process: lookups (env, password...) in the variables need them."""
    from ansible.plugins.loader import init_plugin_loader

    init_plugin_loader()


def host_values(host: str, names: tuple[str, ...]) -> dict[str, Any]:
    """These variables of ``host`` as Ansible gives them (templated); absent ones are left out. LookupError
    for a host the inventory does not have."""
    found = pattern_values(host, names)
    if host not in found:
        raise LookupError(f"unknown host {host}. Known rigs: {', '.join(known_rigs())}")
    return found[host]


def pattern_values(pattern: str, names: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """{host: these variables (templated)} of every host of ``pattern``, the inventory read once."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    _load_plugins()
    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=inventory_sources())
    manager = VariableManager(loader=loader, inventory=inventory)
    found: dict[str, dict[str, Any]] = {}
    for host in inventory.get_hosts(pattern):
        variables = manager.get_vars(host=host)
        templar = Templar(loader=loader, variables=variables)
        found[host.name] = {name: templar.template(variables[name]) for name in names if name in variables}
    return found


def inventory_yaml_errors() -> list[str]:
    """file:line:column of each YAML syntax error in the inventory (Ansible's own message hides the mark)."""
    from rigkit.inventory_files import inventory_yaml_errors as errors

    return errors(os.path.dirname(source) if os.path.isfile(source) else source for source in inventory_sources())


def check_host(name: str) -> int:
    yaml_errors = inventory_yaml_errors()
    if yaml_errors:
        print("\n".join(f"rigkit: {error}" for error in yaml_errors), file=sys.stderr)
        return 2
    rigs = known_rigs()
    services = known_rigs("fleet_services")
    wanted = [part for part in name.split(",") if part]
    unknown = [part for part in wanted if part not in rigs + services and part not in KNOWN_GROUPS]
    if not wanted or unknown:
        print(
            f"rigkit: unknown host {', '.join(unknown) or repr(name)}. Known rigs: {', '.join(rigs)}; fleet "
            f"services: {', '.join(services) or 'none'}.\n"
            "Add a rig with make discover host=NAME address=HOST (or one line in inventory/hosts.yml and a file in "
            "inventory/host_vars/, see README).",
            file=sys.stderr,
        )
        return 2
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    check = commands.add_parser("check-host", help="fail unless NAME (or a comma list) names rigs of the inventory")
    check.add_argument("name")
    check.set_defaults(func=lambda args: check_host(args.name))
    hosts = commands.add_parser("hosts", help="list the rigs")
    hosts.set_defaults(func=lambda _args: print("\n".join(known_rigs())) or 0)
