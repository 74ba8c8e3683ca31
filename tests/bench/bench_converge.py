"""Converge benchmarks of the kit on its own sandbox rigs, measured side by side in one run.

    .venv/bin/python tests/bench/bench_converge.py [--rigs 1,3,6] [--reps K] [--skip-single] [--skip-fleet]
        [--label NAME]

Rigs: tests/integration/inventories/noop/hosts.yml (containers noop-rig1..6, ports 18311..18316), together
with the kit's inventory so its group_vars apply. The controller cache is a copy (hard links) of the machine's,
under --cache-dir, so that this benchmark's model mirror and stand-in hub (their pid files live in the cache's
run/ directory) never meet those of another run of the kit on the same machine.

0. --connection: 20 trivial tasks into noop-rig1 with the docker CLI connection plugin and the Docker API one
   (interleaved, medians of 3): what one round trip into a sandbox rig costs with each.
1. single rig: noop-rig1 is removed (container and its engine volume), then converged ("first": images and
   models are cached on the controller, so this is a fresh rig's converge), then converged again ("no-op").
   Reported: wall time, tasks executed on the rig (not skipped, not delegated to the controller, and not one of
   the actions Ansible runs on the controller: assert, set_fact, debug, include_*, meta, ...), tasks skipped,
   the slowest tasks. Goal: no-op <= 20 % of first.
2. fleet: noop1..max(N) converged first (untimed), then for each N: `rigkit drift` (make check) and a no-op
   provision over noop1..N; with --reps K, K rounds interleaved over N, each row the median run. Goals:
   time(6)/time(1) <= 2 for check, <= 3 for the no-op provision.

Writes <out>/converge-<label>.json and .png (the machine, its load averages before and after each run).
The machine running this is usually shared: read ratios measured in the same run, not absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rigkit.paths import cache_dir
from tests.support import remove_rig as remove_container

REPO = Path(__file__).resolve().parents[2]
INVENTORY = REPO / "tests" / "integration" / "inventories" / "noop" / "hosts.yml"
CALLBACKS = REPO / "tests" / "bench" / "callbacks"
VENV_BIN = REPO / ".venv" / "bin"
DEFAULT_CACHE = Path("/var/cache/noop-rigkit")
MACHINE_CACHE = cache_dir()


def env(tasks_file: Path, cache_dir: Path, root: Path) -> dict[str, str]:
    result = dict(os.environ)
    result.update(
        PATH=f"{VENV_BIN}:{result.get('PATH', '')}",
        ANSIBLE_CONFIG=str(root / "ansible.cfg"),
        ANSIBLE_CALLBACK_PLUGINS=f"{root / 'callback_plugins'}:{CALLBACKS}",
        ANSIBLE_CALLBACKS_ENABLED="bench_tasks,ansible.posix.profile_tasks",
        ANSIBLE_NOCOLOR="1",
        RIGKIT_BENCH_TASKS=str(tasks_file),
        RIGKIT_CACHE_DIR=str(cache_dir),
        RIGKIT_LOCK_FILE=str(REPO / ".artifacts" / "noop-rigs.lock.json"),
    )
    return result


def prepare_cache(cache_dir: Path) -> None:
    """Hard-link the machine's controller cache (models, fixtures, image work dir) into cache_dir, once."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    (cache_dir / "run").mkdir(exist_ok=True)
    for name in ("fixtures", "harness", "llamacpp", "models", "pypi", "sandbox-hub"):
        source, dest = MACHINE_CACHE / name, cache_dir / name
        if source.is_dir() and not dest.exists():
            subprocess.run(["cp", "-al", str(source), str(dest)], check=True)


FLEET = [f"noop{i}" for i in range(1, 7)]
# Actions Ansible runs on the controller without contacting the host they are listed for.
CONTROLLER_ACTIONS = {
    f"ansible.builtin.{name}"
    for name in (
        "assert",
        "set_fact",
        "debug",
        "fail",
        "meta",
        "include_role",
        "include_tasks",
        "import_role",
        "import_tasks",
        "include_vars",
        "validate_argument_spec",
        "group_by",
        "add_host",
    )
}


