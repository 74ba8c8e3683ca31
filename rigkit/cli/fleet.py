"""`rigkit status` (make status) and `rigkit drift` (make check): the fleet as it runs, and what would change."""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

from rigkit import REPO
from rigkit.playbook_run import playbook_argv, run_with_results


def with_fleet_services(limit: str) -> str:
    """``limit`` and the fleet_services hosts, in Ansible's pattern syntax: a pattern with a comma is split on
    commas only, one without on colons."""
    return f"{limit},fleet_services" if "," in limit else f"{limit}:fleet_services"


def status(args: argparse.Namespace) -> int:
    """Run playbooks/status.yml quietly (its log kept for a failure), then print the fleet's table."""
    import tempfile

    from rigkit.cli.plan import archive_notes
    from rigkit.fleet.status import never_set_up, render, rows
    from rigkit.validation.driver_support_rows import status_notes

    with tempfile.TemporaryDirectory(prefix="rigkit-status-") as scratch:
        output = pathlib.Path(scratch) / "status.json"
        log = pathlib.Path(scratch) / "status.log"
        history_file = pathlib.Path(scratch) / "history.json"
        # the fleet_services hosts too: where one runs Prometheus, the rigs' last hour comes from it
        argv = playbook_argv(
            "status.yml",
            with_fleet_services(args.limit),
            "-e",
            f"rig_status_output={output}",
            "-e",
            f"rig_status_history={history_file}",
            *args.ansible_args,
        )
        with log.open("w") as handle:
            done = subprocess.run(argv, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT, check=False)
        if not output.exists():
            print("\n".join(log.read_text().splitlines()[-40:]), file=sys.stderr)
            print(f"rigkit status: the status play failed (exit {done.returncode}); its log is above", file=sys.stderr)
            return done.returncode or 1
        fleet = json.loads(output.read_text())
        last_hour = json.loads(history_file.read_text()) if history_file.exists() else None
    table = rows(fleet, last_hour)
    if args.json:
        print(json.dumps({entry["cells"]["rig"]: entry["raw"] for entry in table}, indent=2, sort_keys=True))
    else:
        print(render(table, [*archive_notes(fleet), *status_notes(fleet)], wide=getattr(args, "wide", False)))
    unreachable = sorted(
        host for host, status in fleet.items() if not status.get("reachable") and not never_set_up(host, status)[0]
    )
    if unreachable:
        print(f"rigkit status: unreachable: {', '.join(unreachable)}", file=sys.stderr)
        return 3
    return 0


# -------------------------------------------------------------------------------------------- drift
def drift(args: argparse.Namespace) -> int:
    """`make check`: the provision in check + diff mode, streamed; then which rigs would change, and where.

    What changed is read from Ansible's results (callback_plugins/rigkit_results.py writes them as JSON), not
    from the screen output."""
    argv = playbook_argv("provision.yml", args.limit, "--check", "--diff", *args.ansible_args)
    done = run_with_results(argv)
    results = done.hosts
    print("\nrigkit drift summary:")
    code = 0
    for host, counts in sorted(results.items()):
        if counts["unreachable"]:
            print(f"  {host}: UNREACHABLE (cannot tell)")
            code = max(code, 4)
        elif counts["failures"]:
            print(f"  {host}: FAILED in check mode (see above): {'; '.join(counts['failed_tasks'])}")
            code = max(code, 1)
        elif counts["changed"]:
            print(f"  {host}: DRIFT, {counts['changed']} change(s) would be made:")
            for name in counts["changed_tasks"]:
                print(f"      - {name}")
            code = max(code, 2)
        else:
            print(f"  {host}: no drift (converged as the repo says)")
    if not results:
        print(f"  no results: ansible-playbook exited {done.returncode}")
        return done.returncode or 1
    return code


def register(commands: argparse._SubParsersAction) -> None:
    status_cmd = commands.add_parser(
        "status", help="read back every rig and print one table (exit 3: a rig unreachable)"
    )
    status_cmd.set_defaults(func=status)
    status_cmd.add_argument("--limit", default="rigs", help="rigs to read (default: all)")
    status_cmd.add_argument("--json", action="store_true", help="machine-readable output")
    status_cmd.add_argument("--wide", action="store_true", help="every column (GPU, driver, kernel, image, ...)")
    status_cmd.add_argument("ansible_args", nargs="*", help="extra ansible-playbook arguments (after --)")
    drift_cmd = commands.add_parser("drift", help="check + diff provision; exit 2 when a rig differs from the repo")
    drift_cmd.set_defaults(func=drift)
    drift_cmd.add_argument("--limit", required=True, help="rigs to check")
    drift_cmd.add_argument("ansible_args", nargs="*", help="extra ansible-playbook arguments (after --)")
