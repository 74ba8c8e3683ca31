"""`rigkit observe` (make observe): the way into the fleet services of each fleet_services host: the gateway's URL
and one curl that works, Prometheus's and Alertmanager's addresses, and ready queries. Reads the inventory only."""

from __future__ import annotations

import argparse
import shlex
import subprocess

from rigkit import REPO

# isort: split
from ansible.module_utils.net_address import is_wildcard

from rigkit.cli.inventory import host_values, known_rigs
from rigkit.fleet.monitor import QUERIES
from rigkit.validation.rules import plain_defaults

NAMES = (
    "ansible_connection",
    "ansible_host",
    "fleet_gateway_bind",
    "fleet_gateway_port",
    "fleet_gateway_stats_port",
    "fleet_monitor_prometheus_port",
    "fleet_monitor_alertmanager_port",
    "fleet_sandbox_key_file",
)
# roles/fleet_gateway's certificate (its __fleet_gateway_cert_path; tests/unit/test_fleet_monitor.py compares them)
GATEWAY_CERT = "/etc/haproxy/rigkit/gateway.pem"
QUERY_TITLES = {
    "acceptance_1h": "draft acceptance per rig, last hour",
    "decode_tps_1h": "decode tokens/s per rig, last hour (compare with `make bench-report`)",
    "server_up": "which servers answer",
    "gpu_temperature": "GPU temperature per rig, °C (from the GPU rigs' node exporters)",
}


def describe(host: str, values: dict) -> list[str]:
    roles = REPO / "roles"
    settings = {**plain_defaults(str(roles), "fleet_gateway"), **plain_defaults(str(roles), "fleet_monitor"), **values}
    bind = str(settings["fleet_gateway_bind"])
    in_container = values.get("ansible_connection") == "community.docker.docker"
    target = str(values.get("ansible_host") or host)
    # a sandbox's container shares this machine's loopback; a wildcard bind elsewhere is reached at the host
    address = ("127.0.0.1" if in_container else target) if is_wildcard(bind) else bind
    url = f"https://{address}:{settings['fleet_gateway_port']}"
    fetch = f"docker exec {target} cat {GATEWAY_CERT}" if in_container else f"ssh {target} sudo cat {GATEWAY_CERT}"
    key = (
        f"$(cat {shlex.quote(str(values['fleet_sandbox_key_file']))})"
        if values.get("fleet_sandbox_key_file")
        else "$FLEET_KEY"
    )
    where = "this machine" if in_container else target
    lines = [
        f"fleet services on {host} ({'container ' + target if in_container else target}):",
        f"  gateway     {url}  (OpenAI-compatible: /v1/chat/completions, /v1/completions, /v1/models)",
        f"    {fetch} > fleet-gateway.pem",
        f'    curl --cacert fleet-gateway.pem -H "Authorization: Bearer {key}" {url}/v1/models',
    ]
    if key == "$FLEET_KEY":
        lines.append(f"    (FLEET_KEY: fleet_gateway_api_key of inventory/host_vars/{host}.yml, from Vault)")
    prometheus = f"http://127.0.0.1:{settings['fleet_monitor_prometheus_port']}"
    alertmanager = f"http://127.0.0.1:{settings['fleet_monitor_alertmanager_port']}"
    tunnel = "" if in_container else f"  (loopback on {where}: ssh -L PORT:127.0.0.1:PORT {target})"
    lines += [f"  prometheus  {prometheus}{tunnel}", f"  alerts      {alertmanager}/#/alerts"]
    if int(settings.get("fleet_gateway_stats_port") or 0):
        lines.append(f"  gateway statistics  http://127.0.0.1:{settings['fleet_gateway_stats_port']}/stats")
    lines.append(
        "  ready queries (Prometheus's Graph tab, or curl " + prometheus + "/api/v1/query --data-urlencode query=...):"
    )
    lines += [f"    {QUERY_TITLES[name]}:\n      {query}" for name, query in QUERIES.items()]
    return lines


def run(args: argparse.Namespace) -> int:
    hosts = known_rigs("fleet_services")
    if not hosts:
        print("rigkit observe: no host in group fleet_services: add one to inventory/hosts.yml (see README)")
        return 2
    missing = []
    for host in hosts:
        values = host_values(host, NAMES)
        container = str(values.get("ansible_host") or host)
        if values.get("ansible_connection") == "community.docker.docker" and not container_runs(container):
            print(
                f"fleet services on {host}: not created (no running container {container}). They front the "
                f"sandbox rigs: make provision host=sandbox-mtp, then make provision host={host}"
            )
            missing.append(host)
            continue
        print("\n".join(describe(host, values)))
    return 3 if missing else 0


def container_runs(name: str) -> bool:
    """Whether this machine's Docker engine runs the container (a sandbox fleet host lives there)."""
    try:
        done = subprocess.run(
            ["docker", "inspect", "--format", "{{.State.Running}}", name], capture_output=True, text=True, check=False
        )
    except FileNotFoundError:
        return False
    return done.returncode == 0 and done.stdout.strip() == "true"


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("observe", help="the fleet gateway's URL, a curl that works, Prometheus and queries")
    parser.set_defaults(func=run)