def hosts(n: int) -> str:
    return ":".join(FLEET[:n])


def timed(argv: list[str], name: str, cache_dir: Path, log_dir: Path, root: Path = REPO) -> dict[str, Any]:
    """Run one command in the checkout root, return its wall time, exit code, load averages, per-task results."""
    with tempfile.NamedTemporaryFile(prefix="bench-tasks-", suffix=".jsonl", delete=False) as handle:
        tasks_file = Path(handle.name)
    load_before = os.getloadavg()
    started = time.monotonic()
    proc = subprocess.run(
        argv,
        cwd=root,
        env=env(tasks_file, cache_dir, root),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    wall = time.monotonic() - started
    load_after = os.getloadavg()
    (log_dir / f"{name}.log").write_text(proc.stdout, encoding="utf-8")
    results = [json.loads(line) for line in tasks_file.read_text(encoding="utf-8").splitlines() if line]
    tasks_file.unlink()
    ran = [r for r in results if r["status"] != "skipped"]
    on_rig = [r for r in ran if not r["delegated_to"] and r["action"] not in CONTROLLER_ACTIONS]
    slowest = sorted((r for r in results if r["seconds"] is not None), key=lambda r: -r["seconds"])[:12]
    record = {
        "name": name,
        "checkout": str(root),
        "argv": argv,
        "returncode": proc.returncode,
        "wall_s": round(wall, 2),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in load_after],
        "results": len(results),
        "executed_on_rigs": len(on_rig),
        "executed_on_controller": len(ran) - len(on_rig),
        "skipped": sum(1 for r in results if r["status"] == "skipped"),
        "changed": sum(1 for r in results if r["changed"]),
        "seconds_on_rigs": round(sum(r["seconds"] or 0 for r in on_rig), 2),
        "slowest": [{k: r[k] for k in ("host", "task", "status", "seconds")} for r in slowest],
    }
    print(
        f"{name}: rc={proc.returncode} wall={wall:.1f}s on-rig={record['executed_on_rigs']} "
        f"skipped={record['skipped']} changed={record['changed']} load={record['load_before'][0]}",
        flush=True,
    )
    drift_found = proc.returncode == 2 and "drift" in argv  # `rigkit drift` exits 2 on drift: a measurement
    if proc.returncode != 0 and not drift_found:
        print("\n".join(proc.stdout.splitlines()[-40:]), file=sys.stderr)
        raise SystemExit(f"{name} failed (exit {proc.returncode}); full output in {log_dir / (name + '.log')}")
    return record


