"""`rigkit fleet-graph` (make fleet-graph): the fleet monitor's graph of a ready query (draft acceptance per rig by
default) over time, drawn with matplotlib from Prometheus's query API (`/api/v1/query_range`). What the README's
fleet section shows, taken from the running sandbox fleet.

    rigkit fleet-graph --out reports/fleet/acceptance.png [--graph acceptance] [--range 30m] [--host sandbox-fleet]

Prometheus listens on the fleet host's loopback: a sandbox container shares this machine's, a remote host is
reached through an SSH tunnel (--prometheus http://127.0.0.1:PORT). Only the query API's JSON is read: no
browser runs, and whatever answers on that port can give numbers at most, which the graph checks and bounds.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from rigkit import REPO
from rigkit.cli.inventory import host_values, known_rigs
from rigkit.fleet.monitor import GRAPHS
from rigkit.validation.rules import plain_defaults

# Points per series: a step of range / POINTS (Prometheus caps a query at 11,000 points per series).
POINTS = 240
MAX_SERIES = 64
SPAN_RE = re.compile(r"([1-9][0-9]{0,5})([smhd])")
SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Look:
    """How one ready graph is drawn: its title, its y axis label and, for a ratio, a fixed 0-1 axis."""

    title: str
    ylabel: str
    ylim: tuple[float, float] | None


LOOKS = {
    "acceptance": Look("Draft acceptance per rig (accepted / drafted tokens, 5-minute rate)", "acceptance", (0, 1.05)),
    "decode_tps": Look("Decode rate per rig (tokens/s, 5-minute rate)", "tokens/s", None),
    "gpu_temperature": Look("GPU temperature per rig (hottest GPU)", "°C", None),
}


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


def span_seconds(span: str) -> int:
    """``30m`` -> 1800 (Prometheus's duration syntax, one unit)."""
    found = SPAN_RE.fullmatch(span.strip())
    if not found:
        raise GraphError(f"--range {span!r}: give a number and one unit of s, m, h, d (30m, 1h, 2d)")
    return int(found.group(1)) * SECONDS[found.group(2)]


def series_of(answer: Any) -> dict[str, list[tuple[float, float]]]:
    """{rig: [(unix time, value), ...]} from a query_range answer; a malformed answer is a GraphError, values
    that are not finite numbers are left out (Prometheus writes NaN for 0/0: nothing drafted in that window)."""
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(answer, dict) or answer.get("status") != "success" or not isinstance(data, dict):
        raise GraphError(f"not a Prometheus query answer: {str(answer)[:200]!r}")
    if data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        raise GraphError(f"Prometheus answered a {data.get('resultType')!r}, not a matrix: is this Prometheus?")
    series: dict[str, list[tuple[float, float]]] = {}
    for item in data["result"][:MAX_SERIES]:
        metric = item.get("metric") if isinstance(item, dict) else None
        values = item.get("values") if isinstance(item, dict) else None
        if not isinstance(metric, dict) or not isinstance(values, list):
            raise GraphError("a series of the answer has no metric or values: is this Prometheus?")
        points = []
        for pair in values:
            try:
                stamp, value = float(pair[0]), float(pair[1])
            except (TypeError, ValueError, IndexError):
                raise GraphError(f"a point of the answer is not [time, number]: {str(pair)[:80]!r}") from None
            if math.isfinite(stamp) and math.isfinite(value):
                points.append((stamp, value))
        rig = str(metric.get("rig", "?"))[:64]
        series[rig] = points
    return series


def figure(series: dict[str, list[tuple[float, float]]], look: Look, subtitle: str) -> Any:
    """One line per rig over time, titled, rig names in the legend (a matplotlib Figure)."""
    import matplotlib

    matplotlib.use("Agg")
    from datetime import UTC, datetime

    from matplotlib import dates
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.5), dpi=100)
    axes = fig.subplots()
    for rig in sorted(series):
        points = series[rig]
        if not points:
            continue
        when = [datetime.fromtimestamp(stamp, tz=UTC) for stamp, _ in points]
        axes.plot(when, [value for _, value in points], marker="." if len(points) < 30 else None, label=rig)
    if look.ylim:
        axes.set_ylim(*look.ylim)
    axes.xaxis.set_major_formatter(dates.DateFormatter("%H:%M", tz=UTC))
    axes.set_xlabel("time (UTC)")
    axes.set_ylabel(look.ylabel)
    axes.set_title(f"{look.title}\n{subtitle}", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(title="rig", fontsize=9)
    fig.tight_layout()
    return fig


def draw(series: dict[str, list[tuple[float, float]]], look: Look, out: Path, subtitle: str) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    figure(series, look, subtitle).savefig(out, format="png")
    return out


def run(args: argparse.Namespace) -> int:
    try:
        hosts = [args.host] if args.host else known_rigs("fleet_services")
        if not args.prometheus and not hosts:
            raise GraphError("no host in group fleet_services: add one to inventory/hosts.yml, or pass --prometheus")
        prometheus = args.prometheus or prometheus_url(hosts[0])
        expression = GRAPHS[args.graph]
        span = span_seconds(args.range)
        end = time.time()
        answer = requests.get(
            f"{prometheus}/api/v1/query_range",
            params={"query": expression, "start": end - span, "end": end, "step": max(span // POINTS, 1)},
            timeout=20,
        )
        try:
            series = series_of(answer.json())
        except ValueError:
            raise GraphError(
                f"{prometheus} did not answer JSON (HTTP {answer.status_code}): is this Prometheus?"
            ) from None
        if not any(series.values()):
            raise GraphError(
                f"Prometheus at {prometheus} has no points for {args.graph} over the last {args.range} "
                f"({expression}): send the rigs some requests first (the gateway's curl in make observe)"
            )
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(end))
        draw(series, LOOKS[args.graph], Path(args.out), f"last {args.range} to {stamp}, from {prometheus}")
    except (GraphError, requests.RequestException) as exc:
        print(f"rigkit fleet-graph: {exc}", file=sys.stderr)
        return 1
    points = sum(len(values) for values in series.values())
    print(f"{args.out}: {args.graph} over the last {args.range} ({', '.join(sorted(series))}; {points} points)")
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("fleet-graph", help="a picture of the fleet monitor's graph of a ready query")
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--graph", choices=sorted(GRAPHS), default="acceptance")
    parser.add_argument("--range", default="30m", help="how far back the graph goes (30m, 1h, 2d)")
    parser.add_argument("--host", help="the fleet_services host (default: the first)")
    parser.add_argument("--prometheus", help="Prometheus's URL, e.g. through an SSH tunnel")
    parser.set_defaults(func=run)
