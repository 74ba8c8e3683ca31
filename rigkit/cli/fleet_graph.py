"""`rigkit fleet-graph` (make fleet-graph): a picture of the fleet monitor's graph of a ready query (draft acceptance
per rig by default), Prometheus's own Graph page rendered by headless Chromium. What the README's fleet section
shows, taken from the running sandbox fleet.

    rigkit fleet-graph --out reports/fleet/acceptance.png [--graph acceptance] [--range 30m] [--host sandbox-fleet]

Prometheus listens on the fleet host's loopback: a sandbox container shares this machine's, a remote host is
reached through an SSH tunnel (--prometheus http://127.0.0.1:PORT).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import requests

from rigkit import REPO
from rigkit.cli.inventory import host_values, known_rigs
from rigkit.fleet.monitor import GRAPHS
from rigkit.validation.rules import plain_defaults

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
WINDOW = "1400,820"
# How long the page's own scripts may run (virtual time) before the screenshot: the graph's query and drawing.
RENDER_BUDGET_MS = 20000


class GraphError(RuntimeError):
    """What stopped the picture, with what to do next."""


def prometheus_url(host: str) -> str:
    values = host_values(host, ("ansible_connection", "fleet_monitor_prometheus_port"))
    if values.get("ansible_connection") != "community.docker.docker":
        raise GraphError(
            f"{host}'s Prometheus listens on its own loopback: open a tunnel (ssh -L 9090:127.0.0.1:9090 {host}) "
            "and pass --prometheus http://127.0.0.1:9090"
        )
    defaults = plain_defaults(str(REPO / "roles"), "fleet_monitor")
    return (
        f"http://127.0.0.1:{values.get('fleet_monitor_prometheus_port') or defaults['fleet_monitor_prometheus_port']}"
    )


def graph_page(prometheus: str, expression: str, span: str) -> str:
    """Prometheus's Graph tab for one expression over ``span`` (its URL parameters)."""
    query = {"g0.expr": expression, "g0.tab": "0", "g0.range_input": span, "g0.stacked": "0"}
    return f"{prometheus}/graph?{urllib.parse.urlencode(query)}"


def browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    raise GraphError("no headless browser: install Debian's chromium (sudo apt-get install chromium)")


def screenshot(page: str, out: Path) -> None:
    argv = [browser(), "--headless=new", "--disable-gpu", "--hide-scrollbars", f"--window-size={WINDOW}",
            f"--virtual-time-budget={RENDER_BUDGET_MS}", f"--screenshot={out}"]  # fmt: skip
    if os.geteuid() == 0:  # Chromium refuses to run as root inside its own sandbox
        argv.append("--no-sandbox")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    done = subprocess.run([*argv, page], capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0 or not out.is_file() or out.stat().st_size == 0:
        raise GraphError(f"{argv[0]} wrote no picture (exit {done.returncode}): {done.stderr.strip()[-500:]}")


def run(args: argparse.Namespace) -> int:
    try:
        hosts = [args.host] if args.host else known_rigs("fleet_services")
        if not args.prometheus and not hosts:
            raise GraphError("no host in group fleet_services: add one to inventory/hosts.yml, or pass --prometheus")
        prometheus = args.prometheus or prometheus_url(hosts[0])
        expression = GRAPHS[args.graph]
        answer = requests.get(f"{prometheus}/api/v1/query", params={"query": expression}, timeout=10).json()
        series = answer.get("data", {}).get("result", [])
        if not series:
            raise GraphError(f"Prometheus at {prometheus} has no series for {args.graph} yet ({expression}): "
                             "send the rigs some requests first (the gateway's curl in make observe)")  # fmt: skip
        screenshot(graph_page(prometheus, expression, args.range), Path(args.out))
    except (GraphError, requests.RequestException, subprocess.TimeoutExpired) as exc:
        print(f"rigkit fleet-graph: {exc}", file=sys.stderr)
        return 1
    rigs = ", ".join(sorted(s["metric"].get("rig", "?") for s in series))
    print(f"{args.out}: {args.graph} over the last {args.range} ({rigs}), from {prometheus}")
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("fleet-graph", help="a picture of the fleet monitor's graph of a ready query")
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--graph", choices=sorted(GRAPHS), default="acceptance")
    parser.add_argument("--range", default="30m", help="how far back the graph goes (Prometheus syntax: 30m, 1h)")
    parser.add_argument("--host", help="the fleet_services host (default: the first)")
    parser.add_argument("--prometheus", help="Prometheus's URL, e.g. through an SSH tunnel")
    parser.set_defaults(func=run)