def median_run(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median wall time (the upper one of an even count), with every run's wall time beside it."""
    ordered = sorted(records, key=lambda record: record["wall_s"])
    return {**ordered[len(ordered) // 2], "walls_s": [record["wall_s"] for record in records]}


def provision(limit: str) -> list[str]:
    return [
        str(VENV_BIN / "ansible-playbook"),
        "playbooks/provision.yml",
        "-i",
        "inventory/hosts.yml",
        "-i",
        str(INVENTORY.relative_to(REPO)),
        "--limit",
        limit,
    ]


def check(limit: str) -> list[str]:
    return [
        str(VENV_BIN / "python"),
        "bin/rigkit",
        "drift",
        "--limit",
        limit,
        "--",
        "-i",
        "inventory/hosts.yml",
        "-i",
        str(INVENTORY.relative_to(REPO)),
    ]


def connection_costs(cache_dir: Path, log_dir: Path, reps: int = 3) -> dict[str, Any]:
    """Seconds for 20 round trips into noop-rig1 per connection plugin (interleaved, medians of reps)."""
    plugins = ("community.docker.docker", "community.docker.docker_api")
    walls: dict[str, list[float]] = {plugin: [] for plugin in plugins}
    for rep in range(reps):
        for plugin in plugins:
            argv = [
                *provision("noop1")[:1],
                "tests/bench/connection.yml",
                *provision("noop1")[2:],
                "-e",
                f"ansible_connection={plugin}",
            ]
            name = f"connection-{plugin.rsplit('.', 1)[1]}-{rep}"
            walls[plugin].append(timed(argv, name, cache_dir, log_dir)["wall_s"])
    return {plugin: {"walls_s": v, "median_s": statistics.median(v), "tasks": 20} for plugin, v in walls.items()}


def remove_rig(index: int) -> None:
    remove_container(f"noop-rig{index}")


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    single = report.get("single") or {}
    if single:
        names = ["first", "no-op"]
        walls = [single["first"]["wall_s"], single["noop"]["wall_s"]]
        bars = left.bar(names, walls, color=["#888", "#2a7"])
        for bar, run in zip(bars, (single["first"], single["noop"]), strict=True):
            left.annotate(
                f"{run['wall_s']:.0f} s\n{run['executed_on_rigs']} tasks on rig",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        left.set_ylabel("wall time (s)")
        left.set_title(f"one sandbox rig: no-op = {single['noop_over_first']:.0%} of first")
        left.set_ylim(0, max(walls) * 1.3)
    connection = {k: v for k, v in (report.get("connection") or {}).items() if isinstance(v, dict)}
    if connection and not single:
        left.bar([name.rsplit(".", 1)[1] for name in connection], [v["median_s"] for v in connection.values()])
        left.set_ylabel("wall time of 20 round trips (s, median)")
        left.set_title("connection plugin into a sandbox rig")
    fleet = report.get("fleet") or []
    if fleet:
        ns = [row["n"] for row in fleet]
        right.plot(ns, [row["check"]["wall_s"] for row in fleet], "o-", label="make check (drift)")
        if all("noop_provision" in row for row in fleet):
            right.plot(ns, [row["noop_provision"]["wall_s"] for row in fleet], "s-", label="no-op provision")
        other = (report.get("fleet_compared") or {}).get("rows") or []
        if other:
            style = {"alpha": 0.5, "linestyle": "--"}
            right.plot(ns, [r["check"]["wall_s"] for r in other], "o", color="C0", label="check, cmp", **style)
            if all("noop_provision" in r for r in other):
                noop_walls = [r["noop_provision"]["wall_s"] for r in other]
                right.plot(ns, noop_walls, "s", color="C1", label="no-op, cmp", **style)
        right.set_xticks(ns)
        right.set_xlabel("sandbox rigs (N)")
        right.set_ylabel("wall time (s)")
        right.set_ylim(bottom=0)
        right.legend(fontsize=8)
        right.set_title("fleet: time vs N")
    fig.suptitle(f"rigkit converge bench ({report['label']}, {report['machine']['cpus']} CPUs, shared machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rigs", default="1,3,6", help="fleet sizes, comma-separated (each <= 6)")
    parser.add_argument("--skip-single", action="store_true", help="skip the first vs no-op converge of one rig")
    parser.add_argument("--skip-fleet", action="store_true", help="skip the check/no-op provision vs N runs")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "perf")
    parser.add_argument("--label", default="main", help="names the output files: converge-<label>.json/.png")
    parser.add_argument("--connection", action="store_true", help="also compare the docker connection plugins")
    parser.add_argument(
        "--compare",
        type=Path,
        help="another checkout of the kit (with its own .venv): the fleet runs are repeated there, interleaved",
    )
    parser.add_argument(
        "--compare-provision", action="store_true", help="with --compare, the no-op provisions too (not only check)"
    )
    parser.add_argument("--fleet-rigs", help="the fleet's rigs in order (default noop1,...,noop6)")
    parser.add_argument("--check-only", action="store_true", help="the fleet runs: make check only")
    parser.add_argument("--reps", type=int, default=1, help="fleet runs per N, interleaved; the median is reported")
    parser.add_argument("--no-converge", action="store_true", help="the fleet's rigs are converged already")
    parser.add_argument("--single-rig", type=int, default=1, help="which noop rig (1..6) the single-rig runs use")
    parser.add_argument("--remove", action="store_true", help="remove every noop-rig container at the end")
    args = parser.parse_args()
    sizes = sorted({int(n) for n in args.rigs.split(",")})
    if args.fleet_rigs:
        FLEET[:] = args.fleet_rigs.split(",")
    if not sizes or sizes[0] < 1 or sizes[-1] > 6:
        parser.error("--rigs: sizes between 1 and 6")
    if shutil.which("docker") is None:
        raise SystemExit("docker is not on PATH: run `make harness` first (it starts the engine)")
    prepare_cache(args.cache_dir)
    args.out.mkdir(parents=True, exist_ok=True)
    log_dir = REPO / ".artifacts" / f"bench-converge-{args.label}"
    log_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "label": args.label,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "load_at_start": [round(x, 2) for x in os.getloadavg()],
        },
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
        ).stdout.strip(),
    }
    if not args.skip_single:
        remove_rig(args.single_rig)
        rig = f"noop{args.single_rig}"
        first = timed(provision(rig), "single-first", args.cache_dir, log_dir)
        noop = timed(provision(rig), "single-noop", args.cache_dir, log_dir)
        report["single"] = {
            "rig": rig,
            "first": first,
            "noop": noop,
            "noop_over_first": round(noop["wall_s"] / first["wall_s"], 3),
            "goal": "noop_over_first <= 0.20",
        }
    if args.connection:
        report["connection"] = connection_costs(args.cache_dir, log_dir)
    if not args.skip_fleet:
        if not args.no_converge:
            timed(provision(hosts(sizes[-1])), f"fleet-converge-{sizes[-1]}", args.cache_dir, log_dir)
        rows, compared = [{"n": n} for n in sizes], []
        runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
        for rep in range(args.reps):  # interleaved: N=1, 3, 6, N=1, 3, 6, ... (the machine drifts, the ratios not)
            for n in sizes:
                suffix = f"-{rep}" if args.reps > 1 else ""
                runs.setdefault((n, "check"), []).append(
                    timed(check(hosts(n)), f"fleet-check-{n}{suffix}", args.cache_dir, log_dir)
                )
                if not args.check_only:
                    runs.setdefault((n, "noop_provision"), []).append(
                        timed(provision(hosts(n)), f"fleet-noop-{n}{suffix}", args.cache_dir, log_dir)
                    )
        for row in rows:
            for kind in ("check", "noop_provision"):
                if (row["n"], kind) in runs:
                    row[kind] = median_run(runs[(row["n"], kind)])
        for n in sizes:
            if args.compare:
                root = args.compare.resolve()
                row = {"n": n, "check": timed(check(hosts(n)), f"compare-check-{n}", args.cache_dir, log_dir, root)}
                if args.compare_provision:
                    row["noop_provision"] = timed(
                        provision(hosts(n)), f"compare-noop-{n}", args.cache_dir, log_dir, root
                    )
                compared.append(row)
        report["fleet"] = rows
        report["fleet_rigs"] = FLEET[: sizes[-1]]
        if compared:
            report["fleet_compared"] = {"checkout": str(args.compare.resolve()), "rows": compared}
        if sizes[0] == 1 and len(rows) > 1 and not args.check_only:
            one, most = rows[0], rows[-1]
            report["fleet_ratios"] = {
                "check": round(most["check"]["wall_s"] / one["check"]["wall_s"], 2),
                "noop_provision": round(most["noop_provision"]["wall_s"] / one["noop_provision"]["wall_s"], 2),
                "of_n": most["n"],
                "goal": "check <= 2, noop_provision <= 3 (N=6 over N=1)",
            }
    report["machine"]["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.remove:
        for index in range(1, 7):
            remove_rig(index)
    json_path = args.out / f"converge-{args.label}.json"
    json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    plot(report, args.out / f"converge-{args.label}.png")
    print(f"wrote {json_path} and its .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
